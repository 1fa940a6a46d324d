// H2O: heavy hitters by accumulated attention probability + recent window.
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
    {"h2o",
     {{"heavy_tokens", "3"}, {"recent_tokens", "2"}},
     // Budgets above the sequence length: nothing is evicted, so these are exact.
     {{"synthetic:tiny-qwen2", "h2o", {{"heavy_ratio", "1"}, {"recent_ratio", "1"}}},
      {"synthetic:tiny-qwen2", "h2o", {{"heavy_ratio", "1"}, {"recent_ratio", "1"}, {"kv_dtype", "bf16"}}}},
     // floor(0.1·n) heavy + floor(0.1·n) recent: 4 + 4 at a 40-token prompt (the authors' two
     // ratios); the shared budget is one attended fraction, floor(0.4·n) exactly, split in halves.
     {{"h2o", {}, [](int32_t n) { return 2 * (n / 10); }},
      {"h2o", {{"heavy_ratio", "0.2"}, {"recent_ratio", "0.05"}}, [](int32_t n) { return n / 5 + std::max(1, n / 20); }},
      {"h2o", {{"heavy_tokens", "6"}, {"recent_tokens", "3"}}, [](int32_t) { return 9; }},
      {"h2o", {{"budget", "0.4"}}, [](int32_t n) { return std::max(1, 2 * n / 5); }},
      {"h2o", {{"kv_ratio", "0.5"}}, [](int32_t n) { return std::max(1, n / 2); }}}});

TEST(H2o, EvictionOrderMatchesBruteForce) { brute_force_check("h2o", {{"heavy_ratio", "0.2"}, {"recent_ratio", "0.15"}}); }

}  // namespace
}  // namespace hg
