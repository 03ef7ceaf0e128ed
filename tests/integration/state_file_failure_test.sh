#!/usr/bin/env bash
# A coordinator whose state file cannot be written (a full disk; here the
# file replaced by a directory, so the rename onto it fails), through
# conveyorctl: a cancel is refused and NOT applied (the job runs on; it was
# once cancelled in memory while the CLI said it failed), a submission is
# refused, and both say the coordinator could not make the change durable,
# not that it cannot be reached. Once the file can be written again the
# cancel goes through. Also: a job name with control characters is refused
# at submit with the name escaped, never printed raw.
# Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

job_yaml() {  # job_yaml NAME
  cat <<YAML
name: $1
model:
  input_shape: [8]
  init: {seed: 0}
  layers:
    - dense: {features: 8}
    - delay: {forward_ms: 20, backward_ms: 0}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 100000, batch_size: 4, microbatches: 1}
optimizer: {kind: sgd, lr: 0.01}
YAML
}

"$coordinator" --listen 127.0.0.1:0 --state-file "$dir/state" \
  --ready-file "$dir/ready" >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
address=$(head -1 "$dir/ready")
"$worker" --coordinator "$address" --name w >"$dir/worker.log" 2>&1 &
pids+=($!)
idle() { "$ctl" workers --coordinator "$address" 2>/dev/null | grep -q IDLE; }
check "the worker registers" wait_for 20 idle

job_yaml long >"$dir/long.yaml"
job=$("$ctl" submit "$dir/long.yaml" --coordinator "$address" 2>&1 |
  grep -o 'job-[0-9]*' | head -1)
running() { [ "$(field "$job" state)" = RUNNING ]; }
check "the job runs" wait_for 30 running

rm -f "$dir/state"
mkdir "$dir/state"
"$ctl" cancel "$job" --coordinator "$address" >"$dir/cancel.out" 2>&1
check "a cancel that cannot be made durable fails" test $? -ne 0
check "... saying so" grep -q "was not cancelled: the coordinator could not make the change durable" "$dir/cancel.out"
check "... not blaming the address" bash -c "! grep -q 'set --coordinator' '$dir/cancel.out'"
check "... and is not applied" running
"$ctl" submit "$dir/long.yaml" --coordinator "$address" >"$dir/submit.out" 2>&1
check "a submission that cannot be made durable fails" test $? -ne 0
check "... saying so" grep -q "cannot write its state file" "$dir/submit.out"
check "... not blaming the address" bash -c "! grep -q 'set --coordinator' '$dir/submit.out'"

rmdir "$dir/state"
"$ctl" cancel "$job" --coordinator "$address" >"$dir/cancel2.out" 2>&1
check "once the file can be written the cancel goes through" test $? -eq 0
cancelled() { [ "$(field "$job" state)" = CANCELLED ]; }
check "... and the job is cancelled" wait_for 10 cancelled

job_yaml '"evil\e[2Jname\x01"' >"$dir/evil.yaml"
"$ctl" submit "$dir/evil.yaml" --coordinator "$address" >"$dir/evil.out" 2>&1
check "a job name with control characters is refused (exit 2)" test $? -eq 2
check "... naming the line and the escaped name" \
  grep -qF 'evil.yaml:1:7: name: must be 1 to 253 bytes without control characters; got "evil\x1b[2Jname\x01"' "$dir/evil.out"
check "... never printing ESC raw" bash -c "! grep -q $'\x1b' '$dir/evil.out'"

if [ "$failed" -ne 0 ]; then
  cat "$dir"/*.out
  tail -20 "$dir/coordinator.log"
fi
finish
