// Loop helpers for the CPU kernels: split an index range across the OpenMP
// threads when there is enough work for that to pay, run it inline
// otherwise. Iterations must be independent. Thread-safe.
#ifndef CONVEYOR_ENGINE_CPU_PARALLEL_H_
#define CONVEYOR_ENGINE_CPU_PARALLEL_H_

#include <cstdint>

namespace conveyor::engine {

// Below this many element operations a loop runs on one thread: waking the
// pool costs a few microseconds, more than small loops take.
inline constexpr int64_t kParallelGrain = 1 << 15;

// body(i) for i in [0, n).
template <typename Body>
void ParallelFor(int64_t n, Body body) {
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// body(r) for r in [0, rows), where each row costs about `row_cost` element
// operations.
template <typename Body>
void ParallelForRows(int64_t rows, int64_t row_cost, Body body) {
#pragma omp parallel for schedule( \
    static) if (rows * row_cost >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) body(r);
}

}  // namespace conveyor::engine

#endif  // CONVEYOR_ENGINE_CPU_PARALLEL_H_
