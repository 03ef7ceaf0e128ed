#!/usr/bin/env bash
# Preemption by drain with real processes (docs/jobs.md "Priority and
# owner"): two workers run a low-priority job; an urgent job submitted to
# the full cluster drains it at a step boundary (checkpoint, queued again)
# and becomes RUNNING on its workers; once the urgent job ends, the low job
# resumes from the drained step and ends with parameters bitwise equal to
# an uninterrupted run of the same job. Also: a bad --owner-quota is
# refused naming the entry. Needs COORDINATOR, WORKER and CONVEYORCTL.
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

job_yaml() {  # job_yaml NAME CHECKPOINT_DIR STEPS [EXTRA]
  cat <<YAML
name: $1
model:
  input_shape: [32]
  init: {seed: 0}
  layers:
    - dense: {features: 64}
    - relu
    - delay: {forward_ms: 15, backward_ms: 0}
    - boundary
    - dense: {features: 32}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: $3, batch_size: 32, microbatches: 4}
optimizer: {kind: adam, lr: 0.003}
pipeline: {schedule: 1f1b}
checkpoint: {dir: $2, every: 4}
${4:-}
YAML
}
submit() {  # submit FILE: prints the job id
  "$ctl" submit "$1" --coordinator "$address" 2>&1 | grep -o 'job-[0-9]*' | head -1
}
state_is() {  # state_is JOB STATE
  [[ "$(field "$1" state)" == "$2"* ]]
}
steps_at_least() {  # steps_at_least JOB N
  local progress
  progress=$(field "$1" progress)
  progress=${progress%%/*}
  [ -n "$progress" ] && [ "$progress" -ge "$2" ]
}

# A bad quota flag is a usage error that names the entry.
"$coordinator" --listen 127.0.0.1:0 --owner-quota team-a >"$dir/bad.out" 2>&1
check "bad --owner-quota exits 2" test $? -eq 2
check "bad --owner-quota names the entry" grep -q "'team-a' has no '='" "$dir/bad.out"
printf 'owner_quota: "team-a=2"\npreemption: maybe\n' >"$dir/bad.yaml"
"$coordinator" --listen 127.0.0.1:0 --config "$dir/bad.yaml" >"$dir/bad-config.out" 2>&1
check "a bad preemption key in --config exits 2" test $? -eq 2
check "the bad key is named at its position" grep -q "bad.yaml:2:13: preemption" "$dir/bad-config.out"

"$coordinator" --listen 127.0.0.1:0 --heartbeat-timeout 5 \
  --owner-quota research=2 --ready-file "$dir/ready" >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
address=$(head -1 "$dir/ready")
for i in 0 1; do
  "$worker" --coordinator "$address" --name "w$i" >"$dir/w$i.log" 2>&1 &
  pids+=($!)
done
check "two workers register" wait_for 20 idle_workers 2

# The reference: the low job's run without interruption.
job_yaml low "$dir/full" 40 "priority: low" >"$dir/full.yaml"
full=$(submit "$dir/full.yaml")
check "uninterrupted run ends" wait_for 90 job_ended "$full"
check "uninterrupted run succeeds" state_is "$full" SUCCEEDED
"$ctl" export "$dir/full" -o "$dir/full.safetensors" >/dev/null 2>&1

# The same job again, preempted mid-run.
job_yaml low "$dir/low" 40 "priority: low
owner: research
restart: {max_restarts: 2}" >"$dir/low.yaml"
low=$(submit "$dir/low.yaml")
check "low job runs" wait_for 60 state_is "$low" RUNNING
check "low job passes step 5" wait_for 60 steps_at_least "$low" 5
job_yaml urgent "$dir/urgent" 24 "priority: urgent" >"$dir/urgent.yaml"
urgent=$(submit "$dir/urgent.yaml")
check "urgent job becomes RUNNING" wait_for 60 state_is "$urgent" RUNNING
check "low job was queued again, not failed" state_is "$low" QUEUED
# Reported, not asserted (no timing assertions): how long the urgent job
# waited, against the low job's step time.
"$ctl" status "$urgent" -o json --coordinator "$address" >"$dir/urgent.json" 2>/dev/null
"$ctl" status "$low" -o json --coordinator "$address" >"$dir/low.json" 2>/dev/null
python3 - "$dir/urgent.json" "$dir/low.json" <<'PY' || true
import json, sys
u, l = (json.load(open(p)) for p in sys.argv[1:3])
wait = int(u["started_unix_ms"]) - int(u["created_unix_ms"])
print(f"urgent job: submitted to RUNNING in {wait} ms; the preempted job's "
      f"step takes {l['last_step_seconds'] * 1e3:.0f} ms and it drained after "
      f"step {l['last_checkpoint_step']}")
PY
check "low job says it was preempted by the urgent one" bash -c \
  "[[ '$(field "$low" preempted)' == '1 time, last by $urgent' ]]"
check "low job's priority and owner are shown" bash -c \
  "[[ '$(field "$low" priority)' == 'low; owner research' ]]"
"$ctl" jobs --coordinator "$address" >"$dir/jobs.out" 2>&1
check "conveyorctl jobs says why the low job waits" grep -qE \
  "^$low .* low(\+[0-9]+)? +research +needs 2 workers, 0 free" "$dir/jobs.out"
check "urgent job ends" wait_for 90 job_ended "$urgent"
check "urgent job succeeds" state_is "$urgent" SUCCEEDED
check "low job ends" wait_for 90 job_ended "$low"
check "low job succeeds" state_is "$low" SUCCEEDED
check "low job resumed from the drained step" bash -c \
  "[[ '$(field "$low" resumed)' =~ ^from\ step\ [1-9] ]]"
check "a preemption is not a restart" bash -c \
  "[[ '$(field "$low" restarts)' == '0 of at most 2; last after: preempted by $urgent (urgent)'* ]]"
"$ctl" export "$dir/low" -o "$dir/low.safetensors" >/dev/null 2>&1
check "preempted job's parameters equal the uninterrupted run's, bitwise" \
  same_tensors "$dir/full.safetensors" "$dir/low.safetensors"
check "the coordinator logged the preemption" \
  grep -q "$low (low): preempted by $urgent (urgent)" "$dir/coordinator.log"

finish || { cat "$dir/jobs.out"; tail -n 30 "$dir"/*.log; exit 1; }
