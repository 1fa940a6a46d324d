// Read-bandwidth references: one pass, a cycling probe, paired medians.
#include "engine/runtime/bandwidth.h"

#include <algorithm>
#include <chrono>

#include "engine/backend/cpu/kernels.h"
#include "engine/core/thread_pool.h"

namespace hg {

double read_pass_gbs(const float* p, int64_t n) {
  float part[64] = {};
  const auto t0 = std::chrono::steady_clock::now();
  parallel_chunks(n, [&](int64_t b, int64_t e) { part[b * 64 / n] = cpu::sum(p + b, e - b); });
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float sink = 0;
  for (float v : part) sink = sink + v;
  return double(n) * 4 / dt / 1e9;
}

ReadProbe::ReadProbe(int64_t buffer_bytes) : buf_(size_t(std::max<int64_t>(buffer_bytes, 1 << 20) / 64 * 64)) {
  n_ = int64_t(buf_.bytes() / 4);
  float* p = static_cast<float*>(buf_.data());
  parallel_chunks(n_, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, 1.0f); });  // first touch by the pool
}

double ReadProbe::pass_gbs(int64_t bytes) {
  const int64_t n = std::clamp<int64_t>(bytes / 4, 16384, n_) / 16 * 16;
  if (pos_ + n > n_) pos_ = 0;
  const double g = read_pass_gbs(static_cast<const float*>(buf_.data()) + pos_, n);
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

std::vector<double> PairedRatio::ratios() const {
  std::vector<double> r;
  for (size_t i = 0; i < kernel.size(); ++i)
    if (ref[i] > 0) r.push_back(kernel[i] / ref[i]);
  return r;
}

}  // namespace hg
