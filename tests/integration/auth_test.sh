#!/usr/bin/env bash
# The shared auth token, end to end with real processes: a coordinator
# started with --auth-token-file refuses conveyorctl and workers without the
# token or with a wrong one (UNAUTHENTICATED, counted in its metrics) and
# serves those with it; workers with the token run a job, whose data plane
# handshake is keyed with it, while on a coordinator without a token a
# worker with a token and one without cannot connect their data plane; the
# token appears in no log, message or metric.
# Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

token=Tok3n-$RANDOM$RANDOM-0123456789abcdef
wrong=Wr0ng-$RANDOM$RANDOM-0123456789abcdef
printf '%s\n' "$token" >"$dir/token"
printf '%s\n' "$wrong" >"$dir/wrong"
chmod 600 "$dir/token" "$dir/wrong"

"$coordinator" --listen 127.0.0.1:0 --metrics-address 127.0.0.1:0 \
  --auth-token-file "$dir/token" --ready-file "$dir/ready" \
  >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do
  [ -f "$dir/ready" ] && [ "$(wc -l <"$dir/ready")" -ge 2 ] && break
  sleep 0.05
done
address=$(head -1 "$dir/ready")
metrics=$(sed -n 2p "$dir/ready" | cut -d' ' -f2)
check "coordinator is serving" test -n "$address"

"$ctl" workers --coordinator "$address" >"$dir/none.out" 2>&1
check "no token: exit 1" test $? -eq 1
check "no token: says why" grep -q "refused the call.*--auth-token-file" "$dir/none.out"
"$ctl" workers --coordinator "$address" --auth-token-file "$dir/wrong" >"$dir/wrong.out" 2>&1
check "wrong token: exit 1" test $? -eq 1
check "wrong token: says so" grep -q "a wrong auth token" "$dir/wrong.out"
"$ctl" workers --coordinator "$address" --auth-token-file "$dir/token" >"$dir/right.out" 2>&1
check "right token: exit 0" test $? -eq 0
CONVEYOR_AUTH_TOKEN_FILE="$dir/token" "$ctl" jobs --coordinator "$address" >"$dir/env.out" 2>&1
check "token file from the environment" test $? -eq 0

# A worker with the wrong token is refused and exits 1 instead of retrying.
timeout 20 "$worker" --coordinator "$address" --name intruder \
  --auth-token-file "$dir/wrong" >"$dir/intruder.log" 2>&1
check "wrong-token worker exits 1" test $? -eq 1
check "wrong-token worker says it was refused" \
  grep -q "refused this worker" "$dir/intruder.log"

"$worker" --coordinator "$address" --name trusted \
  --auth-token-file "$dir/token" >"$dir/worker.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  "$ctl" workers --coordinator "$address" --auth-token-file "$dir/token" \
    >"$dir/workers.out" 2>&1
  grep -q trusted "$dir/workers.out" && break
  sleep 0.1
done
check "right-token worker registers" grep -q trusted "$dir/workers.out"
check "the intruder never registered" bash -c "! grep -q intruder '$dir/workers.out'"

# A two-stage job of two steps: enough to connect the data plane both ways.
cat >"$dir/job.yaml" <<'YAML'
name: keyed
model:
  input_shape: [8]
  init: {seed: 0}
  layers:
    - dense: {features: 8}
    - boundary
    - dense: {features: 8}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 2, batch_size: 4, microbatches: 2}
optimizer: {kind: sgd, lr: 0.01}
pipeline: {schedule: 1f1b}
YAML

idle_workers() {  # idle_workers N COORDINATOR [FLAGS...]: N are IDLE, soon.
  local n=$1 at=$2
  shift 2
  for _ in $(seq 100); do
    [ "$("$ctl" workers --coordinator "$at" "$@" 2>/dev/null | grep -c IDLE)" -eq "$n" ] && return 0
    sleep 0.1
  done
  return 1
}

# Both workers derive the same handshake secret from the token.
"$worker" --coordinator "$address" --name trusted2 \
  --auth-token-file "$dir/token" >"$dir/worker2.log" 2>&1 &
pids+=($!)
check "second right-token worker registers" \
  idle_workers 2 "$address" --auth-token-file "$dir/token"
timeout 60 "$ctl" submit "$dir/job.yaml" --watch --coordinator "$address" \
  --auth-token-file "$dir/token" >"$dir/keyed.out" 2>&1
check "a job on workers with the token succeeds" test $? -eq 0

# Without a token on the coordinator the control plane is open, but a worker
# with the token and one without derive different handshake secrets: the
# data plane refuses the connection and the job fails, saying why.
rm -f "$dir/ready"
"$coordinator" --listen 127.0.0.1:0 --ready-file "$dir/ready" \
  >"$dir/open-coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
open=$(head -1 "$dir/ready")
"$worker" --coordinator "$open" --name keyed \
  --auth-token-file "$dir/token" >"$dir/keyed-worker.log" 2>&1 &
pids+=($!)
"$worker" --coordinator "$open" --name keyless >"$dir/keyless-worker.log" 2>&1 &
pids+=($!)
check "keyed and keyless workers register" idle_workers 2 "$open"
timeout 60 "$ctl" submit "$dir/job.yaml" --watch --coordinator "$open" \
  >"$dir/mixed.out" 2>&1
check "mixed tokens: the job fails" test $? -eq 1
# The job's message is the first failure a worker reports: usually the
# refused handshake, but the refused side may abort first and reset the
# other's handshake; the refusal is then in that worker's log.
check "mixed tokens: the handshake says why" \
  grep -q "wrong secret.*--auth-token-file" "$dir/mixed.out" \
  "$dir/keyed-worker.log" "$dir/keyless-worker.log"

python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://$metrics/metrics').read().decode())" \
  >"$dir/metrics.txt" 2>&1
check "refusals are counted" grep -q 'conveyor_grpc_server_requests_total{.*code="UNAUTHENTICATED".*} [1-9]' "$dir/metrics.txt"

for f in "$dir"/*.log "$dir"/*.out "$dir/metrics.txt"; do
  check "no token in $(basename "$f")" bash -c "! grep -q -e '$token' -e '$wrong' '$f'"
done

finish
