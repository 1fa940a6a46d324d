// FlexGen: all KV on dram, each layer's KV loaded per step; with `overlap` the loads are
// prefetched (the next layer's, and after the last layer the next step's layer 0).
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

// This strategy's cases in the suites every strategy passes (strategy_test_util.h).
const bool kCasesRegistered = register_strategy_cases(
    {"flexgen",
     {},
     {{"synthetic:tiny-qwen2", "flexgen", {{"overlap", "true"}}},
      {"synthetic:tiny-qwen2", "flexgen", {{"overlap", "false"}}},
      {"synthetic:tiny-opt", "flexgen", {}},
      {"models/stories260K/stories260K.gguf", "flexgen", {}},
      // F32 KV: the machinery alone against the F32 oracle.
      {"synthetic:tiny-qwen2", "flexgen", {{"kv_dtype", "f32"}}}},
     {}});

// Transfer accounting per decode step: 2·N·d per KV head for layers 1..L−1 (layer 0 was
// prefetched at the end of the last step) and the next step's layer 0 (N + 1 tokens), plus the new
// token's K and V back. With overlap no load is waited for; without, every layer's is.
TEST(FlexGen, TransfersPerStepAndExposedLoads) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto& hp = m.hp;
  const int prompt = 17;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 5);
  const int64_t row_kv = int64_t(hp.n_kv_heads) * hp.head_dim * 2;  // one token's K (or V) of one layer, F16 (the default kv_dtype)
  for (const bool overlap : {true, false}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy("flexgen", StrategyContext{rt.accel_backend(), &rt, &m},
                            {{"overlap", overlap ? "true" : "false"}});
    TransferTotals before;
    rt.accel().submit("run", {}, {}, [&] {
      step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
        const TransferTotals now = rt.transfers().totals();
        if (step > 0) {
          const int64_t N = prompt + step - 1;  // tokens stored before this step
          const int64_t h2d = now.bytes_between(Tier::kDram, Tier::kGpu) - before.bytes_between(Tier::kDram, Tier::kGpu);
          const int64_t d2h = now.bytes_between(Tier::kGpu, Tier::kDram) - before.bytes_between(Tier::kGpu, Tier::kDram);
          if (overlap) {
            EXPECT_EQ(h2d, (hp.n_layers - 1) * 2 * N * row_kv + 2 * (N + 1) * row_kv) << "step " << step;
          } else {
            EXPECT_EQ(h2d, hp.n_layers * 2 * N * row_kv) << "step " << step;  // each layer on demand
          }
          EXPECT_EQ(d2h, hp.n_layers * 2 * row_kv) << "step " << step;  // the new token's K and V
          EXPECT_EQ(kv->step_stats().at("exposed_loads"), overlap ? 0.0 : double(hp.n_layers)) << "step " << step;
        }
        before = now;
      });
    }).wait();
  }
}

// Under an accelerator KV budget FlexGen keeps its first layers resident (its cache_gpu share):
// the same logits as with every layer streamed, and only the other layers' KV over the link.
TEST(FlexGen, ResidentLayersUnderABudgetStreamOnlyTheRest) {
  Model m = load_model("synthetic:tiny-qwen2?layers=6");
  const auto& hp = m.hp;
  const int prompt = 17;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 5);
  const int64_t row_kv = int64_t(hp.n_kv_heads) * hp.head_dim * 2;  // one token's K (or V), F16
  const int64_t layer = int64_t(toks.size() + 1) * row_kv * 2;      // one layer's K and V at capacity
  std::vector<std::vector<float>> want;
  for (const int64_t budget : {int64_t(0), 5 * layer}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    rt.memory().set_kv_budget(budget);
    auto kv = make_strategy("flexgen", StrategyContext{rt.accel_backend(), &rt, &m}, {});
    TransferTotals before;
    std::vector<std::vector<float>> got;
    int r = -1;
    rt.accel()
        .submit("run", {}, {},
                [&] {
                  got = step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
                    const auto e = kv->effective_params();
                    r = e.count("cache_gpu_layers") ? std::stoi(e.at("cache_gpu_layers")) : 0;
                    const TransferTotals now = rt.transfers().totals();
                    if (step > 0) {
                      const int64_t N = prompt + step - 1;
                      const int64_t h2d = now.bytes_between(Tier::kDram, Tier::kGpu) -
                                          before.bytes_between(Tier::kDram, Tier::kGpu);
                      const int64_t d2h = now.bytes_between(Tier::kGpu, Tier::kDram) -
                                          before.bytes_between(Tier::kGpu, Tier::kDram);
                      EXPECT_EQ(h2d, (hp.n_layers - 1 - r) * 2 * N * row_kv + 2 * (N + 1) * row_kv)
                          << "step " << step;
                      EXPECT_EQ(d2h, (hp.n_layers - r) * 2 * row_kv) << "step " << step;
                      EXPECT_EQ(kv->step_stats().at("exposed_loads"), 0.0) << "step " << step;
                    }
                    before = now;
                  });
                })
        .wait();
    EXPECT_EQ(r, budget ? 3 : 0);  // 5 layers of budget: 2 staging, 3 resident
    EXPECT_LE(rt.memory().kv_usage().peak, budget ? budget : INT64_MAX);
    if (want.empty()) {
      want = got;
      continue;
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      for (size_t j = 0; j < got[i].size(); ++j)
        ASSERT_EQ(got[i][j], want[i][j]) << "step " << i << " logit " << j;
  }
}

}  // namespace
}  // namespace hg
