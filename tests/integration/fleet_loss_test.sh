#!/usr/bin/env bash
# Two workers of a running 3-stage job killed with -9 at the same moment,
# on four workers, for every pair of the job's three workers and for one
# of them with the spare, each pair killed in both orders (the order the
# coordinator sees the losses in is up to it, so each order is asked for by
# killing one before the other in one command):
#  - `restart: {max_restarts: 3, elastic: {min_workers: 1}}`: the job goes on
#    on the two live workers and succeeds (it once sat QUEUED for good: the
#    restart counted the second victim as live);
#  - non-elastic `max_restarts: 3`: the job FAILs, saying it needs 3 workers
#    and 2 are live (it once sat QUEUED as well);
#  - `min_workers: 3`: FAILED naming restart.elastic.min_workers.
# Killed workers are started again between rounds.
# Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

job_yaml() {  # job_yaml CHECKPOINT_DIR RESTART
  cat <<YAML
name: fleet-loss
model:
  input_shape: [16]
  init: {seed: 0}
  layers:
    - dense: {features: 32}
    - delay: {forward_ms: 10, backward_ms: 0}
    - boundary
    - dense: {features: 32}
    - delay: {forward_ms: 10, backward_ms: 0}
    - boundary
    - dense: {features: 16}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 40, batch_size: 8, microbatches: 2}
optimizer: {kind: sgd, lr: 0.01}
pipeline: {schedule: 1f1b}
checkpoint: {dir: $1, every: 2}
restart: $2
YAML
}

"$coordinator" --listen 127.0.0.1:0 --heartbeat-timeout 3 \
  --ready-file "$dir/ready" >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
address=$(head -1 "$dir/ready")
declare -A pid_of  # worker name -> pid
start_worker() {
  "$worker" --coordinator "$address" --name "$1" >>"$dir/$1.log" 2>&1 &
  pid_of[$1]=$!
  pids+=($!)
}
worker_of_rank() {  # worker_of_rank JOB RANK: the worker id running RANK
  "$ctl" status "$1" --coordinator "$address" 2>/dev/null |
    awk -v s="$2" '$1 == s && $2 == s { print $NF }'
}
name_of() {  # name_of WORKER_ID
  "$ctl" workers --coordinator "$address" 2>/dev/null |
    awk -v id="$1" '$1 == id { print $2 }'
}
stepped() {  # stepped JOB N: at least N steps done
  local progress
  progress=$(field "$1" progress)
  [ -n "${progress%%/*}" ] && [ "${progress%%/*}" -ge "$2" ] 2>/dev/null
}
for w in a b c d; do start_worker "$w"; done
check "four workers register" wait_for 20 idle_workers 4

round=0
# run_round RESTART VICTIMS EXPECT: VICTIMS are ranks (0-2) or "spare", in
# kill order; EXPECT is SUCCEEDED or a pattern the FAILED message matches.
run_round() {
  local restart=$1 victims=$2 expect=$3
  round=$((round + 1))
  local label="round $round ($restart; kill $victims)"
  job_yaml "$dir/ckpt-$round" "$restart" >"$dir/job-$round.yaml"
  local job
  job=$("$ctl" submit "$dir/job-$round.yaml" --coordinator "$address" 2>&1 |
    grep -o 'job-[0-9]*' | head -1)
  if ! wait_for 60 stepped "$job" 4; then
    check "$label: job steps" false
    return
  fi
  # The job's three workers by rank; the spare is the fourth.
  local -a ids=()
  local r
  for r in 0 1 2; do ids+=("$(worker_of_rank "$job" "$r")"); done
  local spare="" w
  for w in a b c d; do
    local taken=0 id
    for id in "${ids[@]}"; do [ "$(name_of "$id")" = "$w" ] && taken=1; done
    [ $taken -eq 0 ] && spare=$w
  done
  local -a kill_pids=() names=()
  local v
  for v in $victims; do
    if [ "$v" = spare ]; then
      names+=("$spare")
    else
      names+=("$(name_of "${ids[$v]}")")
    fi
  done
  for w in "${names[@]}"; do kill_pids+=("${pid_of[$w]}"); done
  kill -KILL "${kill_pids[@]}"
  for pid in "${kill_pids[@]}"; do wait "$pid" 2>/dev/null; done
  check "$label: the job ends (not stuck QUEUED)" wait_for 90 job_ended "$job"
  local state
  state=$(field "$job" state)
  if [ "$expect" = SUCCEEDED ]; then
    check "$label: succeeded on the live workers ($state)" \
      bash -c "[[ '$state' == SUCCEEDED* ]]"
  else
    local message
    message=$(field "$job" message)
    check "$label: failed naming why ($state: $message)" \
      bash -c "[[ '$state' == FAILED* ]] && grep -qF -- '$expect' <<<'$message'"
  fi
  # The killed workers come back for the next round.
  for w in "${names[@]}"; do start_worker "$w"; done
  wait_for 30 idle_workers 4
}

elastic="{max_restarts: 3, elastic: {min_workers: 1}}"
for pair in "0 1" "1 0" "1 2" "2 1" "0 2" "2 0" "0 spare" "spare 0" "2 spare" "spare 2"; do
  run_round "$elastic" "$pair" SUCCEEDED
done
run_round "{max_restarts: 3}" "1 spare" "needs 3 workers and 2 are live"
run_round "{max_restarts: 3}" "spare 1" "needs 3 workers and 2 are live"
run_round "{max_restarts: 3, elastic: {min_workers: 3}}" "0 1" \
  "fewer than restart.elastic.min_workers (3)"

if [ "$failed" -ne 0 ]; then tail -40 "$dir/coordinator.log"; fi
finish
