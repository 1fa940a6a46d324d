// MoE-Lightning: prefill on the accelerator, decode attention on the CPU.
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
    {"moe_lightning",
     {},
     {{"synthetic:tiny-qwen2", "moe_lightning", {{"micro_batches", "1"}}},
      {"synthetic:tiny-qwen2", "moe_lightning", {{"micro_batches", "3"}}},
      {"models/stories260K/stories260K.gguf", "moe_lightning", {}},
      {"synthetic:tiny-qwen2", "moe_lightning", {{"kv_dtype", "f32"}}}},
     {}});

// MoE-Lightning's prefill attends on the accelerator (no CPU attention stage before the first
// decode step, also when the prompt arrives in chunks whose earlier K/V come back from dram), with
// the oracle's logits; decode attention runs on the CPU.
TEST(MoeLightning, PrefillAttendsOnTheAcceleratorAndDecodeOnTheCpu) {
  Model m = load_model("synthetic:tiny-qwen2");
  const int prompt = 23;
  const auto toks = token_stream(prompt + 5, m.hp.n_vocab, 9);
  auto ref = make_ref_backend();
  FullStrategy oracle(*ref, nullptr, DType::kF16, DType::kF16);  // the default kv_dtype, as moe_lightning stores
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

// Transfer accounting per decode step: q, k and v to the CPU and the attention output back, per
// layer, nothing else.
TEST(MoeLightning, TransfersPerStepAreQkvOutAndOutputBack) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto& hp = m.hp;
  const int prompt = 17;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 5);
  // K and V at the default kv_dtype (F16); q and the output stay F32 activations.
  const int64_t row_kv = int64_t(hp.n_kv_heads) * hp.head_dim * 2, q = int64_t(hp.n_heads) * hp.head_dim * 4;
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy("moe_lightning", StrategyContext{rt.accel_backend(), &rt, &m});
  TransferTotals before;
  rt.accel().submit("run", {}, {}, [&] {
    step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
      const TransferTotals now = rt.transfers().totals();
      if (step > 0) {
        EXPECT_EQ(now.bytes_between(Tier::kGpu, Tier::kDram) - before.bytes_between(Tier::kGpu, Tier::kDram),
                  hp.n_layers * (q + 2 * row_kv))
            << "step " << step;
        EXPECT_EQ(now.bytes_between(Tier::kDram, Tier::kGpu) - before.bytes_between(Tier::kDram, Tier::kGpu),
                  hp.n_layers * q)
            << "step " << step;
      }
      before = now;
    });
  }).wait();
}

}  // namespace
}  // namespace hg
