#!/usr/bin/env bash
# The GPU section of scripts/bench (bench/README-gpu.md): GEMMs through the
# CUDA backend against raw cuBLAS, the JaxPP transformer's step against
# PyTorch's on the same GPU, and the idle share of a step under nsys. Prints
# the tables; exits 1 when a figure misses its target or a benchmark failed.
# Run by scripts/bench, and by scripts/gpu-check on a GPU machine that has
# no build tree of its own.
#
#   bench/gpu_section.sh GPU_BENCHMARK_BINARY WORK_DIR
#
# WORK_DIR receives the JSON and logs. CONVEYOR_TORCH_PYTHON names the
# interpreter with CUDA PyTorch when the first python3 has none, and
# CONVEYOR_TORCH_LD_LIBRARY_PATH, when set, is the library path PyTorch runs
# with (so that libraries put first for Conveyor's binaries do not shadow
# its own).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gpu_bin=${1:?usage: gpu_section.sh GPU_BENCHMARK_BINARY WORK_DIR}
work=${2:?usage: gpu_section.sh GPU_BENCHMARK_BINARY WORK_DIR}
mkdir -p "$work"
torch_env=(env)
if [ -n "${CONVEYOR_TORCH_LD_LIBRARY_PATH+set}" ]; then
  torch_env=(env "LD_LIBRARY_PATH=$CONVEYOR_TORCH_LD_LIBRARY_PATH")
fi
# Each part has a time limit (seconds, times CONVEYOR_GPU_BENCH_LIMIT_SCALE),
# so that one hang costs that part and not the whole run: a GPU machine may
# be lent for minutes only. -k: killed if it ignores the TERM.
scale=${CONVEYOR_GPU_BENCH_LIMIT_SCALE:-1}
limit() { echo $(($1 * scale)); }
status=0
# run_part NAME LIMIT STDOUT LOG COMMAND...: runs it with its output to
# STDOUT and its errors to LOG, says so when it failed and shows the end of
# LOG, which stays in $work.
run_part() {
  local name=$1 seconds=$2 out=$3 log=$4
  shift 4
  timeout -k 10 "$(limit "$seconds")" "$@" >"$out" 2>"$log"
  local rc=$?
  if [ "$rc" != 0 ]; then
    [ "$rc" = 124 ] || [ "$rc" = 137 ] &&
      echo "($name: stopped after its limit of $(limit "$seconds")s)"
    echo "($name: exit $rc; the end of $log:)"
    tail -n 15 "$log" | sed 's/^/  /'
  fi
  return "$rc"
}

# The manual time of a GEMM iteration is one call's, of ten timed together,
# so the library's minimum time covers a tenth of the wall time.
run_part "GEMM benchmarks" 200 /dev/null "$work/gpu_gemm.log" \
  "$gpu_bin" --benchmark_filter='^gemm/' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_min_time=0.03 \
  --benchmark_out="$work/gpu_gemm.json" --benchmark_out_format=json ||
  status=1
run_part "step benchmarks" 150 /dev/null "$work/gpu_steps.log" \
  "$gpu_bin" --benchmark_filter='^step/' \
  --benchmark_out="$work/gpu_steps.json" --benchmark_out_format=json ||
  status=1
# PyTorch with CUDA is rarely Debian's (CPU-only) python3-torch: take the
# first interpreter whose torch sees a GPU.
torch_py=
for py in ${CONVEYOR_TORCH_PYTHON:-} python3 /usr/bin/python3; do
  if timeout -k 5 60 "${torch_env[@]}" "$py" -c \
      'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
      >/dev/null 2>&1; then
    torch_py=$py
    break
  fi
done
echo '{}' >"$work/torch_gpu.json"
if [ -z "$torch_py" ]; then
  echo "(no PyTorch with CUDA found; set CONVEYOR_TORCH_PYTHON to an interpreter that has one)"
elif ! run_part "PyTorch GPU reference" 200 "$work/torch_gpu.json" \
    "$work/torch_gpu_reference.log" \
    "${torch_env[@]}" "$torch_py" "$root/bench/torch_gpu_reference.py"; then
  echo '{}' >"$work/torch_gpu.json"
fi
# The Llama-3.2-1B-shaped stage (issue 37 (b)) at bf16 only, the precision
# it is judged at: Conveyor's step, then PyTorch's eager and compiled ones.
# CONVEYOR_GPU_LLAMA=0 skips it (it takes a few minutes with the compile).
rm -f "$work/gpu_llama.json" "$work/torch_llama.json"
if [ "${CONVEYOR_GPU_LLAMA:-1}" != 0 ] && [ "${CONVEYOR_GPU_PRECISION:-fp32}" = bf16 ]; then
  run_part "Llama step benchmark" 300 /dev/null "$work/gpu_llama.log" \
    "$gpu_bin" --benchmark_filter='^llama/' \
    --benchmark_out="$work/gpu_llama.json" --benchmark_out_format=json ||
    status=1
  if [ -n "$torch_py" ]; then
    run_part "PyTorch Llama reference" 420 "$work/torch_llama.json" \
      "$work/torch_llama_reference.log" \
      "${torch_env[@]}" "$torch_py" "$root/bench/torch_llama_reference.py" ||
      rm -f "$work/torch_llama.json"
  fi
  python3 "$root/bench/llama_table.py" "$work/gpu_llama.json" \
    "$work/torch_llama.json" || status=1
  # (c): the same model as a 2-stage pipeline on two workers sharing the GPU.
  ctl=${CONVEYORCTL:-$(dirname "$gpu_bin")/conveyorctl}
  [ -x "$ctl" ] || ctl=$(dirname "$gpu_bin")/../bin/conveyorctl
  if [ -x "$ctl" ]; then
    timeout -k 10 "$(limit 300)" "$root/bench/llama_pipeline.sh" "$ctl" \
      "$work/llama_pipeline" || status=1
  else
    echo "(Llama pipeline not run: no conveyorctl beside $gpu_bin; set CONVEYORCTL)"
  fi
fi
rm -f "$work/gpu_idle_gaps.json"
if command -v nsys >/dev/null 2>&1; then
  gaps=0
  timeout -k 10 "$(limit 200)" "$root/bench/gpu_idle_gaps.sh" --bin "$gpu_bin" \
    --out "$work/gpu_idle_gaps" --json "$work/gpu_idle_gaps.json" \
    >"$work/gpu_idle_gaps.log" 2>&1 || gaps=$?
  if [ "$gaps" != 0 ] && [ ! -f "$work/gpu_idle_gaps.json" ]; then
    echo "(idle gaps not measured: exit $gaps; the end of $work/gpu_idle_gaps.log:)"
    tail -n 15 "$work/gpu_idle_gaps.log" | sed 's/^/  /'
  fi
else
  echo "(idle gaps not measured: nsys is not installed; bench/gpu_idle_gaps.sh needs it)"
fi
python3 - "$work/gpu_gemm.json" "$work/gpu_steps.json" "$work/torch_gpu.json" \
    "$work/gpu_idle_gaps.json" <<'PY' || status=1
import json, os, sys

def load(path):
    # A benchmark that aborted or timed out leaves no file or a cut one:
    # its table is then empty, and the others are still printed.
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"({os.path.basename(path)}: {e})")
        return None

gemm, steps, torch = (load(p) for p in sys.argv[1:4])
failed = sum(x is None for x in (gemm, steps))
gemm = gemm or {"context": {}, "benchmarks": []}
steps = steps or {"context": {}, "benchmarks": []}
torch = torch or {}
ctx = gemm["context"] or steps["context"]
# bf16 figures are shown but not held to their targets (reasons at each use).
bf16 = ctx.get("precision", "fp32") == "bf16"
gpu = ctx.get("gpu", "?")
for b in gemm["benchmarks"] + steps["benchmarks"]:
    if b.get("error_occurred"):
        print(f"ERROR {b['name']}: {b.get('error_message', '?')}")
        failed += 1

def ms(b):
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
    return b["real_time"] * scale

med = {b["run_name"].replace("/manual_time", ""): b for b in gemm["benchmarks"]
       if b.get("aggregate_name") == "median"}
torch_gemm = torch.get("gemm", {})
print(f"{'GEMM (batch x) m x n x k':<32} {'backend TFLOP/s':>15} {'cuBLAS TFLOP/s':>15} "
      f"{'fraction':>9} {'torch TFLOP/s':>14}  target >= 0.95")
for name, b in med.items():
    if not name.startswith("gemm/backend/"):
        continue
    shape = name[len("gemm/backend/"):]
    c = med.get(f"gemm/cublas/{shape}")
    if c is None:
        continue
    fraction = b["TFLOPs"] / c["TFLOPs"]
    # bf16: the backend rounds both fp32 operands on every call, the cuBLAS
    # side multiplies operands rounded beforehand. Reading fp32 and writing
    # bf16 copies costs, at full bandwidth, from a third of these GEMMs' own
    # time (the dense layers) to twice it (attention's [S, S] operands), so
    # until activations and weights are stored in bf16 no backend reaches
    # 0.95 here: the fraction is shown, not held to the target.
    failed += not bf16 and fraction < 0.95
    ref = torch_gemm.get(shape, {}).get("tflops")
    print(f"{shape:<32} {b['TFLOPs']:>15.1f} {c['TFLOPs']:>15.1f} {fraction:>9.3f} "
          f"{ref if ref is not None else float('nan'):>14.1f}  "
          f"{'ok' if fraction >= 0.95 else 'below (rounds per call)' if bf16 else 'BELOW TARGET'}")
print("(medians of 3; backend: Backend::Gemm on CudaBackend; cuBLAS: the same cublasGemmEx call "
      "on the same buffers and stream; torch: torch.matmul, for context)")

ours = {b["run_name"].split("/iterations")[0]: ms(b) for b in steps["benchmarks"]
        if not b.get("error_occurred")}
# At bf16 the two sides compute different things (Conveyor rounds GEMM inputs
# and keeps activations fp32; autocast keeps them bf16): the ratio is shown,
# not held to the target.
print()
print(f"{'training step':<44} {'Conveyor ms':>12} {'PyTorch ms':>11} {'ratio':>7}  target <= 1.2 (then 1.0)")
for label, mine, theirs, target in (
        ("trainer, data uploaded every microbatch", "step/conveyor_transformer",
         "ms_per_step_host_data", True),
        ("data on the GPU", "step/conveyor_transformer_resident", "ms_per_step", True),
        ("data on the GPU, PyTorch math attention", "step/conveyor_transformer_resident",
         "ms_per_step_math_attention", False)):
    a, r = ours.get(mine), torch.get(theirs)
    if a is None:
        continue
    if r is None:
        print(f"{label:<44} {a:>12.2f} {'n/a':>11}")
        continue
    ratio = a / r
    if bf16:
        target = False
        verdict = "(bf16 storage on PyTorch's side only)"
    else:
        verdict = ("ok" if ratio <= 1.2 else "SLOWER") if target else "(like-for-like kernels)"
    failed += target and ratio > 1.2
    print(f"{label:<44} {a:>12.2f} {r:>11.2f} {ratio:>7.3f}  {verdict}")
if torch and torch.get("gpu") != gpu:
    print(f"WARNING: PyTorch ran on '{torch.get('gpu')}', Conveyor on '{gpu}'")
if os.path.exists(sys.argv[4]):
    idle = json.load(open(sys.argv[4]))
    ok = idle["mean_idle_fraction"] < 0.05
    failed += not ok
    print()
    print(f"{'idle: no kernel running, share of the step':<44} {100 * idle['mean_idle_fraction']:>11.2f}%"
          f"  target < 5%  {'ok' if ok else 'OVER TARGET'}  (bench/gpu_idle_gaps.sh, "
          f"{len(idle['steps'])} steps under nsys)")
torch_note = (f"PyTorch {torch['torch_version']} (CUDA {torch['cuda']})" if torch
              else "no PyTorch figures")
print(f"(GPU: {gpu}, compute capability {ctx.get('gpu_compute_capability', '?')}; CUDA runtime "
      f"{ctx.get('cuda_runtime', '?')}, driver {ctx.get('cuda_driver', '?')}; precision "
      f"{ctx.get('precision', '?')} on both sides; {torch_note}; the JaxPP transformer: 8 post-norm "
      f"blocks, d 1024, 8 heads, MLP 4096, sequence 2048, batch 8 in 4 microbatches, MSE, AdamW)")
sys.exit(1 if failed else 0)
PY
exit "$status"
