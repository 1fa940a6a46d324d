// KV strategies on the emulated accelerator: exact ones match the `ref` oracle's logits at every
// decode step; budgeted ones hold exactly their budget (read from the SlotStore); H2O's and
// Keyformer's evictions match a brute-force recomputation; transfer accounting per decode step
// matches the design's formulas.
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

namespace hg {

double keyformer_gumbel(uint64_t seed, int layer, int seq, int row, int head, int32_t pos);
void keyformer_gumbel_n(uint64_t seed, int layer, int seq, int row, int head, const int32_t* pos, int32_t n,
                        double* out);
double keyformer_log(double x);

namespace {

// Keyformer's noise as its header comment specifies it, written here independently (std::log,
// no vector path): the stream of (seed, layer, seq, query row, head) — each field xored in, times
// the second constant, then x ^= x >> 29 — then the key position's splitmix-style hash,
// u = (bits 63..11 + 0.5)·2^-53 and g = −log(−log u).
double ref_gumbel(uint64_t seed, int layer, int seq, int row, int head, int32_t pos) {
  const uint64_t A = 0x9e3779b97f4a7c15ull, B = 0xbf58476d1ce4e5b9ull, C = 0x94d049bb133111ebull;
  uint64_t x = seed * A;
  for (uint32_t f : {uint32_t(layer), uint32_t(seq), uint32_t(row), uint32_t(head)}) {
    x = (x ^ f) * B;
    x ^= x >> 29;
  }
  uint64_t y = x ^ uint64_t(uint32_t(pos)) * B;
  y ^= y >> 31;
  y *= C;
  y ^= y >> 29;
  y *= B;
  y ^= y >> 32;
  const double u = (double(y >> 11) + 0.5) / 9007199254740992.0;
  return -std::log(-std::log(u));
}

// Teacher-forced run: prefill `prompt` tokens of `toks`, then one decode step per remaining token.
// Returns the logits of the last prompt row and of every decode step; calls on_step(step) after each.
std::vector<std::vector<float>> step_logits(const Model& m, Backend& be, KvStrategy& kv, const std::vector<int32_t>& toks,
                                            int prompt, const std::function<void(int)>& on_step = {}, int max_rows = 512) {
  Decoder dec(m, be, kv, max_rows);
  const int32_t cap = int32_t(toks.size()) + 1, pl = prompt;
  kv.begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
  std::vector<std::vector<float>> out;
  std::vector<float> lg(size_t(m.hp.n_vocab));
  std::vector<TokenRow> rows;
  for (int i = 0; i < prompt; ++i) rows.push_back({0, i});
  const int32_t last = prompt - 1;
  dec.forward(std::span<const int32_t>(toks.data(), size_t(prompt)), rows, std::span<const int32_t>(&last, 1), lg.data());
  out.push_back(lg);
  if (on_step) on_step(0);
  for (size_t i = size_t(prompt); i < toks.size(); ++i) {
    const TokenRow r{0, int32_t(i)};
    const int32_t zero = 0;
    dec.forward(std::span<const int32_t>(&toks[i], 1), std::span<const TokenRow>(&r, 1), std::span<const int32_t>(&zero, 1),
                lg.data());
    out.push_back(lg);
    if (on_step) on_step(int(i) - prompt + 1);
  }
  return out;
}

std::vector<int32_t> token_stream(int n, int vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t = {1};
  for (int i = 1; i < n; ++i) t.push_back(int32_t(3 + g() % uint64_t(vocab - 3)));
  return t;
}

// Loads a synthetic spec or a ../shared path; empty when the shared file is absent.
std::optional<Model> load_test_model(const std::string& spec) {
  if (spec.rfind("synthetic:", 0) == 0) return load_model(spec);
  if (!std::filesystem::exists(test::shared_path(spec))) return std::nullopt;
  return load_model(test::shared_path(spec));
}

// Runs `name` with `params` on the emulated accelerator and compares its logits at every
// teacher-forced step with the ref oracle's (atol = rtol·max|logit|).
// Runs strategy `name` on the emulated accelerator over `toks` (teacher-forced, `prompt` tokens of
// prefill); `after` sees the runtime and the strategy once the run is over.
std::vector<std::vector<float>> emulated_step_logits(const Model& m, const std::string& name,
                                                     const std::map<std::string, std::string>& params,
                                                     const std::vector<int32_t>& toks, int prompt,
                                                     std::function<void(Runtime&, KvStrategy&)> after = {}) {
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
  std::vector<std::vector<float>> got;
  rt.accel().submit("run", {}, {}, [&] { got = step_logits(m, rt.accel_backend(), *kv, toks, prompt); }).wait();
  if (after) after(rt, *kv);
  return got;
}

// Every step's logits within rtol of the step's largest |want| (absolute) and rtol (relative).
void expect_steps_close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                        double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < got.size(); ++s) {
    double mx = 0;
    for (float v : want[s]) mx = std::max(mx, double(std::abs(v)));
    ASSERT_TRUE(test::all_close(got[s].data(), want[s].data(), want[s].size(), {rtol * mx, rtol}))
        << what << " step " << s;
  }
}

void expect_matches_oracle(const Model& m, const std::string& name, const std::map<std::string, std::string>& params,
                           const std::vector<int32_t>& toks, int prompt, double rtol, const std::string& what,
                           std::function<void(Runtime&, KvStrategy&)> after = {}) {
  auto ref = make_ref_backend();
  FullStrategy oracle(*ref);
  const auto want = step_logits(m, *ref, oracle, toks, prompt);
  expect_steps_close(emulated_step_logits(m, name, params, toks, prompt, std::move(after)), want, rtol, what);
}

struct ExactCase {
  std::string model;  // synthetic spec or a ../shared path
  std::string strategy;
  std::map<std::string, std::string> params;
};

class ExactStrategies : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ExactStrategies, MatchRefOracleAtEveryDecodeStep) {
  const ExactCase& c = GetParam();
  auto m = load_test_model(c.model);
  if (!m) GTEST_SKIP() << "../shared is absent (" << c.model << "); skipped";
  expect_matches_oracle(*m, c.strategy, c.params, token_stream(40, m->hp.n_vocab, 7), 23, 1e-4, c.strategy);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, ExactStrategies,
    ::testing::Values(ExactCase{"synthetic:tiny-qwen2", "full", {}},
                      ExactCase{"synthetic:tiny-qwen2", "flexgen", {{"overlap", "true"}}},
                      ExactCase{"synthetic:tiny-qwen2", "flexgen", {{"overlap", "false"}}},
                      ExactCase{"synthetic:tiny-qwen2", "moe_lightning", {{"micro_batches", "1"}}},
                      ExactCase{"synthetic:tiny-qwen2", "moe_lightning", {{"micro_batches", "3"}}},
                      ExactCase{"synthetic:tiny-opt", "flexgen", {}},
                      // Budgets above the sequence length: nothing is evicted, so these are exact too
                      // (for streamingllm this checks the pre-RoPE store and the re-rotation).
                      ExactCase{"synthetic:tiny-llama", "streamingllm", {{"window", "1000"}}},
                      ExactCase{"synthetic:tiny-qwen2", "h2o", {{"heavy_ratio", "1"}, {"recent_ratio", "1"}}},
                      ExactCase{"models/stories260K/stories260K.gguf", "flexgen", {}},
                      ExactCase{"models/stories260K/stories260K.gguf", "moe_lightning", {}}),
    [](const auto& i) {
      std::string s = i.param.model.substr(i.param.model.rfind('/') + 1) + "_" + i.param.strategy;
      for (auto& [k, v] : i.param.params) s += "_" + k + v;
      for (auto& ch : s)
        if (!isalnum(ch)) ch = '_';
      return s;
    });

// The per-head retained positions of layer l, head g, read from the store.
std::set<int32_t> held(const SlotStore& st, int l, int g) {
  const int32_t n = st.count(l, 0, g);
  return std::set<int32_t>(st.positions(l, 0, g), st.positions(l, 0, g) + n);
}

struct BudgetCase {
  std::string strategy;
  std::map<std::string, std::string> params;
  std::function<int32_t(int32_t)> budget;  // tokens kept once the context holds n tokens
};

class BudgetedStrategies : public ::testing::TestWithParam<BudgetCase> {};

TEST_P(BudgetedStrategies, HoldExactlyTheirBudgetEveryStep) {
  const BudgetCase& c = GetParam();
  Model m = load_model("synthetic:tiny-llama");
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy(c.strategy, StrategyContext{rt.accel_backend(), &rt, &m}, c.params);
  auto* ev = dynamic_cast<EvictingStrategy*>(kv.get());
  ASSERT_NE(ev, nullptr);
  const int prompt = 40;
  const auto toks = token_stream(prompt + 30, m.hp.n_vocab, 3);
  std::vector<int32_t> expect(size_t(m.hp.n_layers * m.hp.n_kv_heads));
  rt.accel().submit("run", {}, {}, [&] {
    step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
      const int32_t tokens = prompt + step;
      for (int l = 0; l < m.hp.n_layers; ++l)
        for (int g = 0; g < m.hp.n_kv_heads; ++g) {
          const int32_t n = ev->store().count(l, 0, g);
          // After the prefill all prompt tokens are held; after each decode step, exactly the budget
          // for the context that step's row saw (tokens − 1 before it).
          // Evicted tokens never return: a budget that grows by more than one token per step is
          // reached one token per step.
          const int32_t budget = c.budget(tokens - 1);
          int32_t& want_n = expect[size_t(l * m.hp.n_kv_heads + g)];
          want_n = step == 0 ? tokens : std::min(budget, want_n + 1);
          EXPECT_EQ(n, want_n) << c.strategy << " step " << step;
          if (c.strategy == "streamingllm" && step > 0) {
            std::set<int32_t> want;
            for (int32_t p = 0; p < 4; ++p) want.insert(p);
            for (int32_t p = tokens - (budget - 4); p < tokens; ++p) want.insert(p);
            EXPECT_EQ(held(ev->store(), l, g), want) << "step " << step;
          }
        }
    });
  }).wait();
}

INSTANTIATE_TEST_SUITE_P(Strategies, BudgetedStrategies,
                         ::testing::Values(
                             // floor(0.1·n) heavy + floor(0.1·n) recent: 4 + 4 at the 40-token prompt
                             BudgetCase{"h2o", {}, [](int32_t n) { return 2 * (n / 10); }},
                             BudgetCase{"h2o", {{"heavy_ratio", "0.2"}, {"recent_ratio", "0.05"}},
                                        [](int32_t n) { return n / 5 + std::max(1, n / 20); }},
                             BudgetCase{"h2o", {{"heavy_tokens", "6"}, {"recent_tokens", "3"}}, [](int32_t) { return 9; }},
                             BudgetCase{"keyformer", {}, [](int32_t n) { return int32_t(std::lround(0.6 * n)); }},
                             BudgetCase{"keyformer", {{"kv_tokens", "17"}}, [](int32_t) { return 17; }},
                             BudgetCase{"streamingllm", {{"window", "12"}}, [](int32_t) { return 16; }},
                             BudgetCase{"streamingllm", {{"window", "12"}, {"positions", "original"}}, [](int32_t) { return 16; }},
                             BudgetCase{"streamingllm", {{"kv_ratio", "0.5"}}, [](int32_t n) { return 4 + std::max(1, n / 2 - 4); }}),
                         [](const auto& i) {
                           std::string s = i.param.strategy;
                           for (auto& [k, v] : i.param.params) s += "_" + k + v;
                           for (auto& ch : s)
                             if (!isalnum(ch)) ch = '_';
                           return s;
                         });

// Drives a 1-layer strategy with seeded q/k/v rows and checks every eviction against a
// brute-force re-implementation (double precision, explicit sets).
void brute_force_check(const std::string& name, const std::map<std::string, std::string>& params) {
  const int H = 4, Hkv = 2, D = 8, G = H / Hkv, P = 20, steps = 15;
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto ref = make_ref_backend();
  auto kv = make_strategy(name, StrategyContext{*ref, &rt, nullptr}, params);
  auto* ev = dynamic_cast<EvictingStrategy*>(kv.get());
  const KvShape shape{1, H, Hkv, D, nullptr};
  const int32_t cap = P + steps + 1, pl = P;
  kv->begin(shape, std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
  const int n = P + steps;
  const auto Q = test::random_vec(size_t(n * H * D), 1, -2, 2);
  const auto K = test::random_vec(size_t(n * Hkv * D), 2, -2, 2);
  const auto V = test::random_vec(size_t(n * Hkv * D), 3);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> out(size_t(n * H * D));
  // Brute force state per KV head: retained set and scores.
  std::vector<std::set<int32_t>> keep(Hkv);
  std::vector<std::map<int32_t, double>> score(Hkv);
  // Position per slot, as a store that drops victims one at a time (the last slot moving into the
  // freed one) would hold them: the strategy picks all of a step's victims at once and must end
  // with the same slots.
  std::vector<std::vector<int32_t>> layout(Hkv);
  // Budgets are fractions of the current context n (the tokens before the decode row).
  auto budget_of = [&](int32_t n) {
    if (name == "h2o")
      return int32_t(std::floor(std::stod(params.at("heavy_ratio")) * n)) +
             std::max(1, int32_t(std::floor(std::stod(params.at("recent_ratio")) * n)));
    return std::max(2, int32_t(std::lround(0.6 * n)));
  };
  auto recent_of = [&](int32_t n) {
    if (name == "h2o") return std::max(1, int32_t(std::floor(std::stod(params.at("recent_ratio")) * n)));
    return std::clamp(int32_t(std::lround(0.3 * budget_of(n))), 1, budget_of(n) - 1);
  };
  int32_t budget = 0, heavy_recent = 0;
  auto logit = [&](int t, int h, int32_t key) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += double(Q[size_t((t * H + h) * D + d)]) * K[size_t((key * Hkv + h / G) * D + d)];
    return s * scale;
  };
  auto evict = [&](int g) {
    while (int32_t(keep[size_t(g)].size()) > budget) {
      std::vector<int32_t> pos(keep[size_t(g)].begin(), keep[size_t(g)].end());
      const int32_t cut = pos[pos.size() - size_t(heavy_recent)];
      int32_t victim = -1;
      for (int32_t p : pos)
        if (p < cut && (victim < 0 || score[size_t(g)][p] < score[size_t(g)][victim])) victim = p;
      keep[size_t(g)].erase(victim);
      score[size_t(g)].erase(victim);
      auto& l = layout[size_t(g)];
      *std::find(l.begin(), l.end(), victim) = l.back();
      l.pop_back();
    }
  };
  for (int t = 0; t < n; ++t) {
    const TokenRow r{0, t};
    budget = budget_of(t), heavy_recent = recent_of(t);
    EXPECT_EQ(ev->budget(0, t), budget) << name << " token " << t;
    if (t == P)
      for (int g = 0; g < Hkv; ++g) evict(g);
    for (int g = 0; g < Hkv; ++g)
      keep[size_t(g)].insert(t), score[size_t(g)][t] = 0.0, layout[size_t(g)].push_back(t);
    kv->append(0, std::span<const TokenRow>(&r, 1), &K[size_t(t * Hkv * D)], &V[size_t(t * Hkv * D)]);
    kv->attend(0, std::span<const TokenRow>(&r, 1), &Q[size_t(t * H * D)], scale, &out[size_t(t * H * D)]);
    const int step = std::max(0, t - P + 1);
    for (int g = 0; g < Hkv; ++g) {
      std::vector<int32_t> pos(keep[size_t(g)].begin(), keep[size_t(g)].end());
      for (int hh = 0; hh < G; ++hh) {
        const int h = g * G + hh;
        std::vector<double> z;
        double mx = -INFINITY;
        for (int32_t p : pos) {
          double x = logit(t, h, p);
          if (name == "keyformer") {
            const double tau = 1.0 + double(step) * (2.0 - 1.0) / double(cap - P);
            x = (x + ref_gumbel(0, 0, 0, t, h, p)) / tau;  // per (query row, key), prompt rows too
          }
          z.push_back(x);
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (auto& v : z) sum += (v = std::exp(v - mx));
        for (size_t i = 0; i < pos.size(); ++i) score[size_t(g)][pos[i]] += z[i] / sum;
      }
      if (t >= P) evict(g);
      ASSERT_EQ(held(ev->store(), 0, g), keep[size_t(g)]) << name << " token " << t << " head " << g;
      const int32_t* sp = ev->store().positions(0, 0, g);
      ASSERT_EQ(std::vector<int32_t>(sp, sp + ev->store().count(0, 0, g)), layout[size_t(g)])
          << name << " token " << t << " head " << g;
    }
  }
}

// StreamingLLM with `positions: cache` (pos-shift): after evictions, each kept key is rotated at its
// rank among the kept tokens and the query at the current token's rank. Checked against attention
// recomputed in double from the pre-RoPE rows, for every prompt row and decode step.
// A batch whose sequences each need a re-rotated copy of their keys: every row must read its own
// sequence's copy even when a later sequence's copy grows the staging buffer. The batch's tokens
// equal each sequence generated alone.
TEST(StreamingLlm, CachePositionsInABatchEqualEachSequenceAlone) {
  Model m = load_model("synthetic:tiny-llama");
  const std::vector<std::vector<int32_t>> prompts = {token_stream(9, m.hp.n_vocab, 1), token_stream(23, m.hp.n_vocab, 2),
                                                     token_stream(40, m.hp.n_vocab, 3)};
  auto run = [&](const std::vector<std::vector<int32_t>>& ps) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy("streamingllm", StrategyContext{rt.accel_backend(), &rt, &m},
                            {{"sinks", "2"}, {"window", "4096"}});
    GenerateOptions go;
    go.runtime = &rt;
    go.n_new = 12;
    go.stop_at_eos = false;
    go.sampler.greedy = true;
    return generate(m, rt.accel_backend(), *kv, ps, go).tokens;
  };
  const auto batch = run(prompts);
  for (size_t b = 0; b < prompts.size(); ++b) EXPECT_EQ(batch[b], run({prompts[b]})[0]) << "sequence " << b;
}

TEST(StreamingLlm, CachePositionsRotateKeysAtTheirRank) {
  const int H = 4, Hkv = 2, D = 8, G = H / Hkv, P = 12, steps = 10, sinks = 2, window = 5;
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto ref = make_ref_backend();
  auto kv = make_strategy("streamingllm", StrategyContext{*ref, &rt, nullptr},
                          {{"sinks", std::to_string(sinks)}, {"window", std::to_string(window)}});
  RopeTable rope;
  rope.style = RopeStyle::kHalf;
  for (int i = 0; i < D / 2; ++i) rope.inv_freq.push_back(std::pow(10000.0, -2.0 * i / D));
  const KvShape shape{1, H, Hkv, D, &rope};
  const int n = P + steps;
  const int32_t cap = n + 1, pl = P;
  kv->begin(shape, std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
  // Pre-RoPE rows; the strategy receives them rotated at their positions, as the decoder gives them.
  const auto Q0 = test::random_vec(size_t(n * H * D), 4, -2, 2);
  const auto K0 = test::random_vec(size_t(n * Hkv * D), 5, -2, 2);
  const auto V = test::random_vec(size_t(n * Hkv * D), 6);
  auto rotate = [&](const float* x, double p) {
    std::vector<double> y(static_cast<size_t>(D));
    for (int i = 0; i < D / 2; ++i) {
      const double a = p * rope.inv_freq[size_t(i)], c = std::cos(a), sn = std::sin(a);
      y[size_t(i)] = x[i] * c - x[i + D / 2] * sn;
      y[size_t(i + D / 2)] = x[i] * sn + x[i + D / 2] * c;
    }
    return y;
  };
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> q(size_t(H * D)), k(size_t(Hkv * D)), out(size_t(H * D));
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < H; ++h) {
      const auto r = rotate(&Q0[size_t((t * H + h) * D)], t);
      for (int d = 0; d < D; ++d) q[size_t(h * D + d)] = float(r[size_t(d)]);
    }
    for (int g = 0; g < Hkv; ++g) {
      const auto r = rotate(&K0[size_t((t * Hkv + g) * D)], t);
      for (int d = 0; d < D; ++d) k[size_t(g * D + d)] = float(r[size_t(d)]);
    }
    const TokenRow row{0, t};
    kv->append(0, std::span<const TokenRow>(&row, 1), k.data(), &V[size_t(t * Hkv * D)]);
    kv->attend(0, std::span<const TokenRow>(&row, 1), q.data(), scale, out.data());
    // Seen by row t: the whole prefix in the prompt; then the sinks, the newest `window` older
    // tokens and t itself. Ranks follow position order.
    std::vector<int32_t> seen;
    for (int32_t p = 0; p <= t; ++p)
      if (t < P || p < sinks || p >= t - window) seen.push_back(p);
    const int32_t m = int32_t(seen.size());
    for (int h = 0; h < H; ++h) {
      const auto qr = rotate(&Q0[size_t((t * H + h) * D)], m - 1);
      std::vector<double> z(static_cast<size_t>(m));
      double mx = -INFINITY, sum = 0;
      for (int32_t j = 0; j < m; ++j) {
        const auto kr = rotate(&K0[size_t((seen[size_t(j)] * Hkv + h / G) * D)], j);
        for (int d = 0; d < D; ++d) z[size_t(j)] += qr[size_t(d)] * kr[size_t(d)] * scale;
        mx = std::max(mx, z[size_t(j)]);
      }
      for (auto& x : z) sum += (x = std::exp(x - mx));
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int32_t j = 0; j < m; ++j)
          o += z[size_t(j)] / sum * V[size_t((seen[size_t(j)] * Hkv + h / G) * D + d)];
        EXPECT_NEAR(out[size_t(h * D + d)], o, 2e-5 + 2e-5 * std::abs(o))
            << "token " << t << " head " << h << " d " << d;
      }
    }
  }
}

TEST(H2o, EvictionOrderMatchesBruteForce) { brute_force_check("h2o", {{"heavy_ratio", "0.2"}, {"recent_ratio", "0.15"}}); }
TEST(Keyformer, EvictionOrderMatchesBruteForce) { brute_force_check("keyformer", {}); }

// Keyformer's noise: the 8-lane path gives the scalar's bits for every position (tails of every
// length), its logarithm is within 2 ulp of std::log over the range the noise uses, and the draws
// have Gumbel(0, 1)'s mean (Euler's γ) and variance (π²/6).
// Each query row draws its own noise for every key (prompt rows included): draws of different rows
// for the same key are uncorrelated, and the strategy's noise is the specified function.
TEST(Keyformer, NoiseIsIndependentPerQueryRowAndKey) {
  const int N = 20000;
  double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
  for (int32_t p = 0; p < N; ++p) {
    const double a = keyformer_gumbel(3, 1, 0, 100, 2, p), b = keyformer_gumbel(3, 1, 0, 101, 2, p);
    sx += a, sy += b, sxy += a * b, sxx += a * a, syy += b * b;
    EXPECT_NEAR(a, ref_gumbel(3, 1, 0, 100, 2, p), 1e-12 * (1 + std::abs(a)));
  }
  const double cov = sxy / N - sx / N * sy / N;
  const double corr = cov / std::sqrt((sxx / N - sx / N * sx / N) * (syy / N - sy / N * sy / N));
  EXPECT_LT(std::abs(corr), 0.03) << "rows 100 and 101 share their draws";
}

TEST(Keyformer, NoiseIsOneFunctionOfItsInputsAndGumbelDistributed) {
  std::mt19937_64 r(5);
  for (int32_t n : {0, 1, 7, 8, 9, 100, 1003}) {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (auto& p : pos) p = int32_t(r() % 200000);
    if (n > 2) pos[0] = 0, pos[1] = std::numeric_limits<int32_t>::max();
    std::vector<double> got(static_cast<size_t>(n));
    keyformer_gumbel_n(7, 3, 1, 12, 5, pos.data(), n, got.data());
    for (int32_t i = 0; i < n; ++i) {
      const double want = keyformer_gumbel(7, 3, 1, 12, 5, pos[size_t(i)]);
      EXPECT_EQ(std::memcmp(&got[size_t(i)], &want, sizeof want), 0) << "n=" << n << " i=" << i;
    }
  }
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    // −log u for u in (2^-53, 1): from about 1.1e-16 to 36.7; powers of two and the fold at 1.5.
    const double x = i < 100
                         ? std::ldexp(i % 2 ? 1.5 : 1.0, i - 60) * (i % 3 ? 1.0 : std::nextafter(1.0, 0.0))
                         : std::exp(std::uniform_real_distribution<double>(-36.7, 3.61)(r));
    const double want = std::log(x), got = keyformer_log(x);
    worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want) * 0x1p-52, 0x1p-1074));
  }
  EXPECT_LE(worst, 2.0) << "ulp";
  const int N = 200000;
  std::vector<int32_t> pos(N);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<double> g(N);
  keyformer_gumbel_n(1, 0, 0, 3, 2, pos.data(), N, g.data());
  double mean = 0, var = 0;
  for (double v : g) mean += v / N;
  for (double v : g) var += (v - mean) * (v - mean) / N;
  EXPECT_NEAR(mean, 0.5772156649, 0.01);
  EXPECT_NEAR(var, std::numbers::pi * std::numbers::pi / 6, 0.03);
}

// Transfer accounting per decode step (design invariant 3).
TEST(TransferAccounting, FlexgenAndMoeLightningPerStep) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto& hp = m.hp;
  const int prompt = 17;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 5);
  const int64_t row_kv = int64_t(hp.n_kv_heads) * hp.head_dim * 4;  // one token's K (or V) of one layer
  for (const char* name : {"flexgen", "moe_lightning"}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m});
    TransferTotals before;
    rt.accel().submit("run", {}, {}, [&] {
      step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
        const TransferTotals now = rt.transfers().totals();
        if (step > 0) {
          const int64_t N = prompt + step - 1;  // tokens stored before this step
          const int64_t h2d = now.bytes_between(Tier::kDram, Tier::kGpu) - before.bytes_between(Tier::kDram, Tier::kGpu);
          const int64_t d2h = now.bytes_between(Tier::kGpu, Tier::kDram) - before.bytes_between(Tier::kGpu, Tier::kDram);
          if (std::string(name) == "flexgen") {
            // 2·N·d per KV head for layers 1..L−1; layer 0 was prefetched at the end of the last step,
            // and this step prefetches the next step's layer 0 (N + 1 tokens). No load is waited for.
            EXPECT_EQ(h2d, (hp.n_layers - 1) * 2 * N * row_kv + 2 * (N + 1) * row_kv) << "step " << step;
            EXPECT_EQ(d2h, hp.n_layers * 2 * row_kv) << "step " << step;  // the new token's K and V
            EXPECT_EQ(kv->step_stats().at("exposed_loads"), 0.0) << "step " << step;
          } else {
            const int64_t q = int64_t(hp.n_heads) * hp.head_dim * 4;
            EXPECT_EQ(d2h, hp.n_layers * (q + 2 * row_kv)) << "step " << step;  // q, k, v
            EXPECT_EQ(h2d, hp.n_layers * q) << "step " << step;                 // the attention output
          }
        }
        before = now;
      });
    }).wait();
  }
}

// H2O, Keyformer and StreamingLLM keep their retained KV in dram by default (the paper's baselines
// run on the FlexGen engine): each decode step sends the new token's K and V there and the retained
// set (budget plus the new token) to the accelerator, per layer; `kv_home: gpu` moves nothing. The
// logits are the same either way.
TEST(TransferAccounting, EvictionStrategiesSendTheirRetainedKvEveryStep) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto& hp = m.hp;
  const int prompt = 30;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 5);
  const int64_t row_kv = int64_t(hp.n_kv_heads) * hp.head_dim * 4;
  for (const char* name : {"h2o", "keyformer", "streamingllm"}) {
    std::map<std::string, std::vector<std::vector<float>>> logits;
    for (const char* home : {"dram", "gpu"}) {
      RuntimeConfig rc;
      rc.device = "emulated";
      Runtime rt(rc);
      std::map<std::string, std::string> params = {{"kv_home", home}};
      if (std::string(name) == "streamingllm") params["window"] = "12";
      auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
      auto* ev = dynamic_cast<EvictingStrategy*>(kv.get());
      TransferTotals before;
      int32_t held_before = 0;
      rt.accel().submit("run", {}, {}, [&] {
        logits[home] = step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
          const TransferTotals now = rt.transfers().totals();
          const int64_t h2d = now.bytes_between(Tier::kDram, Tier::kGpu) - before.bytes_between(Tier::kDram, Tier::kGpu);
          const int64_t d2h = now.bytes_between(Tier::kGpu, Tier::kDram) - before.bytes_between(Tier::kGpu, Tier::kDram);
          if (step > 0) {
            if (std::string(home) == "dram") {
              EXPECT_EQ(d2h, hp.n_layers * 2 * row_kv) << name << " step " << step;
              // The first decode step prunes the prompt to the budget before it attends.
              const int32_t held = step == 1 ? std::min(held_before, ev->budget(0, prompt)) : held_before;
              EXPECT_EQ(h2d, hp.n_layers * 2 * (held + 1) * row_kv) << name << " step " << step;
            } else {
              EXPECT_EQ(d2h + h2d, 0) << name << " step " << step;
            }
          }
          held_before = ev->store().count(0, 0, 0);
          before = now;
        });
      }).wait();
    }
    expect_steps_close(logits["dram"], logits["gpu"], 1e-6, std::string(name) + " kv_home dram vs gpu");
  }
}

// MoE-Lightning's prefill attends on the accelerator (no CPU attention stage before the first
// decode step, also when the prompt arrives in chunks whose earlier K/V come back from dram), with
// the oracle's logits; decode attention runs on the CPU.
TEST(MoeLightning, PrefillAttendsOnTheAcceleratorAndDecodeOnTheCpu) {
  Model m = load_model("synthetic:tiny-qwen2");
  const int prompt = 23;
  const auto toks = token_stream(prompt + 5, m.hp.n_vocab, 9);
  auto ref = make_ref_backend();
  FullStrategy oracle(*ref);
  const auto want = step_logits(m, *ref, oracle, toks, prompt);
  for (int max_rows : {512, 8}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy("moe_lightning", StrategyContext{rt.accel_backend(), &rt, &m});
    auto cpu_attention = [&] {
      int n = 0;
      for (auto& r : rt.log().snapshot()) n += r.name.rfind("cpu attention", 0) == 0;
      return n;
    };
    int at_prefill = -1;
    std::vector<std::vector<float>> got;
    rt.accel().submit("run", {}, {}, [&] {
      got = step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
        if (step == 0) at_prefill = cpu_attention();
      }, max_rows);
    }).wait();
    EXPECT_EQ(at_prefill, 0) << "max_rows " << max_rows;
    EXPECT_EQ(cpu_attention(), 5 * m.hp.n_layers) << "max_rows " << max_rows;  // one per decode step and layer
    expect_steps_close(got, want, 1e-4, "moe_lightning, prefill chunks of " + std::to_string(max_rows));
  }
}

TEST(Full, HalfPrecisionKvCacheStaysCloseToF32) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto toks = token_stream(40, m.hp.n_vocab, 21);
  auto cpu = make_cpu_backend();
  FullStrategy f32(*cpu);
  const auto want = step_logits(m, *cpu, f32, toks, 20);
  for (DType t : {DType::kF16, DType::kBF16}) {
    FullStrategy half(*cpu, nullptr, t);
    const auto got = step_logits(m, *cpu, half, toks, 20);
    for (size_t s = 0; s < got.size(); ++s) {
      double mx = 0;
      for (float v : want[s]) mx = std::max(mx, double(std::abs(v)));
      // Rounding K and V to 11 (F16) or 8 (BF16) mantissa bits.
      const double r = t == DType::kF16 ? 5e-3 : 4e-2;
      ASSERT_TRUE(test::all_close(got[s].data(), want[s].data(), want[s].size(), {r * mx, r})) << dtype_name(t) << " step " << s;
    }
  }
}

TEST(Strategies, SchemaAndParamErrors) {
  std::set<std::string> names;
  for (auto& s : strategies()) names.insert(s.name);
  for (const char* n : {"full", "flexgen", "moe_lightning", "h2o", "keyformer", "streamingllm"}) EXPECT_TRUE(names.count(n)) << n;
  Model m = load_model("synthetic:tiny-llama");
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  const StrategyContext ctx{rt.accel_backend(), &rt, &m};
  try {
    make_strategy("h2o", ctx, {{"heavy_ration", "0.2"}});
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'heavy_ratio'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_strategy("streamingllm", ctx, {{"positions", "sideways"}}), InputError);
  EXPECT_THROW(make_strategy("flexgen", ctx, {{"overlap", "maybe"}}), InputError);
  EXPECT_THROW(make_strategy("flexgen", StrategyContext{rt.accel_backend(), nullptr, &m}), InputError);
}

}  // namespace
}  // namespace hg

namespace hg {
namespace {

TEST(HybridGen, ExactWhenEveryOffloadedTokenIsSelected) {
  for (const char* spec : {"synthetic:tiny-qwen2", "synthetic:tiny-llama", "models/stories260K/stories260K.gguf"}) {
    auto m = load_test_model(spec);
    if (!m) continue;
    for (const char* placement : {"semantic", "interleave"})
      expect_matches_oracle(*m, "hybridgen",
                            {{"gpu_kv_tokens", "6"}, {"k", "fixed"}, {"k_fixed", "1000"}, {"mode", "post"},
                             {"speculative_query", "false"}, {"placement", placement}, {"page_tokens", "4"}},
                            token_stream(45, m->hp.n_vocab, 9), 23, 1e-4, std::string(spec) + " " + placement,
                            [&](Runtime& rt, KvStrategy&) {
                              const int64_t far = rt.transfers().totals().bytes_between(Tier::kFar, Tier::kGpu);
                              if (std::string(placement) == "interleave") EXPECT_GT(far, 0) << "V pages on far were read";
                              else EXPECT_EQ(far, 0);
                            });
  }
}

// `pre` mode scores the sinks and the most recent offloaded tokens, two runs of the offloaded keys
// that the CPU stage reads where they lie. With speculation off, HybridGen then attends to the
// sinks, those K − sinks tokens and the R resident ones plus the current: StreamingLLM's set with a
// window of R + K − sinks (keys at their original positions), so the two give the same logits.
TEST(HybridGen, PreModeAttendsLikeStreamingLlmWithTheSameTokens) {
  const int R = 6, K = 10, sinks = 4;
  for (const char* spec : {"synthetic:tiny-qwen2", "synthetic:tiny-llama"}) {
    Model m = load_model(spec);
    const auto toks = token_stream(45, m.hp.n_vocab, 12);
    const auto hg = emulated_step_logits(m, "hybridgen",
                                         {{"gpu_kv_tokens", std::to_string(R)},
                                          {"k", "fixed"},
                                          {"k_fixed", std::to_string(K)},
                                          {"mode", "pre"},
                                          {"pre_sinks", std::to_string(sinks)},
                                          {"speculative_query", "false"}},
                                         toks, 23);
    const auto sl = emulated_step_logits(
        m, "streamingllm",
        {{"sinks", std::to_string(sinks)}, {"window", std::to_string(R + K - sinks)}, {"positions", "original"}},
        toks, 23);
    expect_steps_close(hg, sl, 1e-4, spec);
  }
}

TEST(HybridGen, TransfersAreLogitsPlusSelectedValueRows) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto& hp = m.hp;
  const int prompt = 20, R = 5, K = 4, G = hp.n_heads / hp.n_kv_heads;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 4);
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy("hybridgen", StrategyContext{rt.accel_backend(), &rt, &m},
                          {{"gpu_kv_tokens", std::to_string(R)}, {"k", "fixed"}, {"k_fixed", std::to_string(K)},
                           {"mode", "post"}, {"speculative_query", "false"}});
  TransferTotals before;
  rt.accel().submit("run", {}, {}, [&] {
    step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
      const TransferTotals now = rt.transfers().totals();
      if (step > 0) {
        const int64_t h2d = now.bytes_between(Tier::kDram, Tier::kGpu) - before.bytes_between(Tier::kDram, Tier::kGpu);
        const int64_t d2h = now.bytes_between(Tier::kGpu, Tier::kDram) - before.bytes_between(Tier::kGpu, Tier::kDram);
        // Per layer and KV head: K logits for its G query heads, and K V rows.
        EXPECT_EQ(h2d, int64_t(hp.n_layers) * hp.n_kv_heads * (int64_t(G) * K * 4 + int64_t(K) * hp.head_dim * 4))
            << "step " << step;
        // One token leaves each ring per step: its K and V row.
        EXPECT_EQ(d2h, int64_t(hp.n_layers) * 2 * hp.n_kv_heads * hp.head_dim * 4) << "step " << step;
      }
      before = now;
    });
  }).wait();
  // What the modeled clock charges. The CPU stage (post mode) streams every offloaded key of each
  // KV head from DRAM, and the K selected ones again for their logits, and does 2·D FLOPs per key
  // read and query head; the selected V rows are gathered as runs of consecutive positions, at
  // least one and at most K per KV head.
  int n_cpu = 0, n_v = 0;
  for (auto& r : rt.log().snapshot()) {
    if (r.name.rfind("hybridgen logits", 0) == 0) {
      ++n_cpu;
      const int64_t keys = r.work.bytes[size_t(Tier::kDram)] / (int64_t(hp.n_kv_heads) * hp.head_dim * 4);
      EXPECT_GT(keys, 0) << r.name;
      EXPECT_EQ(r.work.bytes[size_t(Tier::kDram)], keys * hp.n_kv_heads * hp.head_dim * 4) << r.name;
      EXPECT_DOUBLE_EQ(r.work.flops, 2.0 * hp.n_heads * hp.head_dim * double(keys)) << r.name;
      EXPECT_EQ(r.work.rows[size_t(Tier::kDram)], 0) << "post mode streams its keys";
    } else if (r.name == "selected V to gpu") {
      ++n_v;
      EXPECT_GE(r.work.rows[size_t(Tier::kDram)], hp.n_kv_heads);
      EXPECT_LE(r.work.rows[size_t(Tier::kDram)], int64_t(hp.n_kv_heads) * K);
    }
  }
  EXPECT_GT(n_cpu, 0);
  EXPECT_EQ(n_v, n_cpu);
}

TEST(HybridGen, SpeculativeQueryRunsOnTheCpuQueue) {
  Model m = load_model("synthetic:tiny-llama");
  const auto toks = token_stream(40, m.hp.n_vocab, 2);
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy("hybridgen", StrategyContext{rt.accel_backend(), &rt, &m}, {{"gpu_kv_tokens", "8"}});
  rt.accel().submit("run", {}, {}, [&] { step_logits(m, rt.accel_backend(), *kv, toks, 20); }).wait();
  int spec = 0, plain = 0;
  for (auto& r : rt.log().snapshot()) {
    spec += r.name.rfind("hybridgen speculative", 0) == 0;
    plain += r.name.rfind("hybridgen logits", 0) == 0;
  }
  // Layer 0 uses its true query every step; layers 1.. are speculated from the previous layer.
  EXPECT_EQ(plain, 20);  // 20 decode steps, each with offloaded tokens
  EXPECT_EQ(spec, 20 * (m.hp.n_layers - 1));
  const auto st = kv->step_stats();
  EXPECT_TRUE(st.count("K"));
  EXPECT_TRUE(st.count("t_cpu_ms"));
}

// `query_on: accelerator` projects the same speculative query on the accelerator that the CPU
// stage projects with `cpu`: with every offloaded token selected, the CPU's logits (of that
// query) enter the merged softmax, so the two runs' logits agree at every step. The modeled clock
// sees the projection move: W_q's bytes leave the CPU stages and join the accelerator's stage.
TEST(HybridGen, QueryOnTheAcceleratorMatchesTheCpuProjection) {
  for (const char* spec : {"synthetic:tiny-llama", "synthetic:tiny-qwen2", "synthetic:tiny-opt"}) {
    Model m = load_model(spec);
    const auto toks = token_stream(36, m.hp.n_vocab, 5);
    const int prompt = 20;
    std::vector<std::vector<float>> logits[2];
    std::vector<StageRecord> log[2];
    for (int accel = 0; accel < 2; ++accel) {
      RuntimeConfig rc;
      rc.device = "emulated";
      Runtime rt(rc);
      auto kv = make_strategy("hybridgen", StrategyContext{rt.accel_backend(), &rt, &m},
                              {{"gpu_kv_tokens", "6"},
                               {"k", "fixed"},
                               {"k_fixed", "1000"},
                               {"mode", "post"},
                               {"query_on", accel ? "accelerator" : "cpu"}});
      rt.accel()
          .submit("run", {}, {},
                  [&] { logits[accel] = step_logits(m, rt.accel_backend(), *kv, toks, prompt); })
          .wait();
      log[accel] = rt.log().snapshot();
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t s = 0; s < logits[0].size(); ++s) {
      double mx = 0;
      for (float v : logits[0][s]) mx = std::max(mx, double(std::abs(v)));
      ASSERT_TRUE(
          test::all_close(logits[1][s].data(), logits[0][s].data(), logits[0][s].size(), {1e-5 * mx, 1e-5}))
          << spec << " step " << s;
    }
    // Per speculated (step, layer): the CPU stage's DRAM bytes lose W_q's, the accelerator gains them.
    const int64_t wq = int64_t(m.layers[1][Slot::kWq].bytes());
    // The accelerator's stage is logged in segments (split at its waits) that share its work,
    // each rounded down: the sum may fall short by up to a byte per segment.
    int64_t spec_stages[2] = {0, 0}, cpu_dram[2] = {0, 0}, accel_gpu[2] = {0, 0}, segments = 0;
    for (int a = 0; a < 2; ++a)
      for (auto& r : log[a]) {
        if (r.name.rfind("hybridgen speculative", 0) == 0)
          ++spec_stages[a], cpu_dram[a] += r.work.bytes[size_t(Tier::kDram)];
        if (r.kind == StageKind::kAccelCompute)
          accel_gpu[a] += r.work.bytes[size_t(Tier::kGpu)], segments += a;
      }
    EXPECT_EQ(spec_stages[0], int64_t(toks.size() - prompt) * (m.hp.n_layers - 1)) << spec;
    EXPECT_EQ(spec_stages[1], spec_stages[0]) << spec;
    EXPECT_EQ(cpu_dram[0] - cpu_dram[1], spec_stages[0] * wq) << spec;
    EXPECT_NEAR(double(accel_gpu[1] - accel_gpu[0]), double(spec_stages[0] * wq), double(segments)) << spec;
    EXPECT_GT(segments, 1) << spec;
  }
}

}  // namespace
}  // namespace hg

namespace hg {
int32_t infinigen_fetch_count(Backend& host, const float* logits, int H, int64_t n, double alpha, double max_ratio);
namespace {

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
