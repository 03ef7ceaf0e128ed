#!/usr/bin/env bash
# Idle gaps of the CUDA backend within a training step: how much of each step
# the GPU runs no kernel (target: under 5% of the step). Runs gpu_benchmark's
# step benchmark under Nsight Systems, profiling only the steps that the
# benchmark wraps in cudaProfilerStart/Stop when CONVEYOR_PROFILE_STEPS is
# set, each in an NVTX range "conveyor_step"; then, per step window (the NVTX
# range, from the host's call into the step to its final synchronize), the
# union of kernel intervals from `nsys stats --report cuda_gpu_trace`, and
# the rest as idle, split into lead (before the first kernel: host-side data
# preparation and upload), between kernels, and tail.
#
#   bench/gpu_idle_gaps.sh [--resident] [--steps N] [--bin PATH] [--out DIR]
#                          [--json PATH]
#
#   --resident  profile step/conveyor_transformer_resident (data already on
#               the GPU) instead of step/conveyor_transformer (the trainer)
#   --steps N   profiled steps (default 5)
#   --bin PATH  the gpu_benchmark binary (default: build-bench/bench/gpu_benchmark)
#   --out DIR   where the report and CSVs go (default: a new temporary dir)
#   --json PATH also write the summary as JSON
#
# Exits 77 (skipped) without nsys or without a GPU, 1 when the mean idle
# fraction is 5% or more, 0 otherwise. CONVEYOR_GPU_PRECISION passes through.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

bench=step/conveyor_transformer
steps=5
bin=${CONVEYOR_GPU_BENCHMARK:-$root/build-bench/bench/gpu_benchmark}
out=
json=
while [ $# -gt 0 ]; do
  case $1 in
    --resident) bench=step/conveyor_transformer_resident ;;
    --steps) steps=$2; shift ;;
    --bin) bin=$2; shift ;;
    --out) out=$2; shift ;;
    --json) json=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "gpu_idle_gaps.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if ! command -v nsys >/dev/null 2>&1; then
  echo "gpu_idle_gaps.sh: nsys (Nsight Systems) is not installed or not on PATH; skipped"
  exit 77
fi
if ! nvidia-smi -L 2>/dev/null | grep '^GPU ' >/dev/null; then
  echo "gpu_idle_gaps.sh: no GPU (nvidia-smi -L lists none); skipped"
  exit 77
fi
if [ ! -x "$bin" ]; then
  echo "gpu_idle_gaps.sh: no gpu_benchmark at $bin; build it with" >&2
  echo "  cmake --build build-bench --target gpu_benchmark   (a CUDA build)" >&2
  exit 1
fi
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/conveyor_idle_gaps.XXXXXX")
mkdir -p "$out"

echo "profiling $steps steps of $bench under nsys (report in $out)"
# Only CUDA and NVTX: CPU sampling and context switches would add overhead
# to the host side of the step, which is what we are measuring.
CONVEYOR_PROFILE_STEPS=$steps nsys profile \
  --capture-range=cudaProfilerApi --capture-range-end=stop \
  --trace=cuda,nvtx --sample=none --cpuctxsw=none \
  --force-overwrite=true -o "$out/profile" \
  "$bin" --benchmark_filter="^$bench/" \
  --benchmark_out="$out/benchmark.json" --benchmark_out_format=json \
  >"$out/nsys_profile.log" 2>&1 || {
  cat "$out/nsys_profile.log" >&2
  exit 1
}
report=$(ls "$out"/profile.nsys-rep "$out"/profile.qdrep 2>/dev/null | head -1 || true)
if [ -z "$report" ]; then
  echo "gpu_idle_gaps.sh: nsys wrote no report; see $out/nsys_profile.log" >&2
  exit 1
fi

# Report names changed in Nsight Systems 2023.2 (gputrace -> cuda_gpu_trace,
# nvtxpptrace -> nvtx_pushpop_trace); try the new name, then the old one.
stats() {
  local csv=$1
  shift
  for name in "$@"; do
    if nsys stats --force-export=true --report "$name" --format csv \
        --output - "$report" >"$csv" 2>>"$out/nsys_stats.log"; then
      return 0
    fi
  done
  echo "gpu_idle_gaps.sh: nsys stats failed for $*; see $out/nsys_stats.log" >&2
  exit 1
}
stats "$out/gpu_trace.csv" cuda_gpu_trace gputrace
stats "$out/nvtx.csv" nvtx_pushpop_trace nvtxpptrace

python3 - "$out" "$json" <<'PY'
import csv, json, re, sys

out, json_path = sys.argv[1], sys.argv[2]
UNITS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}


def table(path, columns):
    """Rows of the CSV table in `path` whose header has every column prefix
    in `columns` (nsys may print notes before it), and for each prefix the
    column's key and its unit in nanoseconds."""
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    for i, line in enumerate(lines):
        header = next(csv.reader([line]), [])
        keys = {}
        for prefix in columns:
            match = [h for h in header if h.strip().startswith(prefix)]
            if match:
                keys[prefix] = match[0]
        if len(keys) == len(columns):
            units = {}
            for prefix, key in keys.items():
                unit = re.search(r"\((ns|us|ms|s)\)", key)
                units[prefix] = UNITS[unit.group(1)] if unit else 1
            return list(csv.DictReader(lines[i:])), keys, units
    sys.exit(f"gpu_idle_gaps: no table with columns {columns} in {path}")


rows, key, unit = table(f"{out}/nvtx.csv", ["Start", "End", "Name"])
windows = sorted((float(r[key["Start"]]) * unit["Start"], float(r[key["End"]]) * unit["End"])
                 for r in rows if "conveyor_step" in r[key["Name"]])
rows, gkey, gunit = table(f"{out}/gpu_trace.csv", ["Start", "Duration", "Name"])
work = []
for r in rows:
    try:
        start = float(r[gkey["Start"]]) * gunit["Start"]
        end = start + float(r[gkey["Duration"]]) * gunit["Duration"]
    except ValueError:
        continue
    name = r[gkey["Name"]]
    work.append((start, end, name, not name.startswith("[CUDA")))
work.sort()
if not windows:
    sys.exit("gpu_idle_gaps: no conveyor_step NVTX ranges in the profile")


def union(intervals, lo, hi):
    """Merged [start, end) intervals clipped to [lo, hi]."""
    merged = []
    for s, e in intervals:
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


try:
    gpu = json.load(open(f"{out}/benchmark.json"))["context"].get("gpu", "?")
    precision = json.load(open(f"{out}/benchmark.json"))["context"].get("precision", "?")
except (OSError, ValueError, KeyError):
    gpu, precision = "?", "?"

print(f"{'step':>4} {'window ms':>10} {'kernels':>8} {'kernel ms':>10} {'idle %':>7} "
      f"{'lead ms':>8} {'between ms':>11} {'tail ms':>8} {'no-GPU-work %':>14}")
summary, gaps = [], []
for i, (lo, hi) in enumerate(windows, 1):
    inside = [w for w in work if w[1] > lo and w[0] < hi]
    kernels = [(s, e) for s, e, _, k in inside if k]
    busy = union(kernels, lo, hi)
    any_work = union([(s, e) for s, e, _, _ in inside], lo, hi)
    window = hi - lo
    busy_ns = sum(e - s for s, e in busy)
    idle = window - busy_ns
    lead = (busy[0][0] - lo) if busy else window
    tail = (hi - busy[-1][1]) if busy else 0.0
    between = idle - lead - tail
    no_work = window - sum(e - s for s, e in any_work)
    # A merged block ends where one of its kernels ends and starts where
    # one starts: name each gap by those two kernels.
    ending = {e: n for s, e, n, k in inside if k}
    starting = {s: n for s, e, n, k in reversed(inside) if k}
    for a, b in zip(busy, busy[1:]):
        gaps.append((b[0] - a[1], i, ending.get(a[1], "?"), starting.get(b[0], "?")))
    summary.append({"step": i, "window_ms": window / 1e6, "kernels": len(kernels),
                    "kernel_ms": busy_ns / 1e6, "idle_fraction": idle / window,
                    "lead_ms": lead / 1e6, "between_ms": between / 1e6, "tail_ms": tail / 1e6,
                    "no_gpu_work_fraction": no_work / window})
    print(f"{i:>4} {window / 1e6:>10.2f} {len(kernels):>8} {busy_ns / 1e6:>10.2f} "
          f"{100 * idle / window:>7.2f} {lead / 1e6:>8.2f} {between / 1e6:>11.2f} "
          f"{tail / 1e6:>8.2f} {100 * no_work / window:>14.2f}")

mean_idle = sum(s["idle_fraction"] for s in summary) / len(summary)
print()
print("largest gaps between kernels:")
for gap, step, before, after in sorted(gaps, reverse=True)[:5]:
    print(f"  {gap / 1e3:9.1f} us in step {step}: after {before[:60]} / before {after[:60]}")
ok = mean_idle < 0.05
print()
print(f"mean idle (no kernel running): {100 * mean_idle:.2f}% of the step   target < 5%   "
      f"{'ok' if ok else 'OVER TARGET'}")
print(f"(GPU: {gpu}; precision {precision}; {len(summary)} profiled steps; idle = lead + between "
      f"+ tail; no-GPU-work also counts copies and memsets as work)")
if json_path:
    with open(json_path, "w") as f:
        json.dump({"gpu": gpu, "precision": precision, "mean_idle_fraction": mean_idle,
                   "steps": summary}, f)
sys.exit(0 if ok else 1)
PY
