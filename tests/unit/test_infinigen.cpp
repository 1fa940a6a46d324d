// InfiniGen: exactness with every column and token, calibration, the alpha rule.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "baselines/eviction.h"
#include "baselines/full/full.h"
#include "baselines/registry.h"
#include "engine/decoder/decoder.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "test_util.h"
#include "strategy_test_util.h"

namespace hg {
int32_t infinigen_fetch_count(Backend& host, const float* logits, int H, int64_t n, double alpha, double max_ratio);
namespace {

using namespace test;

// This strategy's cases in the suites every strategy passes (strategy_test_util.h).
const bool kCasesRegistered = register_strategy_cases(
    {"infinigen",
     {},
     // Every column and token fetched: exact.
     {{"synthetic:tiny-qwen2", "infinigen",
       {{"partial_ratio", "1"}, {"max_kv_ratio", "1"}, {"alpha", "1e9"}, {"full_layers", "1"}}}},
     {}});

TEST(InfiniGen, FullColumnsAndAllTokensMatchRef) {
  // partial_ratio 1: the skewed partial keys are the whole (rotated) keys, so q·k is unchanged;
  // alpha huge and max_kv_ratio 1: every token is fetched. Attention must equal the oracle.
  for (const char* spec : {"synthetic:tiny-qwen2", "models/stories260K/stories260K.gguf"}) {
    auto m = load_test_model(spec);
    if (!m) continue;
    const auto toks = token_stream(40, m->hp.n_vocab, 12);
    // calib_tokens 0: the whole prompt; 9: the skew is computed in the middle of the prompt's
    // chunk, and the partial keys of the rows after it come from the store and from append().
    for (const char* calib : {"0", "9"})
      expect_matches_oracle(*m, "infinigen",
                            {{"partial_ratio", "1"},
                             {"max_kv_ratio", "1"},
                             {"alpha", "1e9"},
                             {"full_layers", "1"},
                             {"calib_tokens", calib}},
                            toks, 25, 1e-3, std::string(spec) + " calib_tokens " + calib,
                            [&](Runtime&, KvStrategy& kv) {
                              EXPECT_EQ(kv.step_stats().at("fetched_tokens"), double(toks.size() - 1));
                            });
  }
}

// The skew is the authors' offline step: the prefill sends the calibration rows' F32 queries to
// the host, calib_tokens of them per layer, not the whole prompt's. Two calibration lengths over the
// same prompt differ in the prefill's gpu → dram bytes by exactly the extra rows' queries.
TEST(InfiniGen, PrefillSendsOnlyTheCalibrationQueries) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto& hp = m.hp;
  const int prompt = 25;
  const auto toks = token_stream(prompt + 2, hp.n_vocab, 3);
  std::map<int, int64_t> d2h;
  for (int calib : {9, 20}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy("infinigen", StrategyContext{rt.accel_backend(), &rt, &m},
                            {{"calib_tokens", std::to_string(calib)}});
    rt.accel()
        .submit("run", {}, {},
                [&] {
                  step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
                    if (step == 0)
                      d2h[calib] = rt.transfers().totals().bytes_between(Tier::kGpu, Tier::kDram);
                  });
                })
        .wait();
  }
  EXPECT_EQ(d2h[20] - d2h[9], int64_t(hp.n_layers) * (20 - 9) * hp.n_heads * hp.head_dim * 4);
}

// A prompt shorter than the head dimension over (group + 1) gives fewer calibration rows than D:
// the skew must still be a full D×D rotation (the thin SVD's V would be D × rows).
TEST(InfiniGen, ShortPromptCalibrationIsAFullRotation) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto toks = token_stream(14, m.hp.n_vocab, 31);
  expect_matches_oracle(m, "infinigen",
                        {{"partial_ratio", "1"}, {"max_kv_ratio", "1"}, {"alpha", "1e9"}, {"full_layers", "1"}},
                        toks, 2, 1e-3, "infinigen, 2-token prompt");
}

TEST(InfiniGen, CalibrationOnAPrefixSelectsAsTheWholePromptDoes) {
  // partial_ratio 1: whatever the skew, the partial logits are the true ones, so the tokens fetched
  // (30 % of them, by partial logit) do not depend on where the skew was calibrated, as long as
  // every partial key is right: those of the prompt rows after a 9-token calibration prefix come
  // from the store at calibration and from append() after it.
  Model m = load_model("synthetic:tiny-qwen2");
  const auto toks = token_stream(40, m.hp.n_vocab, 13);
  auto run = [&](const char* calib) {
    return emulated_step_logits(m, "infinigen",
                                {{"partial_ratio", "1"},
                                 {"max_kv_ratio", "0.3"},
                                 {"alpha", "1e9"},
                                 {"full_layers", "1"},
                                 {"calib_tokens", calib}},
                                toks, 25, [](Runtime&, KvStrategy& kv) {
                                  EXPECT_GT(kv.step_stats().at("fetched_tokens"), 0.0);
                                });
  };
  expect_steps_close(run("9"), run("0"), 1e-4, "calib_tokens 9 against the whole prompt");
}

// The skew is offline in the authors' code: the first run over a calibration prefix computes it,
// a later run (the timed one after a warm-up) reuses it and gives the same logits at every step.
TEST(InfiniGen, SkewIsComputedOnceAndReusedExactly) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto toks = token_stream(40, m.hp.n_vocab, 4242);
  std::vector<double> svds;
  auto run = [&] {
    return emulated_step_logits(m, "infinigen", {{"partial_ratio", "0.5"}, {"max_kv_ratio", "0.3"}, {"full_layers", "1"}},
                                toks, 6, [&](Runtime&, KvStrategy& kv) { svds.push_back(kv.step_stats().at("skew_svd_layers")); });
  };
  const auto first = run(), second = run();
  ASSERT_FALSE(svds.empty());
  EXPECT_EQ(svds.front(), double(m.hp.n_layers));  // every layer skewed in the first run
  EXPECT_EQ(svds.back(), 0.0);                     // none in the second
  expect_steps_close(second, first, 0.0, "the reused skew against the computed one");
}

// Full attention that also records what InfiniGen's speculation for `layer` reads at the last
// decode row: the residual input of layer − 1 (prepare) and layer's stored keys (append).
class SpeculationInputs final : public KvStrategy {
 public:
  SpeculationInputs(Backend& be, int layer) : be_(be), full_(be), layer_(layer) {}
  std::string_view name() const override { return "recorder"; }
  void begin(const KvShape& s, std::span<const int32_t> cap, std::span<const int32_t> pl) override {
    shape = s;
    keys.clear();
    full_.begin(s, cap, pl);
  }
  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override {
    if (layer == layer_) keys.insert(keys.end(), k, k + rows.size() * size_t(shape.H_kv) * size_t(shape.D));
    full_.append(layer, rows, k, v);
  }
  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override {
    full_.attend(layer, rows, q, scale, out);
  }
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override { full_.fork(src, n, dst); }
  // The speculative query InfiniGen forms for `layer` from the row: layer − 1's attention norm,
  // layer's W_q (+ bias), RoPE at the row's position (while the decoder and its RoPE table live).
  void prepare(int next_layer, std::span<const TokenRow> rows, const float* x) override {
    if (next_layer != layer_ || rows.size() != 1 || !model) return;
    const Model& m = *model;
    std::vector<float> h(size_t(m.hp.d_model));
    q_last.assign(size_t(m.hp.n_heads) * size_t(m.hp.head_dim), 0.0f);
    be_.rms_norm(x, m.layers[size_t(layer_ - 1)][Slot::kAttnNorm].f32(), 1, m.hp.d_model, m.hp.norm_eps, h.data());
    const LayerWeights& w = m.layers[size_t(layer_)];
    be_.matmul(h.data(), 1, w[Slot::kWq], w[Slot::kBq].empty() ? nullptr : w[Slot::kBq].f32(), q_last.data());
    pos_last = rows[0].pos;
    be_.rope(q_last.data(), 1, m.hp.n_heads, m.hp.head_dim, &pos_last, *shape.rope);
  }
  KvShape shape;
  std::vector<float> keys, q_last;  // keys [pos][H_kv][D] in append order (one sequence)
  int32_t pos_last = -1;
  const Model* model = nullptr;

 private:
  Backend& be_;
  FullStrategy full_;
  int layer_;
};

// InfiniGen's alpha counts tokens whose partial logit is within alpha of the head's maximum on the
// 1/√D-scaled logits, as the authors' code scales them. With partial_ratio 1 the partial logits
// are the true q·k of the speculative query, so the fetch count of the last layer at the last step
// equals the count recomputed here from the recorded inputs (±1 for a token at the threshold
// between the emulated CPU backend and the ref backend), and differs from the unscaled rule's.
TEST(InfiniGen, AlphaIsAppliedToScaledLogits) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto toks = token_stream(48, m.hp.n_vocab, 21);
  const int prompt = 40, L = m.hp.n_layers - 1;
  const double alpha = 1.0;
  double fetched = -1;
  emulated_step_logits(m, "infinigen",
                       {{"partial_ratio", "1"}, {"max_kv_ratio", "1"}, {"alpha", "1"}, {"full_layers", "1"},
                        {"calib_tokens", "0"}},
                       toks, prompt, [&](Runtime&, KvStrategy& kv) { fetched = kv.step_stats().at("fetched_tokens"); });
  auto ref = make_ref_backend();
  SpeculationInputs rec(*ref, L);
  rec.model = &m;
  step_logits(m, *ref, rec, toks, prompt);
  ASSERT_EQ(rec.pos_last, int32_t(toks.size()) - 1);
  const int H = m.hp.n_heads, Hkv = m.hp.n_kv_heads, D = m.hp.head_dim, G = H / Hkv;
  const int64_t n = rec.pos_last;  // keys stored before the current token
  const std::vector<float>& q = rec.q_last;
  auto count = [&](double scale) {
    std::vector<float> logits(size_t(H) * size_t(n));
    for (int hh = 0; hh < H; ++hh)
      for (int64_t t = 0; t < n; ++t) {
        double dot = 0;
        for (int d = 0; d < D; ++d)
          dot += double(q[size_t(hh * D + d)]) * rec.keys[size_t((t * Hkv + hh / G) * D + d)];
        logits[size_t(hh * n + t)] = float(dot * scale);
      }
    return infinigen_fetch_count(*make_cpu_backend(), logits.data(), H, n, alpha, 1.0);
  };
  const int32_t scaled = count(1.0 / std::sqrt(double(D))), unscaled = count(1.0);
  ASSERT_GE(std::abs(scaled - unscaled), 3) << "the case must tell the two rules apart";
  EXPECT_NEAR(fetched, double(scaled), 1.0) << "unscaled rule: " << unscaled;
}

TEST(InfiniGen, FetchCountFollowsTheAlphaRule) {
  // Two heads over 10 tokens: head 0 has 3 tokens within alpha=4 of its max, head 1 has 5.
  std::vector<float> l = {10, 7, 6.5f, 1, 0, 0, 0, 0, 0, 0,   // > 6: 10, 7, 6.5 → 3
                          2, 1.5f, 1, 0.5f, -1.9f, -5, -5, -5, -5, -5};  // > -2: 5
  EXPECT_EQ(infinigen_fetch_count(*make_cpu_backend(), l.data(), 2, 10, 4.0, 1.0), 4);  // mean 4
  EXPECT_EQ(infinigen_fetch_count(*make_cpu_backend(), l.data(), 2, 10, 4.0, 0.2), 2);  // capped at 0.2 · 10
  EXPECT_EQ(infinigen_fetch_count(*make_cpu_backend(), l.data(), 2, 10, 100.0, 1.0), 10);
  EXPECT_EQ(infinigen_fetch_count(*make_cpu_backend(), l.data(), 2, 10, 0.0, 1.0), 1);  // only the max itself is not > max
}


}  // namespace
}  // namespace hg
