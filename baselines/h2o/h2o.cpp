// `h2o` — heavy hitters + recent window with decode-time eviction (H2O's "real drop" path, made
// correct per sequence: the authors' code sums scores over the batch, FMInference/H2O#14).
// Budgets: heavy = heavy_ratio·n, recent = recent_ratio·n of the current context n (the prompt at the
// first decode step, as the authors' real-drop path fixes them; n grows by one per step after it,
// as their accuracy masks do), or fixed token counts (heavy_tokens, recent_tokens). Prefill
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
      : EvictingStrategy(ctx, "h2o", p), heavy_ratio_(p.get_float("heavy_ratio")), recent_ratio_(p.get_float("recent_ratio")),
        heavy_tokens_(int32_t(p.get_int("heavy_tokens"))), recent_tokens_(int32_t(p.get_int("recent_tokens"))) {
    // kv_ratio: the whole budget as one fraction, split evenly as the authors' defaults split it.
    if (const double kv = p.get_float("kv_ratio"); kv > 0) heavy_ratio_ = recent_ratio_ = kv / 2, whole_ratio_ = kv;
    if (shared_budget() > 0)
      heavy_ratio_ = recent_ratio_ = shared_budget() / 2, heavy_tokens_ = recent_tokens_ = 0, whole_ratio_ = shared_budget();
    if (p.get_float("kv_ratio") < 0 || p.get_float("kv_ratio") > 1) input_error("strategy h2o: kv_ratio must be in [0, 1]");
    if (heavy_ratio_ < 0 || recent_ratio_ < 0 || heavy_ratio_ + recent_ratio_ <= 0)
      input_error("strategy h2o: heavy_ratio and recent_ratio must be >= 0 and not both 0");
    if (heavy_tokens_ < 0 || recent_tokens_ < 0) input_error("strategy h2o: heavy_tokens and recent_tokens must be >= 0");
  }
  std::string_view name() const override { return "h2o"; }
  // A whole budget (kv_ratio, budget) keeps ⌊ratio·n⌋ tokens exactly, the recent window its larger half (at
  // least one); the two ratios otherwise keep ⌊heavy_ratio·n⌋ + ⌊recent_ratio·n⌋, as the authors' code.
  int32_t whole(int32_t n) const { return int32_t(std::floor(whole_ratio_ * n + 1e-9)); }
  int32_t recent(int32_t n) const {
    if (recent_tokens_ > 0) return recent_tokens_;
    if (whole_ratio_ > 0) return std::max(1, whole(n) - whole(n) / 2);
    return std::max(1, int32_t(std::floor(recent_ratio_ * n)));
  }
  int32_t heavy(int32_t n) const {
    if (heavy_tokens_ > 0) return heavy_tokens_;
    if (whole_ratio_ > 0 && recent_tokens_ == 0) return whole(n) / 2;
    return int32_t(std::floor(heavy_ratio_ * n));
  }
  int32_t budget(int, int32_t n) const override { return heavy(n) + recent(n); }

 protected:
  int taps() const override { return kProbs; }
  int32_t recent_window(int seq) const override { return recent(context(seq)); }

 private:
  double heavy_ratio_, recent_ratio_;
  double whole_ratio_ = 0;  // kv_ratio or the shared budget: the whole budget as one fraction
  int32_t heavy_tokens_, recent_tokens_;
};

StrategyInfo h2o_info() {
  return {"h2o", "heavy hitters (accumulated attention) + recent window, decode-time eviction (H2O)",
          {{"heavy_ratio", ParamSpec::Type::kFloat, "0.1", "ratio", "heavy-hitter budget, fraction of the current context", {}, 0, 1},
           {"recent_ratio", ParamSpec::Type::kFloat, "0.1", "ratio", "recent-window budget, fraction of the current context", {}, 0, 1},
           {"kv_ratio", ParamSpec::Type::kFloat, "0", "ratio",
            "whole budget as a fraction of the current context, half heavy and half recent (0: the two ratios)", {}, 0, 1},
           {"heavy_tokens", ParamSpec::Type::kInt, "0", "tokens", "heavy-hitter budget in tokens (0: heavy_ratio)", {}, 0, kNoMax},
           {"recent_tokens", ParamSpec::Type::kInt, "0", "tokens", "recent-window budget in tokens (0: recent_ratio)", {}, 0, kNoMax},
           kv_home_param(), overlap_param(), budget_basis_param()},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<H2o>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/true, /*native_16bit_kv=*/true};
}

}  // namespace hg
