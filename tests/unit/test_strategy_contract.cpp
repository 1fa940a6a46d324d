// The contract every registered strategy keeps, on the emulated accelerator: exact ones match the
// `ref` oracle's logits at every decode step; budgeted ones hold exactly their budget (read from
// the SlotStore); transfer accounting per decode step matches the design's formulas; parameters are
// checked against the schema. (The device-memory contract: test_device_contract.cpp.)
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
namespace {

using namespace test;

class ExactStrategies : public ::testing::TestWithParam<ExactCase> {};

TEST_P(ExactStrategies, MatchRefOracleAtEveryDecodeStep) {
  const ExactCase& c = GetParam();
  auto m = load_test_model(c.model);
  if (!m) GTEST_SKIP() << "../shared is absent (" << c.model << "); skipped";
  expect_matches_oracle(*m, c.strategy, c.params, token_stream(40, m->hp.n_vocab, 7), 23, 1e-4, c.strategy);
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, ExactStrategies, ::testing::ValuesIn(exact_cases()),
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
          // for the context the next row comes after (the `tokens` so far, this step's included).
          // Evicted tokens never return: a budget that grows by more than one token per step is
          // reached one token per step.
          const int32_t budget = c.budget(tokens);
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

INSTANTIATE_TEST_SUITE_P(Strategies, BudgetedStrategies, ::testing::ValuesIn(budget_cases()),
                         [](const auto& i) {
                           std::string s = i.param.strategy;
                           for (auto& [k, v] : i.param.params) s += "_" + k + v;
                           for (auto& ch : s)
                             if (!isalnum(ch)) ch = '_';
                           return s;
                         });

// H2O, Keyformer and StreamingLLM keep their retained KV in dram by default (offloaded as FlexGen's
// cache is): each decode step sends the new token's K and V there and the retained
// set to the accelerator, per layer, at kv_dtype's 2 bytes per element; `kv_home: gpu` moves
// nothing. With `overlap` (the default, FlexGen's schedule) layer l+1's retained set is loaded
// while layer l runs, and the new token's K and V are written into the loaded copy on the
// accelerator; after the last layer, the next step's layer 0 is loaded. The first decode step
// prunes each layer before it attends, so it waits for its loads. `auto` under a budget keeps the
// first layers on the accelerator and streams the rest. The logits are the same every way.
TEST(TransferAccounting, EvictionStrategiesSendTheirRetainedKvEveryStep) {
  Model m = load_model("synthetic:tiny-qwen2?layers=6");  // 6 layers: 2 resident beside 2 staging
  const auto& hp = m.hp;
  const int prompt = 30;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 5);
  for (const char* name : {"h2o", "keyformer", "streamingllm"}) {
    std::map<std::string, std::vector<std::vector<float>>> logits;
    for (const char* home : {"dram", "serial", "gpu", "split"}) {
      RuntimeConfig rc;
      rc.device = "emulated";
      Runtime rt(rc);
      const bool serial = std::string(home) == "serial", split = std::string(home) == "split";
      // split: kv_home auto under a budget of 4 layers' stores (prompt + 1 slots of F16 rows
      // each): 2 resident beside the 2 staging layers.
      const int64_t store_layer = int64_t(2) * hp.n_kv_heads * hp.head_dim * 2 * (prompt + 1);
      if (split) rt.memory().set_kv_budget(4 * store_layer);
      std::map<std::string, std::string> params = {{"kv_home", serial  ? "dram"
                                                               : split ? "auto"
                                                                       : home},
                                                   {"overlap", serial ? "false" : "true"}};
      if (std::string(name) == "streamingllm") params["window"] = "12";
      auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
      auto* ev = dynamic_cast<EvictingStrategy*>(kv.get());
      // F16 by default (StreamingLLM re-rotating its keys too: positions: cache).
      EXPECT_EQ(kv->kv_dtype(), DType::kF16) << name;
      const int64_t row_kv = int64_t(hp.n_kv_heads) * hp.head_dim * int64_t(dtype_size(kv->kv_dtype()));
      TransferTotals before;
      int32_t held_before = 0;
      rt.accel().submit("run", {}, {}, [&] {
        logits[home] = step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
          const TransferTotals now = rt.transfers().totals();
          const int64_t h2d = now.bytes_between(Tier::kDram, Tier::kGpu) - before.bytes_between(Tier::kDram, Tier::kGpu);
          const int64_t d2h = now.bytes_between(Tier::kGpu, Tier::kDram) - before.bytes_between(Tier::kGpu, Tier::kDram);
          if (step > 0) {
            const int32_t held_now = ev->store().count(0, 0, 0);
            if (serial) {
              EXPECT_EQ(d2h, hp.n_layers * 2 * row_kv) << name << " step " << step;
              // The first decode step prunes the prompt to the budget before it attends.
              const int32_t held = step == 1 ? std::min(held_before, ev->budget(0, prompt)) : held_before;
              EXPECT_EQ(h2d, hp.n_layers * 2 * (held + 1) * row_kv) << name << " step " << step;
              EXPECT_EQ(ev->step_stats().at("exposed_loads"), hp.n_layers) << name;
            } else if (std::string(home) == "dram") {
              EXPECT_EQ(d2h, hp.n_layers * 2 * row_kv) << name << " step " << step;
              // Step 1: every layer waits for its pruned set and the new token; later steps load each
              // layer's set as the last step left it, the new token written on the accelerator. Each
              // step ends with the next step's layer 0.
              const int64_t loads = step == 1 ? hp.n_layers * (std::min(held_before, ev->budget(0, prompt)) + 1)
                                              : (hp.n_layers - 1) * held_before;
              EXPECT_EQ(h2d, 2 * (loads + held_now) * row_kv) << name << " step " << step;
              EXPECT_EQ(ev->step_stats().at("exposed_loads"), step == 1 ? hp.n_layers : 0) << name << " step " << step;
            } else if (split) {
              // Only the streamed layers move: the new token down, the retained set up.
              const int streamed = hp.n_layers - 2;
              EXPECT_EQ(ev->effective_params().at("gpu_kv_layers"), "2");
              EXPECT_EQ(d2h, streamed * 2 * row_kv) << name << " step " << step;
              EXPECT_GT(h2d, 0) << name << " step " << step;
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
    expect_steps_close(logits["split"], logits["gpu"], 1e-6, std::string(name) + " kv_home split vs gpu");
  }
}


// Forking: a sequence forked from another after a shared context continues exactly as one that
// ran the same context itself. Two sequences share a context and then take different
// continuations; once with the context run on both ("recomputed"), once on the first only and
// forked into the second after its last token. Budgets are small, so that eviction, offloading
// and selection all act before and after the fork.

// Logits of every continuation step of both sequences, [step][seq][V].
std::vector<std::vector<std::vector<float>>> two_choices(const Model& m, const StrategyCase& c, bool prefill, bool fork) {
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy(c.strategy, StrategyContext{rt.accel_backend(), &rt, &m}, c.params);
  const auto ctx = token_stream(14, m.hp.n_vocab, 11);
  const std::vector<std::vector<int32_t>> cont = {token_stream(6, m.hp.n_vocab, 12), token_stream(6, m.hp.n_vocab, 13)};
  const int32_t n = int32_t(ctx.size()), P = prefill ? n - 1 : 1;
  const std::vector<int32_t> cap = {n + 6, n + 6}, prompt = {P, P};
  std::vector<std::vector<std::vector<float>>> out;
  rt.accel().submit("run", {}, {}, [&] {
    Decoder dec(m, rt.accel_backend(), *kv);
    kv->begin(dec.kv_shape(), cap, prompt);
    const int seqs = fork ? 1 : 2;
    std::vector<int32_t> t;
    std::vector<TokenRow> rows;
    for (int s = 0; s < seqs; ++s)
      for (int32_t p = 0; p < P; ++p) t.push_back(ctx[size_t(p)]), rows.push_back({s, p});
    dec.forward(t, rows, {}, nullptr);
    for (int32_t p = P; p < n; ++p) {
      t.clear(), rows.clear();
      for (int s = 0; s < seqs; ++s) t.push_back(ctx[size_t(p)]), rows.push_back({s, p});
      dec.forward(t, rows, {}, nullptr);
    }
    if (fork) kv->fork(0, n, std::vector<int32_t>{1});
    const int64_t V = m.hp.n_vocab;
    std::vector<float> lg(size_t(2 * V));
    const std::vector<int32_t> want = {0, 1};
    for (size_t k = 0; k < cont[0].size(); ++k) {
      t = {cont[0][k], cont[1][k]};
      rows = {{0, n + int32_t(k)}, {1, n + int32_t(k)}};
      dec.forward(t, rows, want, lg.data());
      out.push_back({std::vector<float>(lg.begin(), lg.begin() + V), std::vector<float>(lg.begin() + V, lg.end())});
    }
  }).wait();
  return out;
}

class ForkedStrategies : public ::testing::TestWithParam<StrategyCase> {};

TEST_P(ForkedStrategies, ContinueAsARecomputedSequence) {
  const StrategyCase& c = GetParam();
  Model m = load_model("synthetic:tiny-llama");
  for (bool prefill : {false, true}) {
    const auto want = two_choices(m, c, prefill, false), got = two_choices(m, c, prefill, true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      for (size_t s = 0; s < 2; ++s) {
        double worst = 0, scale = 0;
        for (size_t v = 0; v < want[k][s].size(); ++v) {
          worst = std::max(worst, double(std::abs(got[k][s][v] - want[k][s][v])));
          scale = std::max(scale, double(std::abs(want[k][s][v])));
        }
        EXPECT_LE(worst, 1e-5 * scale) << c.strategy << (prefill ? " prefill" : " stream") << " step " << k << " sequence " << s;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, ForkedStrategies, ::testing::ValuesIn(small_budget_cases()),
                         [](const auto& i) { return i.param.strategy; });

TEST(Strategies, EveryRegisteredStrategyForks) {
  std::set<std::string> covered;
  for (auto& c : small_budget_cases()) covered.insert(c.strategy);
  for (auto& s : strategies()) {
    if (s.name != "null") {
      EXPECT_TRUE(covered.count(s.name)) << s.name << " has no fork case";
    }
  }
}

// The contract covers every registered strategy: each has a case above (exact against the oracle,
// or holding its budget), so a new strategy without one fails here.
TEST(Strategies, EveryRegisteredStrategyHasContractCases) {
  std::set<std::string> covered;
  for (auto& c : exact_cases()) covered.insert(c.strategy);
  for (auto& c : budget_cases()) covered.insert(c.strategy);
  for (auto& s : strategies())
    if (s.name != "null") {
      EXPECT_TRUE(covered.count(s.name)) << s.name << " has no contract case";
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
