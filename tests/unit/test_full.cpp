// The `full` oracle strategy.
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
    {"full", {}, {{"synthetic:tiny-qwen2", "full", {}}}, {}});

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

}  // namespace
}  // namespace hg
