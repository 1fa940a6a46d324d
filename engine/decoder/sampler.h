// Token sampling: greedy (argmax, lowest id on ties) or seeded temperature / top-k / top-p.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace hg {

struct SamplerOptions {
  bool greedy = true;
  float temperature = 1.0f;
  int top_k = 0;       // 0: no limit
  float top_p = 1.0f;  // 1: no nucleus cut
  uint64_t seed = 0;
};

class Sampler {
 public:
  Sampler(const SamplerOptions& o, uint64_t stream);  // one stream per sequence
  int32_t sample(std::span<const float> logits);

 private:
  SamplerOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// The first index of the largest value (lowest id on ties). NaNs never win; 0 when the span is
// empty or all NaN.
int32_t argmax(std::span<const float> logits);

}  // namespace hg
