#!/usr/bin/env bash
# Where the GPT training step's time goes: samples step/gpt of
# bench/engine_benchmark with perf and sums the samples by kernel category
# (GEMM, attention, layernorm, GELU, ...), printed as a markdown table, the
# one in docs/performance.md.
#
#   bench/profile_gpt.sh [build-dir] [seconds]
#
# build-dir defaults to build-bench (a Release build); seconds (default 3)
# is the benchmark's --benchmark_min_time. Needs perf (Debian linux-perf);
# with kernel.perf_event_paranoid=2 it samples user and kernel time of this
# process only, which is all it needs. Set PROFILE_GPT_KEEP=1 to keep
# perf.data (its path is printed) for perf report.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
seconds=${2:-3}
bench="$build/bench/engine_benchmark"
if [[ ! -x $bench ]]; then
  echo "profile_gpt: $bench not found; build it first:" >&2
  echo "  cmake --build $build -j2 --target engine_benchmark" >&2
  exit 1
fi
command -v perf >/dev/null || { echo "profile_gpt: perf not installed" >&2; exit 1; }

work=$(mktemp -d)
if [[ ${PROFILE_GPT_KEEP:-0} != 1 ]]; then
  trap 'rm -rf "$work"' EXIT
fi
perf record -q -o "$work/perf.data" -F 2000 -- "$bench" \
  --benchmark_filter='^step/gpt' --benchmark_min_time="$seconds" \
  >"$work/bench.txt" 2>/dev/null
grep 'step/gpt' "$work/bench.txt" || true
perf report -i "$work/perf.data" --no-children --sort symbol --stdio \
  -F overhead,sym 2>/dev/null >"$work/report.txt"
[[ ${PROFILE_GPT_KEEP:-0} == 1 ]] && echo "perf data: $work/perf.data"

python3 - "$work/report.txt" <<'PY'
import re
import sys

# First match wins: order matters (GeluDerivative before a generic "exp").
CATEGORIES = [
    ("GEMM (OpenBLAS kernels, packing, C scaling)",
     r"sgemm|cblas_|gemm_|GemmStridedBatched|exec_blas|blas_thread|inner_thread"),
    ("BLAS/pool threads waiting (sched_yield, futex, scheduler)",
     r"sched_yield|__schedule|^schedule$|finish_task_switch|futex|pick_next|"
     r"do_syscall_64|entry_SYSCALL|syscall_exit|__x64_sys|switch_mm|"
     r"_raw_spin|rseq|update_curr|dequeue|enqueue"),
    ("GELU", r"Gelu|__erff|erff@plt|Tanh"),
    ("attention: softmax, split/merge heads", r"Softmax|PermuteQkv|PermuteMerge|SplitHeads|MergeHeads"),
    ("libm exp/expf (softmax, GELU backward, cross-entropy before)",
     r"__expf|__ieee754_exp|^exp@|^expf@|__exp1"),
    ("layernorm", r"LayerNorm"),
    ("embedding", r"Embedding"),
    ("cross-entropy", r"CrossEntropy"),
    ("optimizer (AdamW, grad norm)", r"AdamUpdate|SgdUpdate|SumSquares|Optimizer::|Scale"),
    ("elementwise: residual adds, bias add/sum, fills, copies",
     r"DoAdd|DoAxpy|AddRowBias|SumRows|Fill|DoCopy|memcpy|memmove|memset"),
    ("allocation and page faults",
     r"malloc|free|_int_|aligned_alloc|posix_memalign|mmap|munmap|page|"
     r"_mm_fault|mm_fault|^do_anonymous|unmap|tlb|memcg|lru|folio|zap_|"
     r"clear_page|alloc_pages|Buffer|CpuBackend::Empty|mas_"),
]

totals = {name: 0.0 for name, _ in CATEGORIES}
totals["other"] = 0.0
top_other = []
for line in open(sys.argv[1]):
    m = re.match(r"\s*([0-9.]+)%\s+\[[.k]\]\s+(.*?)\s*$", line)
    if not m:
        continue
    share = float(m.group(1))
    # Without a terminal perf pads the line with "-" columns; drop them.
    sym = re.sub(r"(\s+-)+\s*$", "", m.group(2)).strip()
    for name, pattern in CATEGORIES:
        if re.search(pattern, sym):
            totals[name] += share
            break
    else:
        totals["other"] += share
        top_other.append((share, sym))

# Spinning BLAS threads burn a core without holding up the step (much) and
# their share swings with the machine's load, so the last column leaves them
# out: each kernel's share of the time spent computing.
waiting = totals[CATEGORIES[1][0]]
busy = max(100.0 - waiting, 1e-9)
print("| category | share of samples | share of compute |")
print("| --- | ---: | ---: |")
for name, share in sorted(totals.items(), key=lambda kv: -kv[1]):
    compute = "" if name == CATEGORIES[1][0] else f"{100 * share / busy:.1f}%"
    print(f"| {name} | {share:.1f}% | {compute} |")
top_other.sort(reverse=True)
print()
print("largest 'other' symbols: " +
      ", ".join(f"{s[:60]} {p:.1f}%" for p, s in top_other[:5]))
PY
