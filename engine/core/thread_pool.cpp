// OpenMP-backed worker pool.
#include "engine/core/thread_pool.h"

#include <omp.h>

#include <algorithm>
#include <thread>

namespace hg {

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }
int num_threads() { return omp_get_max_threads(); }
void set_num_threads(int n) { omp_set_num_threads(std::max(1, n)); }

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 1 || omp_get_max_threads() == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

void parallel_chunks(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
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

}  // namespace hg
