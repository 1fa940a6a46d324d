// `h2o` — heavy hitters + recent window with decode-time eviction (H2O's "real drop" path, made
// correct per sequence: the authors' code sums scores over the batch, FMInference/H2O#14).
// Budgets are fixed from the prompt: heavy = heavy_ratio·P, recent = recent_ratio·P. Prefill
// accumulates causal attention over the prompt; the first decode step keeps the `recent` newest
// prompt tokens plus the highest-scoring others; each decode step adds its softmax probabilities
// to the per-head accumulator (summed over the query heads of a KV group for GQA) and evicts the
// lowest-score token outside the recent window. Evicted tokens never return.
#include <cmath>

#include "baselines/eviction.h"

namespace hg {

class H2o : public EvictingStrategy {
 public:
  H2o(const StrategyContext& ctx, const StrategyParams& p)
      : EvictingStrategy(ctx, "h2o"), heavy_ratio_(p.get_float("heavy_ratio")), recent_ratio_(p.get_float("recent_ratio")) {
    if (heavy_ratio_ < 0 || recent_ratio_ < 0 || heavy_ratio_ + recent_ratio_ <= 0)
      input_error("strategy h2o: heavy_ratio and recent_ratio must be >= 0 and not both 0");
  }
  std::string_view name() const override { return "h2o"; }
  int32_t heavy(int seq) const { return int32_t(std::floor(heavy_ratio_ * prompt_len(seq))); }
  int32_t recent(int seq) const { return std::max(1, int32_t(std::floor(recent_ratio_ * prompt_len(seq)))); }
  int32_t budget(int seq) const override { return heavy(seq) + recent(seq); }

 protected:
  int taps() const override { return kProbs; }
  void accumulate(int layer, int seq, int g, const float*, const float* probs, int64_t ld, int32_t n, int32_t) override {
    auto& sc = scores(layer, seq, g);
    for (int h = 0; h < group(); ++h)
      for (int32_t s = 0; s < n; ++s) sc[size_t(s)] += probs[h * ld + s];
  }
  void victims(int layer, int seq, int g, int32_t count, std::vector<int32_t>& slots) override {
    lowest_non_recent(layer, seq, g, recent(seq), count, slots);
  }

 private:
  double heavy_ratio_, recent_ratio_;
};

StrategyInfo h2o_info() {
  return {"h2o", "heavy hitters (accumulated attention) + recent window, decode-time eviction (H2O)",
          {{"heavy_ratio", ParamSpec::Type::kFloat, "0.1", "ratio", "heavy-hitter budget, fraction of the prompt", {}},
           {"recent_ratio", ParamSpec::Type::kFloat, "0.1", "ratio", "recent-window budget, fraction of the prompt", {}}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<H2o>(c, p); }};
}

}  // namespace hg
