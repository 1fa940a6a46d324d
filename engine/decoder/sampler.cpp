// Sampling.
#include "engine/decoder/sampler.h"

#include <algorithm>
#include <cmath>

namespace hg {

// Two passes that vectorise: the largest value, then the first index holding it. The one-pass form
// (compare with the best so far, then reload it) is a dependency chain through every element.
int32_t argmax(std::span<const float> logits) {
  constexpr size_t W = 16;  // running maxima side by side: no chain through one compare
  const float* x = logits.data();
  const size_t n = logits.size();
  float lane[W];
  std::fill(lane, lane + W, -INFINITY);
  size_t i = 0;
  for (; i + W <= n; i += W)
    for (size_t l = 0; l < W; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];  // NaN never wins
  float m = -INFINITY;
  for (size_t l = 0; l < W; ++l) m = lane[l] > m ? lane[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (i = 0; i + W <= n; i += W) {
    bool hit = false;
    for (size_t l = 0; l < W; ++l) hit |= x[i + l] == m;
    if (hit) break;
  }
  for (; i < n; ++i)
    if (x[i] == m) return int32_t(i);
  return 0;  // empty, or nothing but NaN
}

Sampler::Sampler(const SamplerOptions& o, uint64_t stream) : o_(o), rng_(o.seed * 0x9e3779b97f4a7c15ull + stream) {}

int32_t Sampler::sample(std::span<const float> logits) {
  if (o_.greedy || o_.temperature <= 0.0f) return argmax(logits);
  cand_.clear();
  for (size_t i = 0; i < logits.size(); ++i) cand_.emplace_back(logits[i] / o_.temperature, int32_t(i));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t k = cand_.size();
  if (o_.top_k > 0 && size_t(o_.top_k) < k) {
    k = size_t(o_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + std::ptrdiff_t(k), cand_.end(), by_logit);
    cand_.resize(k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  const float mx = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) sum += (c.first = std::exp(c.first - mx));
  if (o_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < cand_.size()) {
      acc += cand_[keep].first / sum;
      ++keep;
      if (acc >= o_.top_p) break;
    }
    cand_.resize(keep);
    sum = 0;
    for (auto& c : cand_) sum += c.first;
  }
  std::uniform_real_distribution<double> u(0.0, sum);
  double r = u(rng_);
  for (auto& c : cand_) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return cand_.back().second;
}

}  // namespace hg
