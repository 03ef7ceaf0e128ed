#!/usr/bin/env bash
# The shared auth token, end to end with real processes: a coordinator
# started with --auth-token-file refuses conveyorctl and workers without the
# token or with a wrong one (UNAUTHENTICATED, counted in its metrics) and
# serves those with it; the token appears in no log, message or metric.
# Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

token=Tok3n-$RANDOM$RANDOM
wrong=Wr0ng-$RANDOM$RANDOM
printf '%s\n' "$token" >"$dir/token"
printf '%s\n' "$wrong" >"$dir/wrong"

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

python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://$metrics/metrics').read().decode())" \
  >"$dir/metrics.txt" 2>&1
check "refusals are counted" grep -q 'conveyor_grpc_server_requests_total{.*code="UNAUTHENTICATED".*} [1-9]' "$dir/metrics.txt"

for f in "$dir"/*.log "$dir"/*.out "$dir/metrics.txt"; do
  check "no token in $(basename "$f")" bash -c "! grep -q -e '$token' -e '$wrong' '$f'"
done

finish
