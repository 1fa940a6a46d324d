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

TEST(H2o, EvictionOrderMatchesBruteForce) { brute_force_check("h2o", {{"heavy_ratio", "0.2"}, {"recent_ratio", "0.15"}}); }

}  // namespace
}  // namespace hg
