#!/usr/bin/env bash
# Hosts apart, emulated: a coordinator and two workers, each in a network
# namespace of its own (its own interface and address: 10.77.0.1 the
# coordinator, .11 and .12 the workers), joined by veth pairs to a bridge in
# a fourth namespace (the "switch"), every link rate-limited with `tc tbf`
# (1 Gbit/s, and 10 Gbit/s on the coordinator's). Through that network:
#  - a 2-stage job's control plane and data plane cross the "hosts", and its
#    final parameters equal `conveyorctl run --in-process`'s bitwise;
#  - a partition (one worker's link set down at the switch) fails a running
#    job once the heartbeat timeout passes, the reason naming the
#    unreachable worker; when the link comes back up the worker registers
#    again;
#  - the schedule simulator (`conveyorctl schedule` with the link's rate as
#    its bandwidth) predicts the step of a job whose 4 MiB boundary tensors
#    make the 1 Gbit/s links its bottleneck: the measured step is at least
#    90 % of the simulated one everywhere, and within 10 % both ways with
#    CONVEYOR_TIMING_CHECKS=1 (a timing check, off by default).
# Parts skipped with a printed reason where the kernel lacks them: delay and
# loss (`tc netem`: no sch_netem module here). The whole test is skipped
# (exit 77) where network namespaces cannot be made (not root, no `ip`, or a
# sandbox that forbids them, as CI's may).
# Namespaces, links and processes are removed on every exit.
# Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
conveyorctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no ip (iproute2)"
command -v tc >/dev/null || skip "no tc (iproute2)"

# Names unique to this run, so runs side by side do not collide.
tag="cv$$"
sw="$tag-sw"
hosts=("$tag-co" "$tag-w1" "$tag-w2")
addrs=(10.77.0.1 10.77.0.11 10.77.0.12)
rates=(10gbit 1gbit 1gbit)
made=()
remove_namespaces() {
  local ns
  # Deleting a namespace deletes its ends of the veth pairs, and so the
  # pairs, and the bridge with the switch's.
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
# The daemons first (cleanup, from daemon_test_lib.sh), then the network.
trap 'cleanup; remove_namespaces' EXIT
trap 'exit 1' INT TERM

ip netns add "$sw" 2>"$dir/netns.err" ||
  skip "cannot make a network namespace: $(cat "$dir/netns.err")"
made+=("$sw")
ip -n "$sw" link add br0 type bridge 2>"$dir/bridge.err" ||
  skip "cannot make a bridge: $(cat "$dir/bridge.err")"
ip -n "$sw" link set br0 up
for i in 0 1 2; do
  ns=${hosts[$i]}
  ip netns add "$ns" || skip "cannot make namespace $ns"
  made+=("$ns")
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$sw" ||
    skip "cannot make a veth pair"
  ip -n "$sw" link set "p$i" master br0
  ip -n "$sw" link set "p$i" up
  ip -n "$ns" addr add "${addrs[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # The host's outgoing rate, as its NIC would have it.
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${rates[$i]}" \
    burst 1mb latency 50ms || skip "tc tbf is not available"
done
echo "network: ${hosts[*]} on a bridge in $sw; links ${rates[*]} (tc tbf)"
if ip netns exec "${hosts[1]}" tc qdisc add dev eth0 parent root handle 1: \
  netem delay 1ms 2>/dev/null ||
  ip netns exec "${hosts[1]}" tc qdisc replace dev eth0 root netem \
    delay 1ms 2>/dev/null; then
  # Never reached on this project's machines; the parts below would need
  # a bound on the delayed step, which is not written yet.
  echo "SKIP (part): tc netem works here, but its delay and loss checks are not written yet"
  ip netns exec "${hosts[1]}" tc qdisc replace dev eth0 root tbf \
    rate "${rates[1]}" burst 1mb latency 50ms
else
  echo "SKIP (part): tc netem is not available (the kernel has no sch_netem): link delay (0.2-2 ms) and loss are not emulated; the step prediction below models the link by tbf's rate alone"
fi

# conveyorctl runs on the coordinator's "host".
ctl="$dir/conveyorctl"
printf '#!/bin/sh\nexec ip netns exec %s %s "$@"\n' "${hosts[0]}" \
  "$conveyorctl" >"$ctl"
chmod +x "$ctl"

ip netns exec "${hosts[0]}" "$coordinator" --listen "${addrs[0]}:0" \
  --heartbeat-timeout 3 --ready-file "$dir/ready" >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
address=$(head -1 "$dir/ready")
check "the coordinator listens on its host's address ($address)" \
  bash -c "[[ '$address' == ${addrs[0]}:* ]]"
start_worker() {  # start_worker INDEX
  local i=$1
  ip netns exec "${hosts[$i]}" "$worker" --coordinator "$address" \
    --name "host$i" --data-address "${addrs[$i]}:0" --devices cpu:1 \
    >>"$dir/host$i.log" 2>&1 &
  pids+=($!)
}
start_worker 1
start_worker 2
check "both workers register across the bridge" wait_for 30 idle_workers 2

job_yaml() {  # job_yaml CHECKPOINT_DIR STEPS DELAY_MS
  cat <<YAML
name: apart
model:
  input_shape: [64]
  init: {seed: 3}
  layers:
    - dense: {features: 256}
    - relu
    - delay: {forward_ms: $3, backward_ms: 0}
    - boundary
    - dense: {features: 64}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: $2, batch_size: 64, microbatches: 4}
optimizer: {kind: adam, lr: 0.003}
pipeline: {schedule: 1f1b}
checkpoint: {dir: $1, every: 0}
YAML
}

# 1. A job across the hosts equals the in-process run.
job_yaml "$dir/reference" 12 0 >"$dir/reference.yaml"
"$conveyorctl" run "$dir/reference.yaml" --in-process >"$dir/reference.out" 2>&1
check "the in-process reference runs" test $? -eq 0
job_yaml "$dir/apart" 12 0 >"$dir/apart.yaml"
job=$("$ctl" submit "$dir/apart.yaml" --coordinator "$address" 2>&1 |
  grep -o 'job-[0-9]*' | head -1)
check "the job is accepted ($job)" test -n "$job"
check "the job ends" wait_for 120 job_ended "$job"
check "the job succeeds across the hosts ($(field "$job" state))" \
  bash -c "[[ '$(field "$job" state)' == SUCCEEDED* ]]"
# Each rank's data plane listened on its own host's address, and each
# connected to its peer there.
for i in 1 2; do
  check "host$i's data plane listened on ${addrs[$i]} and reached its peer" \
    bash -c "grep -q '$job ready, data plane on ${addrs[$i]}:' '$dir/host$i.log' &&
             grep -q '$job connected to 1 peer' '$dir/host$i.log'"
done
"$conveyorctl" export "$dir/apart" -o "$dir/apart.safetensors" >/dev/null 2>&1
# run --in-process writes its final parameters as one file.
check "its parameters equal the in-process run's, bitwise" \
  same_tensors "$dir/reference/params.safetensors" "$dir/apart.safetensors"
echo "over the emulated network: $(field "$job" progress)"

# 2. A partition: host2's link goes down at the switch mid-job.
stepped() {  # stepped JOB N
  local progress
  progress=$(field "$1" progress)
  [ -n "${progress%%/*}" ] && [ "${progress%%/*}" -ge "$2" ] 2>/dev/null
}
job_yaml "$dir/partition" 100000 20 >"$dir/partition.yaml"
job=$("$ctl" submit "$dir/partition.yaml" --coordinator "$address" 2>&1 |
  grep -o 'job-[0-9]*' | head -1)
check "the partition job runs" wait_for 60 stepped "$job" 3
victim=$("$ctl" workers --coordinator "$address" 2>/dev/null |
  awk '$2 == "host2" { print $1 }' | head -1)
cut_at=$SECONDS
ip -n "$sw" link set p2 down
check "the job ends after the partition" wait_for 60 job_ended "$job"
echo "the partitioned job ended $((SECONDS - cut_at)) s after the cut (heartbeat timeout 3 s)"
message=$(field "$job" message)
check "it failed ($(field "$job" state))" \
  bash -c "[[ '$(field "$job" state)' == FAILED* ]]"
check "its reason names the unreachable worker ($message)" \
  bash -c "grep -qF -- '$victim' <<<'$message' || grep -qF host2 <<<'$message'"
"$ctl" workers --coordinator "$address" >"$dir/workers.txt" 2>&1
check "the unreachable worker is listed LOST" \
  bash -c "awk '\$2 == \"host2\"' '$dir/workers.txt' | grep -q LOST"

# 3. The partition heals: host2 registers again.
ip -n "$sw" link set p2 up
check "after the partition heals, both workers are idle again" \
  wait_for 60 idle_workers 2

# 4. The simulator, given the link (tbf's rate as its bandwidth), predicts
# the measured step: a 2-stage job whose compute is delay layers of known
# cost and whose boundary tensors (4 MiB a microbatch) cross 1 Gbit/s links.
predict_yaml() {
  cat <<YAML
name: predict
model:
  input_shape: [16]
  init: {seed: 1}
  layers:
    - dense: {features: 262144}
    - delay: {forward_ms: 20, backward_ms: 20}
    - boundary
    - delay: {forward_ms: 20, backward_ms: 20}
    - dense: {features: 1}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 8, batch_size: 16, microbatches: 4}
optimizer: {kind: sgd, lr: 0.0001}
pipeline: {schedule: 1f1b}
YAML
}
predict_yaml >"$dir/predict.yaml"
job=$("$ctl" submit "$dir/predict.yaml" --coordinator "$address" 2>&1 |
  grep -o 'job-[0-9]*' | head -1)
check "the link-bound job ends" wait_for 120 job_ended "$job"
measured=$(field "$job" progress | sed -n 's/.*, \([0-9.]*\) ms\/step.*/\1/p')
predicted=$("$conveyorctl" schedule --kind 1f1b -P 2 -M 4 --costs 20,20 \
  --latency 0.05 --bandwidth 125000 --activation-bytes 4194304 |
  sed -n 's/^makespan: //p')
echo "link-bound step: measured ${measured:-?} ms, simulated ${predicted:-?} ms (1 Gbit/s, 4 MiB a microbatch; compute alone: 200 ms)"
check "the step was measured and simulated" test -n "$measured" -a -n "$predicted"
# Load only slows a run down, so the link's bound holds anywhere: the step
# is at least 90 % of the simulated one (compute alone would be 200 ms).
check "the link bounds the measured step as simulated (at least 90 %)" \
  awk -v m="${measured:-0}" -v p="${predicted:-1}" 'BEGIN { exit !(m >= 0.9 * p) }'
# Within 10 % both ways (2-6 % on this project's machine) is a timing
# assertion, which a loaded CI machine would fail for nothing: asked for
# with CONVEYOR_TIMING_CHECKS=1.
if [ "${CONVEYOR_TIMING_CHECKS:-0}" = 1 ]; then
  check "the simulator predicts the measured step within 10 %" \
    awk -v m="${measured:-0}" -v p="${predicted:-1}" \
    'BEGIN { exit !(m >= 0.9 * p && m <= 1.1 * p) }'
else
  echo "SKIP (part): the 10 % bound both ways is a timing check; CONVEYOR_TIMING_CHECKS=1 asserts it"
fi

if [ "$failed" -ne 0 ]; then tail -n 20 "$dir"/*.log; fi
finish
