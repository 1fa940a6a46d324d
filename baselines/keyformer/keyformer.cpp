// `keyformer` — like H2O, but a token's score is a Gumbel-noise softmax of the logits,
// softmax((x + g)/τ) with g ~ Gumbel(0, 1) from a seeded generator, accumulated per head (summed
// over a KV group's query heads); τ rises linearly from tau_init to tau_end over the generation
// (τ = tau_init + step·(tau_end − tau_init)/n_new, step 0 at the prompt). Budget: kv_ratio of the
// prompt, of which recent_ratio is a recent window (Keyformer's split: recent = kv·recent_ratio)
// and the rest key tokens by score. Attention itself uses the normal softmax. Follows the
// authors' decode path (attention.py); their lm-eval path cannot accumulate (see BASELINES.md).
// The noise of (layer, seq, step, head, position) is a pure function of the seed (keyformer_gumbel).
#include <algorithm>
#include <cmath>

#include "baselines/eviction.h"
#include "engine/backend/cpu/kernels.h"

namespace hg {

// g ~ Gumbel(0, 1) for one (seed, layer, seq, step, head, position): −log(−log u).
double keyformer_gumbel(uint64_t seed, int layer, int seq, int step, int head, int32_t pos) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t(layer) << 48) ^ (uint64_t(seq) << 36) ^
               (uint64_t(step) << 20) ^ (uint64_t(head) << 12) ^ uint64_t(uint32_t(pos)) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  const double u = (double(x >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
  return -std::log(-std::log(u));
}

class Keyformer : public EvictingStrategy {
 public:
  Keyformer(const StrategyContext& ctx, const StrategyParams& p)
      : EvictingStrategy(ctx, "keyformer"), kv_ratio_(p.get_float("kv_ratio")), recent_ratio_(p.get_float("recent_ratio")),
        tau_init_(p.get_float("tau_init")), tau_end_(p.get_float("tau_end")), seed_(uint64_t(p.get_int("seed"))) {
    if (!(kv_ratio_ > 0) || recent_ratio_ < 0 || recent_ratio_ > 1 || !(tau_init_ > 0) || !(tau_end_ > 0))
      input_error("strategy keyformer: need kv_ratio > 0, 0 <= recent_ratio <= 1, tau_init and tau_end > 0");
  }
  std::string_view name() const override { return "keyformer"; }
  int32_t budget(int seq) const override { return std::max(2, int32_t(std::lround(kv_ratio_ * prompt_len(seq)))); }
  int32_t recent(int seq) const {
    return std::clamp(int32_t(std::lround(recent_ratio_ * budget(seq))), 1, budget(seq) - 1);
  }
  double tau(int seq, int step) const {
    return tau_init_ + double(step) * (tau_end_ - tau_init_) / double(std::max(1, n_new(seq)));
  }

 protected:
  int taps() const override { return kLogits; }
  void accumulate(int layer, int seq, int g, const float* logits, const float*, int64_t ld, int32_t n,
                  int32_t row_pos) override {
    auto& sc = scores(layer, seq, g);
    const int step = std::max(0, row_pos - prompt_len(seq) + 1);  // 0 for prompt rows
    const double t = tau(seq, step);
    const int32_t* pos = store().positions(layer, seq, g);
    z_.resize(size_t(n));
    float* z = z_.data();
    for (int h = 0; h < group(); ++h) {
      const int head = g * group() + h;
      if (step == 0) {
        // A prompt row: the noise of every position it sees, shared with the chunk's other rows.
        const double* gn = prompt_noise(layer, seq, head, row_pos);
        for (int32_t s = 0; s < n; ++s) z[s] = float((double(logits[h * ld + s]) + gn[pos[s]]) / t);
      } else {
        for (int32_t s = 0; s < n; ++s)
          z[s] = float(
              (double(logits[h * ld + s]) + keyformer_gumbel(seed_, layer, seq, step, head, pos[s])) / t);
      }
      // softmax(z), vectorised in F32 (relative error ~1e-7), accumulated in F64.
      const float mx = n > 0 ? *std::max_element(z, z + n) : 0.0f;
      const double inv = 1.0 / double(cpu::exp_shift_sum(z, n, mx));
      for (int32_t s = 0; s < n; ++s) sc[size_t(s)] += double(z[s]) * inv;
    }
  }
  void victims(int layer, int seq, int g, int32_t count, std::vector<int32_t>& slots) override {
    lowest_non_recent(layer, seq, g, recent(seq), count, slots);
  }

 private:
  // keyformer_gumbel(seed, layer, seq, 0, head, p) for p ≤ upto. Prompt rows (step 0) all draw the
  // same noise for a position, so one prefill chunk's rows share these values: per layer and
  // chunk they cost one draw per head and position instead of one per row, head and position.
  const double* prompt_noise(int layer, int seq, int head, int32_t upto) {
    if (layer != noise_layer_ || seq != noise_seq_) {
      noise_layer_ = layer, noise_seq_ = seq;
      noise_filled_.assign(size_t(shape().H), 0);
      noise_.resize(size_t(shape().H));
    }
    auto& v = noise_[size_t(head)];
    if (v.size() <= size_t(upto)) v.resize(size_t(upto) + 1);
    for (int32_t& p = noise_filled_[size_t(head)]; p <= upto; ++p)
      v[size_t(p)] = keyformer_gumbel(seed_, layer, seq, 0, head, p);
    return v.data();
  }

  double kv_ratio_, recent_ratio_, tau_init_, tau_end_;
  uint64_t seed_;
  int noise_layer_ = -1, noise_seq_ = -1;
  std::vector<int32_t> noise_filled_;       // per head: positions [0, filled) drawn
  std::vector<std::vector<double>> noise_;  // per head, by position
  std::vector<float> z_;                    // accumulate()'s scratch
};

StrategyInfo keyformer_info() {
  return {"keyformer", "key tokens by accumulated Gumbel-softmax score + recent window (Keyformer)",
          {{"kv_ratio", ParamSpec::Type::kFloat, "0.6", "ratio", "KV budget, fraction of the prompt", {}},
           {"recent_ratio", ParamSpec::Type::kFloat, "0.3", "ratio", "recent window, fraction of the budget", {}},
           {"tau_init", ParamSpec::Type::kFloat, "1.0", "", "Gumbel-softmax temperature at the prompt", {}},
           {"tau_end", ParamSpec::Type::kFloat, "2.0", "", "temperature at the last generated token", {}},
           {"seed", ParamSpec::Type::kInt, "0", "", "Gumbel noise seed", {}}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<Keyformer>(c, p); }};
}

}  // namespace hg
