// `keyformer` — like H2O, but a token's score is a Gumbel-noise softmax of the logits,
// softmax((x + g)/τ) with g ~ Gumbel(0, 1) from a seeded generator, accumulated per head (summed
// over a KV group's query heads); τ rises linearly from tau_init to tau_end over the generation
// (τ = tau_init + step·(tau_end − tau_init)/n_new, step 0 at the prompt). Budget: kv_ratio of the
// current context (or kv_tokens), of which recent_ratio is a recent window (Keyformer's split: recent = kv·recent_ratio)
// and the rest key tokens by score. Attention itself uses the normal softmax. Follows the
// authors' decode path (attention.py); their lm-eval path cannot accumulate (see BASELINES.md).
// The noise of (layer, query row, head, key position) is a pure function of the seed
// (keyformer_gumbel): every query row, prompt rows included, has its own draw per key. It does not
// depend on the sequence's index in the batch, so a sequence scores the same alone, batched or forked.
#include <algorithm>
#include <cmath>

#include "baselines/keyformer/keyformer.h"

#include "baselines/eviction.h"
#include "engine/backend/gumbel.h"

namespace hg {

double keyformer_gumbel(uint64_t seed, int layer, int seq, int row, int head, int32_t pos) {
  return gumbel::draw(gumbel::stream(seed, layer, seq, row, head), pos);
}

void keyformer_gumbel_n(PolicyOps& host, uint64_t seed, int layer, int seq, int row, int head, const int32_t* pos,
                        int32_t n, double* out) {
  host.gumbel_noise(gumbel::stream(seed, layer, seq, row, head), pos, n, out);
}

class Keyformer : public EvictingStrategy {
 public:
  Keyformer(const StrategyContext& ctx, const StrategyParams& p)
      : EvictingStrategy(ctx, "keyformer", p), kv_ratio_(p.get_float("kv_ratio")), recent_ratio_(p.get_float("recent_ratio")),
        tau_init_(p.get_float("tau_init")), tau_end_(p.get_float("tau_end")), seed_(uint64_t(p.get_int("seed"))),
        kv_tokens_(int32_t(p.get_int("kv_tokens"))) {
    if (kv_tokens_ < 0) input_error("strategy keyformer: kv_tokens must be >= 0");
    if (!(kv_ratio_ > 0) || recent_ratio_ < 0 || recent_ratio_ > 1 || !(tau_init_ > 0) || !(tau_end_ > 0))
      input_error("strategy keyformer: need kv_ratio > 0, 0 <= recent_ratio <= 1, tau_init and tau_end > 0");
    if (shared_budget() > 0) kv_ratio_ = shared_budget(), kv_tokens_ = 0;
  }
  std::string_view name() const override { return "keyformer"; }
  int32_t budget(int, int32_t n) const override {
    return kv_tokens_ > 0 ? std::max(2, kv_tokens_) : std::max(2, int32_t(std::lround(kv_ratio_ * n)));
  }
  int32_t recent(int32_t n) const {
    const int32_t b = budget(0, n);
    return std::clamp(int32_t(std::lround(recent_ratio_ * b)), 1, b - 1);
  }
  double tau(int seq, int step) const {
    return tau_init_ + double(step) * (tau_end_ - tau_init_) / double(std::max(1, n_new(seq)));
  }

 protected:
  int taps() const override { return kLogits; }
  double policy_elems_per_score() const override { return kKeyformerScoreElems; }
  // Independent noise per (query row, key), prompt rows included, as the authors' decode path
  // draws it over the prompt's [query, key] scores; stream 0 for every sequence.
  ScorePolicy score_policy() const override { return {PolicyOps::ScoreRule::kGumbelSoftmax, seed_}; }
  double score_tau(int seq, int32_t row_pos) const override {
    return tau(seq, std::max(0, row_pos - prompt_len(seq) + 1));  // step 0 for prompt rows
  }
  int32_t recent_window(int seq) const override { return recent(context(seq)); }

 private:
  double kv_ratio_, recent_ratio_, tau_init_, tau_end_;
  uint64_t seed_;
  int32_t kv_tokens_;
};

StrategyInfo keyformer_info() {
  return {"keyformer", "key tokens by accumulated Gumbel-softmax score + recent window (Keyformer)",
          {{"kv_ratio", ParamSpec::Type::kFloat, "0.6", "ratio", "KV budget, fraction of the current context", {}, 0, 1},
           {"kv_tokens", ParamSpec::Type::kInt, "0", "tokens", "KV budget in tokens (0: kv_ratio)", {}, 0, kNoMax},
           {"recent_ratio", ParamSpec::Type::kFloat, "0.3", "ratio", "recent window, fraction of the budget", {}, 0, 1},
           {"tau_init", ParamSpec::Type::kFloat, "1.0", "", "Gumbel-softmax temperature at the prompt", {}},
           {"tau_end", ParamSpec::Type::kFloat, "2.0", "", "temperature at the last generated token", {}},
           {"seed", ParamSpec::Type::kInt, "0", "", "Gumbel noise seed", {}},
           kv_home_param(), overlap_param(), budget_basis_param()},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<Keyformer>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/true, /*native_16bit_kv=*/true};
}

}  // namespace hg
