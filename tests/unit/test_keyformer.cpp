// Keyformer: key tokens by accumulated Gumbel-softmax score + recent window.
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
#include "engine/backend/gumbel.h"
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
    {"keyformer",
     {{"kv_tokens", "5"}},
     {},
     {{"keyformer", {}, [](int32_t n) { return int32_t(std::lround(0.6 * n)); }},
      {"keyformer", {{"kv_tokens", "17"}}, [](int32_t) { return 17; }},
      {"keyformer", {{"budget", "0.3"}}, [](int32_t n) { return std::max(2, int32_t(std::lround(0.3 * n))); }}}});

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
    // The CPU kernel (at the level under test) and the reference policy op against the scalar.
    for (const auto& be : {make_cpu_backend(), make_ref_backend()}) {
      std::vector<double> got(static_cast<size_t>(n));
      keyformer_gumbel_n(*be, 7, 3, 1, 12, 5, pos.data(), n, got.data());
      for (int32_t i = 0; i < n; ++i) {
        const double want = keyformer_gumbel(7, 3, 1, 12, 5, pos[size_t(i)]);
        EXPECT_EQ(std::memcmp(&got[size_t(i)], &want, sizeof want), 0) << be->name() << " n=" << n << " i=" << i;
      }
    }
  }
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    // −log u for u in (2^-53, 1): from about 1.1e-16 to 36.7; powers of two and the fold at 1.5.
    const double x = i < 100
                         ? std::ldexp(i % 2 ? 1.5 : 1.0, i - 60) * (i % 3 ? 1.0 : std::nextafter(1.0, 0.0))
                         : std::exp(std::uniform_real_distribution<double>(-36.7, 3.61)(r));
    const double want = std::log(x), got = gumbel::log_positive(x);
    worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want) * 0x1p-52, 0x1p-1074));
  }
  EXPECT_LE(worst, 2.0) << "ulp";
  const int N = 200000;
  std::vector<int32_t> pos(N);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<double> g(N);
  keyformer_gumbel_n(*make_cpu_backend(), 1, 0, 0, 3, 2, pos.data(), N, g.data());
  double mean = 0, var = 0;
  for (double v : g) mean += v / N;
  for (double v : g) var += (v - mean) * (v - mean) / N;
  EXPECT_NEAR(mean, 0.5772156649, 0.01);
  EXPECT_NEAR(var, std::numbers::pi * std::numbers::pi / 6, 0.03);
}

}  // namespace
}  // namespace hg

namespace hg {
namespace {

// The modeled clock charges Keyformer's score policy (noise, softmax and accumulation per score) as
// elementwise work of the accelerator's stages, kKeyformerScoreElems per score
// (BM_KeyformerScoresVsExpSum measures that factor); H2O's policy is one add per score, no more.
TEST(Keyformer, ScorePolicyIsChargedAsElementwiseWork) {
  ASSERT_GT(kKeyformerScoreElems, 1.0);
  Model m = load_model("synthetic:tiny-llama");
  std::map<std::string, double> elems;
  for (const char* s : {"keyformer", "h2o"}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy(s, StrategyContext{rt.accel_backend(), &rt, &m}, {{"kv_ratio", "0.5"}});
    GenerateOptions go;
    go.runtime = &rt;
    go.n_new = 4;
    go.stop_at_eos = false;
    go.sampler.greedy = true;
    std::vector<int32_t> prompt;
    for (int i = 0; i < 48; ++i) prompt.push_back(1 + i % 50);
    generate(m, rt.accel_backend(), *kv, {prompt}, go);
    rt.accel().synchronize();
    for (const auto& r : rt.log().snapshot()) elems[s] += r.work.elems;
  }
  // Every prompt row scores its keys (48·49/2 per head and layer at least).
  EXPECT_GE(elems["keyformer"], kKeyformerScoreElems * 48 * 49 / 2 * m.hp.n_heads * m.hp.n_layers);
  EXPECT_EQ(elems["h2o"], 0.0);
}

}  // namespace
}  // namespace hg
