// Loop helpers for the CPU kernels: split an index range across a small pool
// of threads when there is enough work for that to pay, run it inline
// otherwise. Iterations must be independent.
//
// Why not OpenMP: libgomp's idle threads spin (OMP_WAIT_POLICY=active by
// default, fixed when the library loads), and on a machine with few cores
// they steal the cores OpenBLAS's own threads need for the next GEMM: on the
// 2-core development machine the MLP example's steps took 4x longer. Our
// pool's idle workers block instead.
//
// Thread-safe: concurrent callers are fine; a caller that finds the pool busy
// runs its loop inline rather than waiting. An exception thrown by the loop
// body (std::bad_alloc) reaches the caller after every part has stopped.
#ifndef CONVEYOR_ENGINE_CPU_PARALLEL_H_
#define CONVEYOR_ENGINE_CPU_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace conveyor::engine {

// Below this many element operations a loop runs on one thread. Set high on
// purpose: OpenBLAS's threads spin for a while after each GEMM, so a worker of
// ours woken between GEMMs competes with them for the cores. Measured on the
// 2-core development machine (conveyorctl run --in-process, mean step): with
// a grain of 2^15 the MLP example took 16.7 ms and the transformer 30.8 ms;
// all loops serial, 10.7 and 21.0 ms. Only loops far longer than a GEMM's
// spin-down are worth splitting.
inline constexpr int64_t kParallelGrain = int64_t{1} << 21;

// How many threads the CPU kernels' pool splits a loop into, and OpenBLAS
// runs a GEMM on: SetCpuThreads's value, or by default the cores this
// process may run on (its affinity mask, so `taskset`, cgroup cpusets and
// --cpu-cores count, not the machine's core count).
int CpuThreads();

// Gives the CPU kernels and OpenBLAS `threads` threads (>= 1; 0 or less
// restores the default), process-wide: a worker's `--devices cpu:N`. Safe
// at any time from any thread; a loop already running keeps its split.
// Without a call, OpenBLAS keeps its own setting (OPENBLAS_NUM_THREADS, else
// its default, which also counts the affinity mask).
void SetCpuThreads(int threads);

// Runs chunk(begin, end) over a partition of [0, n) on up to CpuThreads()
// threads.
void ParallelChunks(int64_t n,
                    const std::function<void(int64_t, int64_t)>& chunk);

// body(i) for i in [0, n).
template <typename Body>
void ParallelFor(int64_t n, Body body) {
  if (n < kParallelGrain) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  ParallelChunks(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) body(i);
  });
}

// body(r) for r in [0, rows), where each row costs about `row_cost` element
// operations.
template <typename Body>
void ParallelForRows(int64_t rows, int64_t row_cost, Body body) {
  int64_t cost = 0;
  if (rows < 2 || (!__builtin_mul_overflow(rows, row_cost, &cost) &&
                   cost < kParallelGrain)) {
    for (int64_t r = 0; r < rows; ++r) body(r);
    return;
  }
  ParallelChunks(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) body(r);
  });
}

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_CPU_PARALLEL_H_
