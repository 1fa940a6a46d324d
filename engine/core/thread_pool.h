// The CPU worker pool: one process-wide OpenMP team, shared with oneDNN (which Debian builds on
// OpenMP) so that our kernels and its matmuls never oversubscribe the cores. Sized to the machine
// unless set_num_threads() is called. On a machine with several NUMA nodes the pool's threads are
// bound to nodes (thread t of T on node t·nodes/T) unless OMP_PROC_BIND or OMP_PLACES is set.
#pragma once
#include <cstdint>
#include <functional>

namespace hg {

int hardware_threads();
// The NUMA nodes the pool's threads are spread over: 1 on a one-node machine, or when OpenMP's own
// binding (OMP_PROC_BIND, OMP_PLACES) is in charge.
int numa_nodes_bound();
int num_threads();
void set_num_threads(int n);
// Runs fn(i) for i in [0, n) across the pool; blocks until all are done.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);
// Runs fn(begin, end) over contiguous chunks of [0, n), at most one chunk per thread.
void parallel_chunks(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
// Runs fn(begin, end) over contiguous ranges of [0, n) that the threads take as they come free:
// long ranges first, each the remaining work over the team plus one (at least `grain`), so a
// thread the machine slows does not hold the others at the join, in few calls. On several NUMA
// nodes it is parallel_chunks, whose chunk t stays on thread t's node.
void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace hg
