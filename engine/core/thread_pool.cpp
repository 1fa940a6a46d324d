// OpenMP-backed worker pool.
#include "engine/core/thread_pool.h"

#include <numa.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

namespace hg {

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }
int num_threads() { return omp_get_max_threads(); }
void set_num_threads(int n) { omp_set_num_threads(std::max(1, n)); }

int numa_nodes_bound() {
  static const int nodes = [] {
    if (std::getenv("OMP_PROC_BIND") || std::getenv("OMP_PLACES") || numa_available() < 0) return 1;
    return std::max(1, numa_num_configured_nodes());
  }();
  return nodes;
}

namespace {
// The team size the pool's threads were last bound for (0: never).
std::atomic<int> g_bound_team{0};

// Thread t of a team of T runs on node t·nodes/T, so that parallel_chunks' chunk t (the rows
// convert_weight first-touches and the decode GEMV reads) stays on one node.
void bind_team_to_nodes() {
  const int nodes = numa_nodes_bound();
  if (nodes <= 1 || omp_in_parallel()) return;  // a nested call binds nothing (its team is one thread)
  const int team = omp_get_max_threads();
  if (g_bound_team.load(std::memory_order_acquire) == team) return;
#pragma omp parallel num_threads(team)
  numa_run_on_node(omp_get_thread_num() * nodes / team);  // affinity only: failure leaves it unbound
  g_bound_team.store(team, std::memory_order_release);
}
}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  bind_team_to_nodes();
  if (n <= 1 || omp_get_max_threads() == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

void parallel_chunks(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  bind_team_to_nodes();
  const int64_t nt = std::min<int64_t>(omp_get_max_threads(), n);
  if (nt <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
#pragma omp parallel for schedule(static, 1) num_threads(nt)
  for (int64_t c = 0; c < nt; ++c) {
    const int64_t b = n * c / nt, e = n * (c + 1) / nt;
    if (b < e) fn(b, e);
  }
}

void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (numa_nodes_bound() > 1) return parallel_chunks(n, fn);
  grain = std::max<int64_t>(grain, 1);
  const int64_t nt = std::min<int64_t>(omp_get_max_threads(), (n + grain - 1) / grain);
  if (nt <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(nt)
  for (;;) {
    int64_t b = next.load(std::memory_order_relaxed), e = n;
    do {
      if (b >= n) break;
      e = std::min(n, b + std::max(grain, (n - b) / (nt + 1)));
    } while (!next.compare_exchange_weak(b, e, std::memory_order_relaxed));
    if (b >= n) break;
    fn(b, e);
  }
}

}  // namespace hg
