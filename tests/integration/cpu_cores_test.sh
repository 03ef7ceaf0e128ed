#!/usr/bin/env bash
# CPU workers own their cores, with real processes: a worker given
# --cpu-cores has every thread (OpenBLAS's, started when the library loads,
# included) on those cores and says so; bad lists and cores it may not use
# are refused with exit 2, naming the problem; `conveyorctl run` pins its
# local workers to disjoint shares of the cores it may use (taskset gives
# it two), or, with fewer cores than workers, pins nobody, and the job
# trains either way. Needs COORDINATOR, WORKER and CONVEYORCTL.
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/daemon_test_lib.sh"

read -r -a cores < <(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')
first=${cores[0]}

# Refused before anything starts: exit 2 and the reason.
"$worker" --cpu-cores 3-1 --coordinator 127.0.0.1:1 >"$dir/backwards.log" 2>&1
check "a backwards range exits 2" test $? -eq 2
check "... saying so" grep -q -- "--cpu-cores 3-1: '3-1' is a range that runs backwards" "$dir/backwards.log"
"$worker" --cpu-cores 1023 --coordinator 127.0.0.1:1 >"$dir/missing.log" 2>&1
check "a core the worker may not use exits 2" test $? -eq 2
check "... naming the cores it may use" \
  grep -q "core 1023 is not available to this process (it runs on " "$dir/missing.log"

"$coordinator" --listen 127.0.0.1:0 --ready-file "$dir/ready" \
  >"$dir/coordinator.log" 2>&1 &
pids+=($!)
wait_for 10 test -s "$dir/ready"
address=$(head -1 "$dir/ready")
"$worker" --coordinator "$address" --name pinned --devices cpu:1 \
  --cpu-cores "$first" >"$dir/worker.log" 2>&1 &
worker_pid=$!
pids+=($worker_pid)
check "the worker says where it runs" \
  wait_for 10 grep -q "starting as 'pinned' (devices cpu:1 on cores $first)" "$dir/worker.log"
check "the worker registers" \
  wait_for 10 sh -c "'$ctl' workers --coordinator '$address' | grep -q pinned"
every_thread_on() {  # every_thread_on PID LIST
  local status n=0
  for status in /proc/"$1"/task/*/status; do
    grep -q "^Cpus_allowed_list:[[:space:]]*$2\$" "$status" || return 1
    n=$((n + 1))
  done
  test "$n" -gt 1
}
check "every thread of the worker is on core $first" every_thread_on "$worker_pid" "$first"

if [ "${#cores[@]}" -ge 2 ]; then
  two="${cores[0]},${cores[1]}"
  taskset -c "$two" "$ctl" run "$root/examples/gpt.yaml" --steps 3 --keep-logs \
    --set "checkpoint.dir=$dir/pinned" >"$dir/pinned.out" 2>&1
  check "run on two cores succeeds" test $? -eq 0
  check "... with a core for each worker" \
    grep -q "2 conveyor-worker(s), 1 core each, pinned to ${cores[0]} | ${cores[1]}" "$dir/pinned.out"
  logs=$(sed -n "s/^conveyorctl: the daemons' logs: //p" "$dir/pinned.out")
  check "... worker 0 on the first" grep -qh "'local-0' (devices cpu:1 on cores ${cores[0]})" $logs
  check "... worker 1 on the second" grep -qh "'local-1' (devices cpu:1 on cores ${cores[1]})" $logs
  rm -rf $(dirname "$(echo $logs | cut -d' ' -f1)")
else
  echo "one core: the two-core run is not tried"
fi
taskset -c "$first" "$ctl" run "$root/examples/gpt.yaml" --steps 3 \
  --set "checkpoint.dir=$dir/shared" >"$dir/shared.out" 2>&1
check "run on one core succeeds" test $? -eq 0
check "... pinning nobody" \
  grep -q "2 workers sharing 1 core(s): 1 thread each, not pinned" "$dir/shared.out"
"$ctl" run "$root/examples/gpt.yaml" --in-process --no-pin >"$dir/in_process.out" 2>&1
check "--no-pin does not go with --in-process" test $? -eq 2
check "... and says so" grep -q "run: --no-pin is for the daemons" "$dir/in_process.out"

finish || { tail -n 20 "$dir"/*.log "$dir"/*.out; exit 1; }
