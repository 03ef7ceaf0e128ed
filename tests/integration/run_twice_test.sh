#!/usr/bin/env bash
# `conveyorctl run` of the same job twice, as the README's scripts/run-example
# does, through the real daemons: without --overwrite the second run is
# refused over the first run's checkpoint (saying how to proceed); with it,
# the old steps go and the second run trains from scratch, ending bitwise
# equal to the first. --overwrite with a resuming job is refused; a run
# resumed with training.steps raised trains on to the new end. Needs
# CONVEYORCTL (the daemons are found beside it).
set -u
ctl=${CONVEYORCTL:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/daemon_test_lib.sh"

# The README's example itself, shortened, with its checkpoints in $dir.
run() {  # run OUTPUT ARGS...
  local out=$1
  shift
  "$ctl" run "$root/examples/mlp.yaml" --steps 6 \
    --set "checkpoint.dir=$dir/ckpt" "$@" >"$dir/$out" 2>&1
}

run first.out --overwrite
check "the first run succeeds (--overwrite with nothing to remove)" test $? -eq 0
check "... and removes nothing" bash -c "! grep -q 'removed' '$dir/first.out'"
check "... ending with its last step's bubble, split as trace splits it" grep -qE \
  "^last step's bubble [0-9.]+% measured; simulated for these actions: [0-9.]+% at this step's stage costs, 20.0% at uniform stages" \
  "$dir/first.out"
"$ctl" export "$dir/ckpt" -o "$dir/first.safetensors" >/dev/null
check "... leaving a checkpoint" test -s "$dir/first.safetensors"

mkdir -p "$dir/tmp"
TMPDIR=$dir/tmp run refused.out
check "a second run without --overwrite is refused" test $? -ne 0
check "... naming the earlier checkpoint and --overwrite" grep -q \
  "already holds a complete checkpoint of an earlier run (step 6).*--overwrite" \
  "$dir/refused.out"
# Checked before any daemon starts (it once started a cluster first, and
# left its log folder behind at each refusal).
check "... before starting a cluster" bash -c "! grep -q 'starting a local cluster' '$dir/refused.out'"
check "... leaving no log folder" test -z "$(ls -A "$dir/tmp")"

run second.out --overwrite
check "a second run with --overwrite succeeds" test $? -eq 0
check "... saying what it removed" grep -q \
  "removed 1 checkpoint step(s) of an earlier run from $dir/ckpt (steps 6 to 6)" \
  "$dir/second.out"
"$ctl" export "$dir/ckpt" -o "$dir/second.safetensors" >/dev/null
check "... training from scratch: bitwise equal to the first run" \
  same_tensors "$dir/first.safetensors" "$dir/second.safetensors"

run resume.out --overwrite --set resume=latest
check "--overwrite with a resuming job is refused" test $? -eq 2
check "... saying why" grep -q \
  "run: --overwrite starts from scratch, and the job resumes" "$dir/resume.out"
check "... before touching the checkpoint" test -d "$dir/ckpt/step-6"

# Resumed with training.steps raised (all that differs from the job file the
# step-6 manifest records), the job trains on to the new end, bitwise equal
# to 10 steps from scratch: mlp.yaml's learning rate is constant, so the
# longer run changes nothing before step 6.
"$ctl" run "$root/examples/mlp.yaml" --steps 10 --set resume=latest \
  --set "checkpoint.dir=$dir/ckpt" >"$dir/longer.out" 2>&1
check "resuming with training.steps raised from 6 to 10 succeeds" test $? -eq 0
check "... from step 6" grep -q "6/10 steps done" "$dir/longer.out"
check "... to step 10" grep -q "SUCCEEDED: 10/10 steps" "$dir/longer.out"
"$ctl" run "$root/examples/mlp.yaml" --steps 10 --overwrite \
  --set "checkpoint.dir=$dir/ten" >"$dir/ten.out" 2>&1
"$ctl" export "$dir/ckpt" -o "$dir/longer.safetensors" >/dev/null
"$ctl" export "$dir/ten" -o "$dir/ten.safetensors" >/dev/null
check "... bitwise equal to 10 steps from scratch" \
  same_tensors "$dir/longer.safetensors" "$dir/ten.safetensors"

finish || { tail -n 20 "$dir"/*.out; exit 1; }
