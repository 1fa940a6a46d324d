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
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "baselines/keyformer/keyformer.h"

#include "baselines/eviction.h"
#include "engine/core/cpu_features.h"

namespace hg {

namespace {

// The noise's hash and logarithm, written once for a scalar and once for 8 lanes of AVX-512 with
// the same operations in the same order, so that both give the same bits (keyformer_gumbel is the
// scalar; tests check the two against each other and the logarithm against std::log).
constexpr uint64_t kMixA = 0x9e3779b97f4a7c15ull, kMixB = 0xbf58476d1ce4e5b9ull,
                   kMixC = 0x94d049bb133111ebull;
constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;  // hi·e exact
constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;
// atanh series: log m = 2s + 2s·w·(1/3 + w/5 + … + w⁹/21), w = s², |s| ≤ 0.2; the first term left
// out (w¹⁰/23) is below 2^-58 of the sum.
constexpr double kAtanh[10] = {1.0 / 3,  1.0 / 5,  1.0 / 7,  1.0 / 9,  1.0 / 11,
                               1.0 / 13, 1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21};

// One stream per (seed, layer, seq, query row, head): each field mixed in by a multiply-xorshift
// round, so no two tuples share a stream for any field sizes.
uint64_t noise_base(uint64_t seed, int layer, int seq, int row, int head) {
  uint64_t x = seed * kMixA;
  for (uint64_t f : {uint64_t(uint32_t(layer)), uint64_t(uint32_t(seq)), uint64_t(uint32_t(row)), uint64_t(uint32_t(head))}) {
    x = (x ^ f) * kMixB;
    x ^= x >> 29;
  }
  return x;
}

// u in (0, 1) from (base, pos): 53 bits of a splitmix-style hash.
double noise_u(uint64_t base, int32_t pos) {
  uint64_t x = base ^ uint64_t(uint32_t(pos)) * kMixB;
  x ^= x >> 31;
  x *= kMixC;
  x ^= x >> 29;
  x *= kMixB;
  x ^= x >> 32;
  return (double(x >> 11) + 0.5) * kTwoPowMinus53;
}

// log x for a positive normal x: x = m · 2^e with m in [0.75, 1.5), s = (m − 1)/(m + 1).
double noise_log(double x) {
  int ex = 0;
  const double fr = std::frexp(x, &ex);  // [0.5, 1)
  const double m = fr < 0.75 ? 2.0 * fr : fr;
  const double e = double(fr < 0.75 ? ex - 1 : ex);
  const double s = (m - 1.0) / (m + 1.0), w = s * s;
  double p = kAtanh[9];
  for (int i = 8; i >= 0; --i) p = std::fma(p, w, kAtanh[i]);
  const double s2 = s + s;
  return std::fma(e, kLn2Hi, s2) + std::fma(e, kLn2Lo, s2 * w * p);
}

#define HG_NOISE_AVX512 __attribute__((target("avx512f,avx512dq")))
HG_NOISE_AVX512 __m512d noise_u8(__m512i base, __m256i pos) {
  __m512i x = _mm512_xor_si512(
      base, _mm512_mullo_epi64(_mm512_cvtepu32_epi64(pos), _mm512_set1_epi64(int64_t(kMixB))));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(int64_t(kMixC)));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 29));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(int64_t(kMixB)));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
  const __m512d d = _mm512_cvtepu64_pd(_mm512_srli_epi64(x, 11));
  return _mm512_mul_pd(_mm512_add_pd(d, _mm512_set1_pd(0.5)), _mm512_set1_pd(kTwoPowMinus53));
}

HG_NOISE_AVX512 __m512d noise_log8(__m512d x) {
  const __m512d m = _mm512_getmant_pd(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_src);
  // getexp is floor(log2 x); a mantissa folded below 1 belongs to the next exponent (frexp's e).
  const __mmask8 below = _mm512_cmp_pd_mask(m, _mm512_set1_pd(1.0), _CMP_LT_OQ);
  const __m512d e = _mm512_mask_add_pd(_mm512_getexp_pd(x), below, _mm512_getexp_pd(x), _mm512_set1_pd(1.0));
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d s = _mm512_div_pd(_mm512_sub_pd(m, one), _mm512_add_pd(m, one)), w = _mm512_mul_pd(s, s);
  __m512d p = _mm512_set1_pd(kAtanh[9]);
  for (int i = 8; i >= 0; --i) p = _mm512_fmadd_pd(p, w, _mm512_set1_pd(kAtanh[i]));
  const __m512d s2 = _mm512_add_pd(s, s);
  return _mm512_add_pd(_mm512_fmadd_pd(e, _mm512_set1_pd(kLn2Hi), s2),
                       _mm512_fmadd_pd(e, _mm512_set1_pd(kLn2Lo), _mm512_mul_pd(_mm512_mul_pd(s2, w), p)));
}
// out[i] for i < n rounded down to 8; returns how many it wrote.
HG_NOISE_AVX512 int32_t gumbel_avx512(uint64_t base, const int32_t* pos, int32_t n, double* out) {
  int32_t i = 0;
  const __m512i vb = _mm512_set1_epi64(int64_t(base));
  const __m512d neg = _mm512_set1_pd(-0.0);
  for (; i + 8 <= n; i += 8) {
    const __m512d u = noise_u8(vb, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + i)));
    const __m512d l1 = _mm512_xor_pd(noise_log8(u), neg);  // −log u > 0
    _mm512_storeu_pd(out + i, _mm512_xor_pd(noise_log8(l1), neg));
  }
  return i;
}

}  // namespace

double keyformer_log(double x) { return noise_log(x); }

double keyformer_gumbel(uint64_t seed, int layer, int seq, int row, int head, int32_t pos) {
  return -noise_log(-noise_log(noise_u(noise_base(seed, layer, seq, row, head), pos)));
}

void keyformer_gumbel_n(uint64_t seed, int layer, int seq, int row, int head, const int32_t* pos, int32_t n,
                        double* out) {
  const uint64_t base = noise_base(seed, layer, seq, row, head);
  // The same bits either way (the test compares them); AVX-512 where the CPU kernels use it.
  int32_t i = active_cpu_isa() >= CpuIsa::kAvx512 ? gumbel_avx512(base, pos, n, out) : 0;
  for (; i < n; ++i) out[i] = -noise_log(-noise_log(noise_u(base, pos[i])));
}

void keyformer_add_scores(Backend& host, uint64_t seed, int layer, int seq, int row, int head, const int32_t* pos,
                          const float* logits, int32_t n, double tau, float* z, double* noise, double* acc) {
  keyformer_gumbel_n(seed, layer, seq, row, head, pos, n, noise);
  for (int32_t s = 0; s < n; ++s) z[s] = float((double(logits[s]) + noise[s]) / tau);
  // softmax(z), vectorised in F32 (relative error ~1e-7), accumulated in F64.
  const float mx = n > 0 ? host.max_value(z, n) : 0.0f;
  const double inv = 1.0 / double(host.exp_shift_sum(z, n, mx));
  for (int32_t s = 0; s < n; ++s) acc[s] += double(z[s]) * inv;
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
  void accumulate(int layer, int seq, int g, const float* logits, const float*, int64_t ld, int32_t n,
                  int32_t row_pos) override {
    auto& sc = scores(layer, seq, g);
    const int step = std::max(0, row_pos - prompt_len(seq) + 1);  // 0 for prompt rows
    const double t = tau(seq, step);
    const int32_t* pos = store().positions(layer, seq, g);
    z_.resize(size_t(n));
    gn_.resize(size_t(n));
    // Independent noise per (query row, key), prompt rows included, as the authors' decode path
    // draws it over the prompt's [query, key] scores.
    for (int h = 0; h < group(); ++h)
      keyformer_add_scores(host_backend(), seed_, layer, /*stream=*/0, row_pos, g * group() + h, pos, logits + h * ld, n, t,
                           z_.data(), gn_.data(), sc.data());
  }
  void victims(int layer, int seq, int g, int32_t count, std::vector<int32_t>& slots) override {
    lowest_non_recent(layer, seq, g, recent(context(seq)), count, slots);
  }

 private:
  double kv_ratio_, recent_ratio_, tau_init_, tau_end_;
  uint64_t seed_;
  int32_t kv_tokens_;
  std::vector<float> z_;    // accumulate()'s scratch
  std::vector<double> gn_;  // a row's noise, by slot
};

StrategyInfo keyformer_info() {
  return {"keyformer", "key tokens by accumulated Gumbel-softmax score + recent window (Keyformer)",
          {{"kv_ratio", ParamSpec::Type::kFloat, "0.6", "ratio", "KV budget, fraction of the current context", {}, 0, 1},
           {"kv_tokens", ParamSpec::Type::kInt, "0", "tokens", "KV budget in tokens (0: kv_ratio)", {}, 0, kNoMax},
           {"recent_ratio", ParamSpec::Type::kFloat, "0.3", "ratio", "recent window, fraction of the budget", {}, 0, 1},
           {"tau_init", ParamSpec::Type::kFloat, "1.0", "", "Gumbel-softmax temperature at the prompt", {}},
           {"tau_end", ParamSpec::Type::kFloat, "2.0", "", "temperature at the last generated token", {}},
           {"seed", ParamSpec::Type::kInt, "0", "", "Gumbel noise seed", {}},
           kv_home_param(), overlap_param()},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<Keyformer>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/true, /*native_16bit_kv=*/true};
}

}  // namespace hg
