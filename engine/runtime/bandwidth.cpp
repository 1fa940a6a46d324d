// Read-bandwidth references: one pass, a cycling probe, paired medians.
#include "engine/runtime/bandwidth.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>

#include "engine/backend/cpu/kernels.h"
#include "engine/core/cpu_features.h"
#include "engine/core/thread_pool.h"

namespace hg {

namespace {
// GB/s of `bytes` read by partial(b, e) over ranges of [0, n) in whole steps of `step` elements,
// taken by the threads as they come free (parallel_ranges, at least `grain` steps each: the split
// the decode GEMV takes); the partial sums are kept so that the reads are not optimised away.
template <class F>
double timed_ranges_gbs(int64_t n, int64_t step, int64_t grain, double bytes, F&& partial) {
  std::atomic<double> total{0};
  const auto t0 = std::chrono::steady_clock::now();
  parallel_ranges((n + step - 1) / step, grain, [&](int64_t b, int64_t e) {
    total.fetch_add(double(partial(b * step, std::min(n, e * step))), std::memory_order_relaxed);
  });
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile double sink = total.load();
  (void)sink;
  return bytes / dt / 1e9;
}
}  // namespace

double read_pass_gbs(const float* p, int64_t n, ReadPass how) {
  // Ranges of whole 64-byte lines, at least 64 KiB each.
  return timed_ranges_gbs(n, 16, 1024, double(n) * 4, [&](int64_t b, int64_t e) {
    return how == ReadPass::kOneStream ? cpu::sum_one_stream(p + b, e - b) : cpu::sum(p + b, e - b);
  });
}

double rows_read_pass_gbs(const float* src, int64_t row_floats, const int32_t* idx, int64_t n) {
  return timed_ranges_gbs(n, 1, 16, double(n) * double(row_floats) * 4, [&](int64_t b, int64_t e) {
    return cpu::sum_rows(src, row_floats, row_floats, idx + b, e - b);
  });
}

namespace {
int64_t probe_bytes(int64_t asked) {
  if (asked > 0) return std::max<int64_t>(asked, 1 << 20);
  return std::max<int64_t>(int64_t(512) << 20, 3 * last_level_cache_bytes());
}
}  // namespace

ReadProbe::ReadProbe(int64_t buffer_bytes) : buf_(size_t(probe_bytes(buffer_bytes) / 64 * 64)) {
  n_ = int64_t(buf_.bytes() / 4);
  float* p = static_cast<float*>(buf_.data());
  parallel_chunks(n_, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, 1.0f); });  // first touch by the pool
}

double ReadProbe::pass_gbs(int64_t bytes, ReadPass how) {
  const int64_t n = std::clamp<int64_t>(bytes / 4, 16384, n_) / 16 * 16;
  if (pos_ + n > n_) pos_ = 0;
  const double g = read_pass_gbs(static_cast<const float*>(buf_.data()) + pos_, n, how);
  pos_ += n;
  return g;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + int64_t(m), v.end());
  if (v.size() % 2) return v[m];
  return (v[m] + *std::max_element(v.begin(), v.begin() + int64_t(m))) / 2;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double m = 0;
  for (double x : v) m += x;
  return m / double(v.size());
}

double sample_sd(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / double(v.size() - 1));
}

std::vector<double> PairedRatio::ratios() const {
  std::vector<double> r;
  for (size_t i = 0; i < kernel.size(); ++i)
    if (ref[i] > 0) r.push_back(kernel[i] / ref[i]);
  return r;
}

}  // namespace hg
