// The CPU worker pool: one process-wide OpenMP team, shared with oneDNN (which Debian builds on
// OpenMP) so that our kernels and its matmuls never oversubscribe the cores. Sized to the machine
// unless set_num_threads() is called.
#pragma once
#include <cstdint>
#include <functional>

namespace hg {

int hardware_threads();
int num_threads();
void set_num_threads(int n);
// Runs fn(i) for i in [0, n) across the pool; blocks until all are done.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);
// Runs fn(begin, end) over contiguous chunks of [0, n), at most one chunk per thread.
void parallel_chunks(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace hg
