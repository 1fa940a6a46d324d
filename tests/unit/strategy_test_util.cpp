// Shared helpers of the strategy tests (strategy_test_util.h).
#include "strategy_test_util.h"

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
#include "baselines/keyformer/keyformer.h"
#include "baselines/full/full.h"
#include "baselines/registry.h"
#include "engine/decoder/decoder.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "test_util.h"
#include "strategy_test_util.h"


namespace hg::test {

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
                                            int prompt, const std::function<void(int)>& on_step, int max_rows) {
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
                                                     std::function<void(Runtime&, KvStrategy&)> after) {
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
                           std::function<void(Runtime&, KvStrategy&)> after) {
  // The oracle stores KV in the element type the strategy stores (its kv_dtype, or F32 where it
  // runs a 16-bit request as F32), so that both round K and V alike.
  DType dt = DType::kF32;
  {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    dt = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params)->kv_dtype();
  }
  auto ref = make_ref_backend();
  FullStrategy oracle(*ref, nullptr, dt, dt);
  const auto want = step_logits(m, *ref, oracle, toks, prompt);
  expect_steps_close(emulated_step_logits(m, name, params, toks, prompt, std::move(after)), want, rtol, what);
}

// The per-head retained positions of layer l, head g, read from the store.
std::set<int32_t> held(const SlotStore& st, int l, int g) {
  const int32_t n = st.count(l, 0, g);
  return std::set<int32_t>(st.positions(l, 0, g), st.positions(l, 0, g) + n);
}


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
    kv->end_step();  // the forward's end (a decode row's eviction is applied there)
    const int step = std::max(0, t - P + 1);
    // After a decode row, back to the budget of the context the next row comes after (t + 1).
    budget = budget_of(t + 1), heavy_recent = recent_of(t + 1);
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

namespace {
// Keyed by strategy name: a function-local static, filled by the test files' initializers.
std::map<std::string, StrategyCases>& case_registry() {
  static std::map<std::string, StrategyCases> r;
  return r;
}
}  // namespace

bool register_strategy_cases(StrategyCases c) {
  const std::string name = c.strategy;
  return case_registry().emplace(name, std::move(c)).second;
}

std::vector<ExactCase> exact_cases() {
  std::vector<ExactCase> out;
  for (const auto& [name, c] : case_registry()) out.insert(out.end(), c.exact.begin(), c.exact.end());
  return out;
}

std::vector<BudgetCase> budget_cases() {
  std::vector<BudgetCase> out;
  for (const auto& [name, c] : case_registry()) out.insert(out.end(), c.budget.begin(), c.budget.end());
  return out;
}

std::vector<StrategyCase> small_budget_cases() {
  std::vector<StrategyCase> out;
  for (const auto& [name, c] : case_registry()) out.push_back({name, c.small_budget});
  return out;
}

}  // namespace hg::test
