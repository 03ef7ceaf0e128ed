#!/usr/bin/env bash
# bench/llama_pipeline.sh (gpu-check's 2-stage Llama pipeline, issue 37 (c))
# on a CPU-sized model through the real daemons: the run succeeds and the
# script prints the last step's line and both bubbles, measured and
# simulated at the step's stage costs. Their gap is a timing, judged on the
# GPU only. Needs CONVEYORCTL.
set -u
ctl=${CONVEYORCTL:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/daemon_test_lib.sh"

"$root/bench/llama_pipeline.sh" "$ctl" "$dir/work" --tiny >"$dir/out" 2>&1
check "the tiny pipeline runs through the daemons" test $? -eq 0
check "... printing its last step" grep -qE "last step: step 4/4 .* tokens/s" "$dir/out"
check "... and both bubbles with their gap" grep -qE \
  "bubble [0-9.]+% measured, [0-9.]+% simulated at the step's stage costs: [-+][0-9.]+ points" \
  "$dir/out"
check "... on a 2-stage 1f1b job of the Llama shape" grep -q \
  "boundary_every: 1" "$dir/work/llama_pipeline.yaml"
cat "$dir/out"
finish
