#!/usr/bin/env bash
# `restart: {max_restarts: 1}` with real processes: the worker of the
# first, a middle and the last stage of a running 3-stage job is killed with
# -9 mid-step (between checkpoints). With a spare worker the job restarts on
# the survivors from its newest committed step, ends SUCCEEDED with one
# restart naming the killed worker, and its final parameters equal an
# uninterrupted run's bitwise. No worker process is left behind.
# Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

job_yaml() {  # job_yaml CHECKPOINT_DIR [EXTRA]
  cat <<YAML
name: restart
model:
  input_shape: [32]
  init: {seed: 0}
  layers:
    - dense: {features: 64}
    - relu
    - delay: {forward_ms: 15, backward_ms: 0}
    - boundary
    - dense: {features: 64}
    - relu
    - delay: {forward_ms: 15, backward_ms: 0}
    - boundary
    - dense: {features: 32}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 30, batch_size: 32, microbatches: 4}
optimizer: {kind: adam, lr: 0.003}
pipeline: {schedule: 1f1b}
checkpoint: {dir: $1, every: 4}
${2:-}
YAML
}
# About 0.1 s a step, so 30 steps give the kill a window of seconds: under
# CI's load each conveyorctl call can take a tenth of one, and a job that
# ended before the kill landed would fail the test for nothing.
# Past its first checkpoint and not at a checkpoint step: mid-step.
mid_run() {
  local progress steps
  field "$1" checkpoint | grep -q 'newest complete: step' || return 1
  progress=$(field "$1" progress)
  steps=${progress%%/*}
  [ -n "$steps" ] && [ "$steps" -ge 5 ] && [ $((steps % 4)) -ne 0 ]
}
worker_of_rank() {  # worker_of_rank JOB RANK: the worker id running RANK
  "$ctl" status "$1" --coordinator "$address" 2>/dev/null |
    awk -v s="$2" '$1 == s && $2 == s { print $NF }'
}
placed() { [ -n "$(worker_of_rank "$1" "$2")" ]; }

"$coordinator" --listen 127.0.0.1:0 --heartbeat-timeout 3 \
  --ready-file "$dir/ready" >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
address=$(head -1 "$dir/ready")
declare -A pid_of  # worker name -> pid
start_worker() {
  "$worker" --coordinator "$address" --name "$1" >"$dir/$1.log" 2>&1 &
  pid_of[$1]=$!
  pids+=($!)
}
for i in 0 1 2 3; do start_worker "w$i"; done
check "four workers register" wait_for 20 idle_workers 4

job_yaml "$dir/full" >"$dir/full.yaml"
full=$("$ctl" submit "$dir/full.yaml" --coordinator "$address" 2>&1 | grep -o 'job-[0-9]*' | head -1)
check "uninterrupted run ends" wait_for 60 job_ended "$full"
check "uninterrupted run succeeds" bash -c "[[ '$(field "$full" state)' == SUCCEEDED* ]]"
"$ctl" export "$dir/full" -o "$dir/full.safetensors" >/dev/null 2>&1

spare=4
for rank in 0 1 2; do
  job_yaml "$dir/ckpt-$rank" "restart: {max_restarts: 1}" >"$dir/job-$rank.yaml"
  job=$("$ctl" submit "$dir/job-$rank.yaml" --coordinator "$address" 2>&1 | grep -o 'job-[0-9]*' | head -1)
  # The victim is looked up as soon as the job is placed, so that the kill
  # follows the mid-run observation at once. The stage table's WORKER column
  # names the rank's worker id; the worker list maps it to the name we
  # started it under.
  wait_for 60 placed "$job" "$rank"
  id=$(worker_of_rank "$job" "$rank")
  name=$("$ctl" workers --coordinator "$address" 2>/dev/null |
    awk -v id="$id" '$1 == id { print $2 }')
  victim=${pid_of[$name]:-}
  check "rank $rank: its worker found ($id, $name)" test -n "$victim"
  check "rank $rank: job reaches mid-run" wait_for 60 mid_run "$job"
  if [ -n "$victim" ]; then
    kill -KILL "$victim"
    wait "$victim" 2>/dev/null  # Reaped here, quietly.
  fi
  check "rank $rank: job ends" wait_for 60 job_ended "$job"
  check "rank $rank: job succeeded" bash -c "[[ '$(field "$job" state)' == SUCCEEDED* ]]"
  check "rank $rank: one restart naming the killed worker" bash -c \
    "[[ '$(field "$job" restarts)' == '1 of at most 1; last after: '*'$id'* ]]"
  check "rank $rank: resumed from a committed step" bash -c \
    "[[ '$(field "$job" resumed)' =~ ^from\ step\ [1-9] ]]"
  "$ctl" export "$dir/ckpt-$rank" -o "$dir/ckpt-$rank.safetensors" >/dev/null 2>&1
  check "rank $rank: parameters equal the uninterrupted run's, bitwise" \
    same_tensors "$dir/full.safetensors" "$dir/ckpt-$rank.safetensors"
  check "rank $rank: the killed worker is gone" bash -c "! kill -0 $victim 2>/dev/null"
  # A fresh spare for the next round.
  start_worker "w$spare"
  spare=$((spare + 1))
  check "rank $rank: survivors and the new spare are idle" wait_for 20 idle_workers 4
done

finish || { tail -n 20 "$dir"/*.log; exit 1; }
