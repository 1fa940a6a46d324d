// StreamingLLM: sinks + window, keys at their original positions or re-rotated at their rank.
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
    {"streamingllm",
     {{"sinks", "1"}, {"window", "4"}},
     // A window above the sequence length evicts nothing: exact, which checks the pre-RoPE store and
     // the re-rotation (F32: a 16-bit store rounds the keys before RoPE, the oracle after it).
     {{"synthetic:tiny-llama", "streamingllm", {{"window", "1000"}, {"kv_dtype", "f32"}}},
      {"synthetic:tiny-llama", "streamingllm", {{"window", "1000"}, {"positions", "original"}}}},
     {{"streamingllm", {{"window", "12"}}, [](int32_t) { return 16; }},
      {"streamingllm", {{"window", "12"}, {"positions", "original"}}, [](int32_t) { return 16; }},
      {"streamingllm", {{"kv_ratio", "0.5"}}, [](int32_t n) { return 4 + std::max(1, n / 2 - 4); }},
      {"streamingllm", {{"budget", "0.5"}}, [](int32_t n) { return 4 + std::max(1, n / 2 - 4); }}}});

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

// At F32 and F16 (rounded before rotation, so held to F16's precision of the keys and values).
TEST(StreamingLlm, CachePositionsRotateKeysAtTheirRank) {
  const int H = 4, Hkv = 2, D = 8, G = H / Hkv, P = 12, steps = 10, sinks = 2, window = 5;
  for (auto [dt, tol] : {std::pair{"f32", 2e-5}, {"f16", 2e-3}}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto ref = make_ref_backend();
    auto kv = make_strategy("streamingllm", StrategyContext{*ref, &rt, nullptr},
                            {{"sinks", std::to_string(sinks)}, {"window", std::to_string(window)}, {"kv_dtype", dt}});
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
          EXPECT_NEAR(out[size_t(h * D + d)], o, tol + tol * std::abs(o))
              << dt << " token " << t << " head " << h << " d " << d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace hg
