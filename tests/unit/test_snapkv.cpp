// SnapKV: the prompt compressed once by the observation window's pooled attention.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "baselines/eviction.h"
#include "baselines/registry.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "strategy_test_util.h"
#include "test_util.h"

namespace hg {
namespace {

using namespace test;

const bool kCasesRegistered = register_strategy_cases(
    {"snapkv",
     {{"window", "2"}, {"kv_tokens", "6"}},
     // A capacity above the prompt keeps all of it: exact.
     {{"synthetic:tiny-qwen2", "snapkv", {{"kv_tokens", "100000"}}},
      {"synthetic:tiny-qwen2", "snapkv", {{"kv_ratio", "1"}, {"window", "4"}, {"kv_dtype", "bf16"}}}},
     // A 40-token prompt: the capacity kept at the first decode step, every decode token after it.
     {{"snapkv", {{"window", "4"}, {"kv_tokens", "12"}}, [](int32_t n) { return 12 + (n - 40); }},
      {"snapkv", {{"window", "4"}, {"budget", "0.25"}}, [](int32_t n) { return 10 + (n - 40); }}}});

// One layer driven with seeded q/k/v rows: after the prefill, each KV head keeps its observation
// window and the capacity's other tokens by the window's summed probabilities pooled over the
// kernel (zero padded mean, or max), as snapkv_utils.py computes them (double precision here);
// decode tokens are all kept.
void check_snapkv(const std::string& pooling) {
  const int H = 4, Hkv = 2, D = 8, G = H / Hkv, P = 24, steps = 5, w = 4, cap_tokens = 10, kernel = 3;
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto ref = make_ref_backend();
  auto kv = make_strategy("snapkv", StrategyContext{*ref, &rt, nullptr},
                          {{"window", std::to_string(w)}, {"kv_tokens", std::to_string(cap_tokens)},
                           {"kernel", std::to_string(kernel)}, {"pooling", pooling}, {"kv_dtype", "f32"}});
  auto* ev = dynamic_cast<EvictingStrategy*>(kv.get());
  ASSERT_NE(ev, nullptr);
  const KvShape shape{1, H, Hkv, D, nullptr};
  const int32_t cap = P + steps + 1, pl = P;
  kv->begin(shape, std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
  const int n = P + steps;
  const auto Q = random_vec(size_t(n * H * D), 11, -2, 2), K = random_vec(size_t(n * Hkv * D), 12, -2, 2),
             V = random_vec(size_t(n * Hkv * D), 13);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> out(size_t(n * H * D));
  auto logit = [&](int t, int h, int key) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += double(Q[size_t((t * H + h) * D + d)]) * K[size_t((key * Hkv + h / G) * D + d)];
    return s * scale;
  };
  // The expected prompt tokens kept per KV head.
  std::vector<std::set<int32_t>> want(Hkv);
  for (int g = 0; g < Hkv; ++g) {
    std::vector<double> score(size_t(P - w), 0.0);
    for (int t = P - w; t < P; ++t)
      for (int h = g * G; h < (g + 1) * G; ++h) {
        double mx = -INFINITY, sum = 0;
        for (int key = 0; key <= t; ++key) mx = std::max(mx, logit(t, h, key));
        for (int key = 0; key <= t; ++key) sum += std::exp(logit(t, h, key) - mx);
        for (int key = 0; key < P - w; ++key) score[size_t(key)] += std::exp(logit(t, h, key) - mx) / sum;
      }
    std::vector<double> pooled(score.size());
    for (int p = 0; p < P - w; ++p) {
      double acc = pooling == "max" ? -INFINITY : 0.0;
      for (int j = std::max(0, p - kernel / 2); j <= std::min(P - w - 1, p + kernel / 2); ++j)
        acc = pooling == "max" ? std::max(acc, score[size_t(j)]) : acc + score[size_t(j)];
      pooled[size_t(p)] = pooling == "max" ? acc : acc / kernel;
    }
    std::vector<int32_t> order(size_t(P - w));
    for (int p = 0; p < P - w; ++p) order[size_t(p)] = p;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {  // kept first; ties: the newer kept
      return pooled[size_t(a)] > pooled[size_t(b)] || (pooled[size_t(a)] == pooled[size_t(b)] && a > b);
    });
    want[size_t(g)].insert(order.begin(), order.begin() + (cap_tokens - w));
    for (int p = P - w; p < P; ++p) want[size_t(g)].insert(p);
  }
  for (int t = 0; t < n; ++t) {
    const TokenRow r{0, t};
    kv->append(0, std::span<const TokenRow>(&r, 1), &K[size_t(t * Hkv * D)], &V[size_t(t * Hkv * D)]);
    kv->attend(0, std::span<const TokenRow>(&r, 1), &Q[size_t(t * H * D)], scale, &out[size_t(t * H * D)]);
    kv->end_step();
    for (int g = 0; g < Hkv; ++g) {
      std::set<int32_t> w_now = want[size_t(g)];
      for (int d = P; d <= t; ++d) w_now.insert(d);
      if (t < P) EXPECT_EQ(int(held(ev->store(), 0, g).size()), t + 1) << pooling << " token " << t;
      else EXPECT_EQ(held(ev->store(), 0, g), w_now) << pooling << " token " << t << " head " << g;
    }
  }
}

TEST(SnapKv, KeepsTheWindowAndThePooledTopOfThePromptThenEveryDecodeToken) {
  check_snapkv("avg");
  check_snapkv("max");
  // A capacity must exceed the window (the authors assert max_capacity_prompt > window_size).
  Model m = load_model("synthetic:tiny-llama");
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  EXPECT_NE(input_error_of([&] {
              make_strategy("snapkv", StrategyContext{rt.accel_backend(), &rt, &m}, {{"window", "8"}, {"kv_tokens", "8"}});
            }).find("must exceed window"),
            std::string::npos);
}

}  // namespace
}  // namespace hg
