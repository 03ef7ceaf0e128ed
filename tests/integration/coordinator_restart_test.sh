#!/usr/bin/env bash
# A coordinator restart with real processes. The coordinator keeps its job
# records in --state-file; it is killed (-9) while a checkpointed job with a
# restart policy runs. Its workers notice, stop the job and register again
# once a new coordinator is up on the same address and state file; that one
# still lists the jobs that ended before, and the interrupted job restarts
# from its newest committed step and ends with parameters bitwise equal to
# an uninterrupted run's; so does one killed between a step's last stage file
# and its manifest, from the step before. A corrupt state file, or one another coordinator
# holds, is refused (exit 1) rather than silently started without.
# Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

job_yaml() {  # job_yaml CHECKPOINT_DIR [EXTRA]
  cat <<YAML
name: restartable
model:
  input_shape: [64]
  init: {seed: 0}
  layers:
    - dense: {features: 256}
    - relu
    - delay: {forward_ms: 10, backward_ms: 0}
    - boundary
    - dense: {features: 64}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 40, batch_size: 64, microbatches: 4}
optimizer: {kind: adam, lr: 0.003}
pipeline: {schedule: 1f1b}
checkpoint: {dir: $1, every: 5}
${2:-}
YAML
}

# start_coordinator LISTEN LOG: starts it on the state file, waits for its
# ready file; sets coordinator_pid and address.
start_coordinator() {
  rm -f "$dir/ready"
  "$coordinator" --listen "$1" --state-file "$dir/state" \
    --heartbeat-timeout 3 --ready-file "$dir/ready" >"$2" 2>&1 &
  coordinator_pid=$!
  pids+=($coordinator_pid)
  for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
  address=$(head -1 "$dir/ready" 2>/dev/null)
}
idle_workers() {
  test "$("$ctl" workers --coordinator "$address" 2>/dev/null | grep -c IDLE)" -eq "$1"
}
checkpointed() {
  field "$1" checkpoint | grep -Eq 'newest complete: step ([5-9]|[1-9][0-9])\)'
}

start_coordinator 127.0.0.1:0 "$dir/coordinator1.log"
check "coordinator 1 is serving" test -n "$address"
for i in 0 1; do
  "$worker" --coordinator "$address" --name "w$i" >"$dir/worker$i.log" 2>&1 &
  pids+=($!)
done
check "workers register" wait_for 20 idle_workers 2

# A second coordinator on the same state file is refused.
"$coordinator" --listen 127.0.0.1:0 --state-file "$dir/state" >"$dir/second.log" 2>&1
check "second coordinator on the state file exits 1" test $? -eq 1
check "and says the file is in use" grep -q "in use by another coordinator" "$dir/second.log"

# The reference: the same job, uninterrupted.
job_yaml "$dir/full" >"$dir/full.yaml"
full=$("$ctl" submit "$dir/full.yaml" --coordinator "$address" 2>&1 | grep -o 'job-[0-9]*' | head -1)
check "reference job ran" wait_for 60 job_ended "$full"
check "reference job succeeded" bash -c "[[ '$(field "$full" state)' == SUCCEEDED* ]]"

job_yaml "$dir/ckpt" "restart: {max_restarts: 1}" >"$dir/job.yaml"
job=$("$ctl" submit "$dir/job.yaml" --coordinator "$address" 2>&1 | grep -o 'job-[0-9]*' | head -1)
check "interrupted job committed a checkpoint" wait_for 60 checkpointed "$job"
{
  kill -KILL "$coordinator_pid"
  wait "$coordinator_pid"
} 2>/dev/null

# The same address, the same state file.
start_coordinator "$address" "$dir/coordinator2.log"
check "coordinator 2 is serving on the same address" test -n "$address"
check "the ended job is still listed" bash -c "[[ '$(field "$full" state)' == SUCCEEDED* ]]"
check "interrupted job ran to its end" wait_for 90 job_ended "$job"
check "interrupted job succeeded" bash -c "[[ '$(field "$job" state)' == SUCCEEDED* ]]"
check "it restarted once, saying why" bash -c \
  "[[ '$(field "$job" restarts)' == '1 of at most 1; last after: the coordinator restarted'* ]]"
check "it resumed from a committed step" bash -c \
  "[[ '$(field "$job" resumed)' =~ ^from\ step\ ([5-9]|[1-9][0-9]) ]]"
check "both workers came back" wait_for 20 idle_workers 2
"$ctl" export "$dir/full" -o "$dir/full.safetensors" >/dev/null 2>&1
"$ctl" export "$dir/ckpt" -o "$dir/ckpt.safetensors" >/dev/null 2>&1
check "parameters equal the uninterrupted run's, bitwise" \
  same_tensors "$dir/full.safetensors" "$dir/ckpt.safetensors"
job_yaml "$dir/next" >"$dir/next.yaml"
next=$("$ctl" submit "$dir/next.yaml" --coordinator "$address" 2>&1 | grep -o 'job-[0-9]*' | head -1)
check "job ids go on after the restart" test "${next#job-}" -gt "${job#job-}"

kill -TERM "$coordinator_pid"
wait "$coordinator_pid" 2>/dev/null
check "coordinator 2 exits 0 on SIGTERM" test $? -eq 0

# Killed between a step's last stage file and its manifest (the coordinator
# stands still there, by fault injection): that step is never used; the job
# resumes from the complete step before it and ends equal.
CONVEYOR_FAULT_COMMIT_STEP=10 CONVEYOR_FAULT_COMMIT_DELAY_MS=60000 \
  start_coordinator "$address" "$dir/coordinator3.log"
check "coordinator 3 is serving" test -n "$address"
check "the workers come back to it" wait_for 20 idle_workers 2
job_yaml "$dir/partial" "restart: {max_restarts: 1}" >"$dir/partial.yaml"
partial=$("$ctl" submit "$dir/partial.yaml" --coordinator "$address" 2>&1 | grep -o 'job-[0-9]*' | head -1)
check "every file of step 10 is in, and the coordinator stands before its manifest" \
  wait_for 60 grep -q "every file of step 10 is in" "$dir/coordinator3.log"
{
  kill -KILL "$coordinator_pid"
  wait "$coordinator_pid"
} 2>/dev/null
check "step 10 has its stage files" test -s "$dir/partial/step-10/stage-1.safetensors"
check "and no manifest" test ! -e "$dir/partial/step-10/manifest.json"
start_coordinator "$address" "$dir/coordinator4.log"
check "coordinator 4 is serving on the same address" test -n "$address"
check "the job ran to its end" wait_for 90 job_ended "$partial"
check "and succeeded" bash -c "[[ '$(field "$partial" state)' == SUCCEEDED* ]]"
check "resuming from step 5, the newest complete one" bash -c \
  "[[ '$(field "$partial" resumed)' =~ ^from\ step\ 5\  ]]"
"$ctl" export "$dir/partial" -o "$dir/partial.safetensors" >/dev/null 2>&1
check "parameters equal the uninterrupted run's, bitwise" \
  same_tensors "$dir/full.safetensors" "$dir/partial.safetensors"
kill -TERM "$coordinator_pid"
wait "$coordinator_pid" 2>/dev/null

# A damaged state file is refused, not replaced by an empty one.
printf 'garbage' >"$dir/state"
"$coordinator" --listen 127.0.0.1:0 --state-file "$dir/state" >"$dir/corrupt.log" 2>&1
check "corrupt state file exits 1" test $? -eq 1
check "and says what to do" grep -q "move the file aside" "$dir/corrupt.log"

finish || { tail -n 30 "$dir"/coordinator*.log "$dir"/worker*.log; exit 1; }
