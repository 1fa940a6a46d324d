// HybridGen: exactness, pre mode, transfers, the speculative query and where it is projected.
#include <algorithm>
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
#include "engine/kv/paged_kv_store.h"
#include "engine/kv/placement.h"
#include "strategy_test_util.h"

namespace hg {
namespace {

using namespace test;

// This strategy's cases in the suites every strategy passes (strategy_test_util.h).
const bool kCasesRegistered = register_strategy_cases(
    {"hybridgen",
     {{"gpu_kv_tokens", "4"}, {"k", "fixed"}, {"k_fixed", "3"}, {"mode", "post"}, {"page_tokens", "4"}},
     // Every offloaded token selected: exact.
     {{"synthetic:tiny-qwen2", "hybridgen",
       {{"gpu_kv_tokens", "6"}, {"k", "fixed"}, {"k_fixed", "1000"}, {"mode", "post"}, {"speculative_query", "false"}}}},
     {}});

// Every KV element type: the oracle stores the same type, so both round K and V alike. F16's
// tolerance is wider: where the cpu and ref decoders' F32 rows differ in their last bits, F16
// rounds some elements one ulp apart, and stories260K's logits move by up to 3.6e-4 (1e-4 relative
// to their largest) between `full` on the cpu and on the ref backend; F32 and BF16 stay within 7e-6.
TEST(HybridGen, ExactWhenEveryOffloadedTokenIsSelected) {
  const std::map<std::string, double> rtol = {{"f32", 1e-4}, {"f16", 3e-4}, {"bf16", 1e-4}};
  for (const char* spec : {"synthetic:tiny-qwen2", "synthetic:tiny-llama", "models/stories260K/stories260K.gguf"}) {
    auto m = load_test_model(spec);
    if (!m) continue;
    for (const auto& [dt, tol] : rtol)
      for (const char* placement : {"semantic", "interleave"})
        expect_matches_oracle(*m, "hybridgen",
                              {{"gpu_kv_tokens", "6"}, {"k", "fixed"}, {"k_fixed", "1000"}, {"mode", "post"},
                               {"speculative_query", "false"}, {"placement", placement}, {"page_tokens", "4"},
                               {"kv_dtype", dt}},
                              token_stream(45, m->hp.n_vocab, 9), 23, tol, std::string(spec) + " " + placement + " " + dt,
                            [&](Runtime& rt, KvStrategy&) {
                              const int64_t far = rt.transfers().totals().bytes_between(Tier::kFar, Tier::kGpu);
                              if (std::string(placement) == "interleave") EXPECT_GT(far, 0) << "V pages on far were read";
                              else EXPECT_EQ(far, 0);
                            });
  }
}

// Where the offloaded pages lie changes what moves, not the numbers: the selected rows are summed
// in position order on every placement, so semantic, interleaved and dram-only pages give the same
// logits bit for bit, whether every offloaded token is selected or a top-K of them (16-bit KV, where
// another summation order would flip the rounding of later rows).
TEST(HybridGen, PlacementDoesNotChangeTheLogits) {
  for (const char* spec : {"synthetic:tiny-llama", "models/stories260K/stories260K.gguf"}) {
    auto m = load_test_model(spec);
    if (!m) continue;
    const auto toks = token_stream(45, m->hp.n_vocab, 9);
    for (const char* dt : {"bf16", "f16"})
      for (const char* k : {"1000", "5"}) {
        std::vector<std::vector<std::vector<float>>> got;
        for (const char* placement : {"dram-only", "semantic", "interleave"})
          got.push_back(emulated_step_logits(*m, "hybridgen",
                                             {{"gpu_kv_tokens", "6"},
                                              {"k", "fixed"},
                                              {"k_fixed", k},
                                              {"mode", "post"},
                                              {"speculative_query", "false"},
                                              {"placement", placement},
                                              {"page_tokens", "4"},
                                              {"kv_dtype", dt}},
                                             toks, 23));
        for (size_t p = 1; p < got.size(); ++p) {
          ASSERT_EQ(got[p].size(), got[0].size());
          for (size_t st = 0; st < got[0].size(); ++st)
            EXPECT_EQ(0, std::memcmp(got[p][st].data(), got[0][st].data(), got[0][st].size() * 4))
                << spec << " " << dt << " k_fixed " << k << " placement " << p << " step " << st;
        }
      }
  }
}

// `pre` mode scores the sinks and the most recent offloaded tokens, two runs of the offloaded keys
// that the CPU stage reads where they lie. With speculation off, HybridGen then attends to the
// sinks, those K − sinks tokens and the R resident ones plus the current: StreamingLLM's set with a
// window of R + K − sinks (keys at their original positions), so the two give the same logits.
// With interleaved pages the runs span both tiers, and their keys are gathered before scoring.
TEST(HybridGen, PreModeAttendsLikeStreamingLlmWithTheSameTokens) {
  const int R = 6, K = 10, sinks = 4;
  for (const char* spec : {"synthetic:tiny-qwen2", "synthetic:tiny-llama"})
    for (const char* dt : {"f32", "f16"}) {
      Model m = load_model(spec);
      const auto toks = token_stream(45, m.hp.n_vocab, 12);
      const auto sl = emulated_step_logits(m, "streamingllm",
                                           {{"sinks", std::to_string(sinks)},
                                            {"window", std::to_string(R + K - sinks)},
                                            {"positions", "original"},
                                            {"kv_dtype", dt}},
                                           toks, 23);
      for (const char* placement : {"semantic", "interleave"}) {
        const auto hg = emulated_step_logits(m, "hybridgen",
                                             {{"gpu_kv_tokens", std::to_string(R)},
                                              {"k", "fixed"},
                                              {"k_fixed", std::to_string(K)},
                                              {"mode", "pre"},
                                              {"pre_sinks", std::to_string(sinks)},
                                              {"speculative_query", "false"},
                                              {"placement", placement},
                                              {"page_tokens", "3"},
                                              {"kv_dtype", dt}},
                                             toks, 23);
        expect_steps_close(hg, sl, 1e-4, std::string(spec) + " " + placement + " " + dt);
      }
    }
}

// The offloaded keys' layout: every position has its own row on the tier its page is placed on,
// rows of a tier follow position order, and the row/position maps and runs agree with each other.
TEST(HybridGen, OffloadedKeysFollowTheirPagesTiers) {
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  const KvShape shape{3, 2, 2, 4, nullptr};
  const std::vector<int32_t> cap = {37, 20};
  for (const char* name : {"interleave", "semantic", "dram-only"}) {
    auto placement = make_placement(name, 0.5);
    PagedKvStore kv;
    // semantic: room for 12 of the 2·3·10 key pages of 64 bytes, so the 18 oldest go far.
    const int64_t page_bytes = int64_t(shape.H_kv) * 4 * shape.D * 4;
    kv.reset(shape, cap, 4, *placement, std::string(name) == "semantic" ? 12 * page_bytes : int64_t(1) << 40, rt.memory(),
             DType::kF32);
    auto f = [](char* p) { return reinterpret_cast<float*>(p); };
    int far = 0;
    for (int l = 0; l < shape.n_layers; ++l)
      for (int b = 0; b < 2; ++b) {
        for (int32_t p = 0; p < cap[size_t(b)]; ++p)
          for (int g = 0; g < shape.H_kv; ++g) f(kv.key(l, b, g, p))[0] = float(p * 10 + g);
        std::array<int32_t, 2> seen{};
        for (int32_t p = 0; p < cap[size_t(b)]; ++p) {
          const Tier t = kv.key_tier(l, b, p);
          const size_t ti = t == Tier::kDram ? 0 : 1;
          far += t == Tier::kFar;
          EXPECT_EQ(kv.key_rows_before(t, l, b, p), seen[ti]) << name << " pos " << p;
          EXPECT_EQ(kv.key_position(t, l, b, seen[ti]), p) << name << " pos " << p;
          for (int g = 0; g < shape.H_kv; ++g) {
            EXPECT_EQ(f(kv.keys(t, l, b, g))[int64_t(seen[ti]) * shape.D], float(p * 10 + g)) << name << " pos " << p;
          }
          ++seen[ti];
          if (t != kv.key_tier(l, b, (p / 4) * 4)) ADD_FAILURE() << name << ": a page split across tiers";
        }
        if (std::string(name) == "interleave") {  // pages alternate within every layer and sequence
          EXPECT_GT(seen[0], 0) << "layer " << l << " seq " << b;
          EXPECT_GT(seen[1], 0) << "layer " << l << " seq " << b;
        }
        for (auto [a, e] : {std::pair{0, cap[size_t(b)]}, std::pair{5, 18}, std::pair{3, 4}}) {
          int32_t next = a;
          kv.key_runs(l, b, a, e, [&](Tier t, int32_t row, int32_t pos, int32_t len) {
            EXPECT_EQ(pos, next) << name;
            for (int32_t i = 0; i < len; ++i) {
              EXPECT_EQ(kv.key_tier(l, b, pos + i), t) << name;
              EXPECT_EQ(kv.key_position(t, l, b, row + i), pos + i) << name;
            }
            next = pos + len;
          });
          EXPECT_EQ(next, e) << name;
        }
      }
    if (std::string(name) == "dram-only") EXPECT_EQ(far, 0);
    else EXPECT_GT(far, 0) << name;
    if (std::string(name) == "semantic") {
      // Position-major page numbers: the first pages of every layer and sequence are the oldest.
      EXPECT_EQ(kv.key_tier(0, 0, 0), Tier::kFar);
      EXPECT_EQ(kv.key_tier(2, 0, 36), Tier::kDram);
    }
  }
}

// The mapping study's mechanism: under `interleave` the CPU stage reads the keys on far pages from
// far memory (charged to far in the modeled clock's work), under `semantic` it reads dram only;
// both read the same number of keys.
TEST(HybridGen, InterleavedKeysAreReadFromFarByTheCpuStage) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto toks = token_stream(30, m.hp.n_vocab, 8);
  for (const char* mode : {"post", "pre"}) {
    std::map<std::string, std::array<int64_t, kNumTiers>> read, rows;
    for (const char* placement : {"semantic", "interleave"})
      emulated_step_logits(m, "hybridgen",
                           {{"gpu_kv_tokens", "5"}, {"k", "fixed"}, {"k_fixed", "6"}, {"mode", mode},
                            {"speculative_query", "false"}, {"placement", placement}, {"page_tokens", "3"}},
                           toks, 20, [&](Runtime& rt, KvStrategy&) {
                             for (auto& r : rt.log().snapshot())
                               if (r.name.rfind("hybridgen logits", 0) == 0)
                                 for (size_t t = 0; t < kNumTiers; ++t) {
                                   read[placement][t] += r.work.bytes[t];
                                   rows[placement][t] += r.work.rows[t];
                                 }
                           });
    const auto far = size_t(Tier::kFar), dram = size_t(Tier::kDram);
    EXPECT_EQ(read["semantic"][far], 0) << mode;
    EXPECT_GT(read["interleave"][far], 0) << mode;
    EXPECT_GT(read["interleave"][dram], 0) << mode;
    EXPECT_NEAR(double(read["interleave"][far] + read["interleave"][dram]), double(read["semantic"][dram]),
                0.02 * double(read["semantic"][dram]))
        << mode;
    if (std::string(mode) == "pre") {
      // A run of positions split across tiers is read as more separate runs.
      EXPECT_GT(rows["interleave"][far], 0);
      EXPECT_GT(rows["interleave"][dram] + rows["interleave"][far], rows["semantic"][dram]);
    }
  }
}

// At each KV element type: K and V rows move at its size (es), logits and queries as F32.
TEST(HybridGen, TransfersAreLogitsPlusSelectedValueRows) {
  Model m = load_model("synthetic:tiny-qwen2");
  const auto& hp = m.hp;
  const int prompt = 20, R = 5, K = 4, G = hp.n_heads / hp.n_kv_heads;
  const auto toks = token_stream(prompt + 6, hp.n_vocab, 4);
  for (auto [dt, es] : {std::pair{"f32", 4}, {"f16", 2}, {"bf16", 2}}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy("hybridgen", StrategyContext{rt.accel_backend(), &rt, &m},
                            {{"gpu_kv_tokens", std::to_string(R)}, {"k", "fixed"}, {"k_fixed", std::to_string(K)},
                             {"mode", "post"}, {"speculative_query", "false"}, {"kv_dtype", dt}});
    EXPECT_EQ(std::string(dtype_name(kv->kv_dtype())), dt);
    TransferTotals before;
    rt.accel().submit("run", {}, {}, [&] {
      step_logits(m, rt.accel_backend(), *kv, toks, prompt, [&](int step) {
        const TransferTotals now = rt.transfers().totals();
        if (step > 0) {
          const int64_t h2d = now.bytes_between(Tier::kDram, Tier::kGpu) - before.bytes_between(Tier::kDram, Tier::kGpu);
          const int64_t d2h = now.bytes_between(Tier::kGpu, Tier::kDram) - before.bytes_between(Tier::kGpu, Tier::kDram);
          // Per layer and KV head: K logits for its G query heads, and K V rows.
          EXPECT_EQ(h2d, int64_t(hp.n_layers) * hp.n_kv_heads * (int64_t(G) * K * 4 + int64_t(K) * hp.head_dim * es))
              << dt << " step " << step;
          // One token leaves each ring per step, its K and V row; the CPU stage gets the true query.
          EXPECT_EQ(d2h, int64_t(hp.n_layers) * (2 * hp.n_kv_heads * es + hp.n_heads * 4) * hp.head_dim)
              << dt << " step " << step;
        }
        before = now;
      });
    }).wait();
    // What the modeled clock charges. The CPU stage (post mode) streams every offloaded key of each
    // KV head from DRAM, and the K selected ones again for their logits, and does 2·D FLOPs per key
    // read and query head; the selected V rows are gathered as runs of consecutive positions, at
    // least one and at most K per KV head.
    int n_cpu = 0, n_v = 0;
    for (auto& r : rt.log().snapshot()) {
      if (r.name.rfind("hybridgen logits", 0) == 0) {
        ++n_cpu;
        const int64_t keys = r.work.bytes[size_t(Tier::kDram)] / (int64_t(hp.n_kv_heads) * hp.head_dim * es);
        EXPECT_GT(keys, 0) << r.name;
        EXPECT_EQ(r.work.bytes[size_t(Tier::kDram)], keys * hp.n_kv_heads * hp.head_dim * es) << r.name;
        EXPECT_DOUBLE_EQ(r.work.flops, 2.0 * hp.n_heads * hp.head_dim * double(keys)) << r.name;
        EXPECT_EQ(r.work.rows[size_t(Tier::kDram)], 0) << "post mode streams its keys";
      } else if (r.name == "selected V to gpu") {
        ++n_v;
        EXPECT_GE(r.work.rows[size_t(Tier::kDram)], hp.n_kv_heads);
        EXPECT_LE(r.work.rows[size_t(Tier::kDram)], int64_t(hp.n_kv_heads) * K);
      }
    }
    EXPECT_GT(n_cpu, 0);
    EXPECT_EQ(n_v, n_cpu);
  }
}

TEST(HybridGen, SpeculativeQueryRunsOnTheCpuQueue) {
  Model m = load_model("synthetic:tiny-llama");
  emulated_step_logits(m, "hybridgen", {{"gpu_kv_tokens", "8"}}, token_stream(40, m.hp.n_vocab, 2), 20,
                       [&](Runtime& rt, KvStrategy& kv) {
                         int spec = 0, plain = 0;
                         for (auto& r : rt.log().snapshot()) {
                           spec += r.name.rfind("hybridgen speculative", 0) == 0;
                           plain += r.name.rfind("hybridgen logits", 0) == 0;
                         }
                         // Layer 0 uses its true query every step; layers 1.. are speculated from
                         // the previous layer.
                         EXPECT_EQ(plain, 20);  // 20 decode steps, each with offloaded tokens
                         EXPECT_EQ(spec, 20 * (m.hp.n_layers - 1));
                         const auto st = kv.step_stats();
                         EXPECT_TRUE(st.count("K"));
                         EXPECT_TRUE(st.count("t_cpu_ms"));
                       });
}

// The CPU queue runs stages in submission order. Layer 0 has no speculation: its stage is queued
// at its attention, after the decoder asked for layer 1's speculation. Layer 1's speculative stage
// must still come after it on the queue, or layer 0's attention waits for both.
TEST(HybridGen, NextLayersSpeculationIsQueuedAfterTheStageThisLayerWaitsFor) {
  Model m = load_model("synthetic:tiny-llama");
  emulated_step_logits(
      m, "hybridgen", {{"gpu_kv_tokens", "8"}, {"mode", "post"}}, token_stream(30, m.hp.n_vocab, 2), 20,
      [&](Runtime& rt, KvStrategy&) {
        // The two stages of every decode step in the order the CPU queue ran them: layer 0's, then
        // layer 1's, step after step.
        auto recs = rt.log().snapshot();
        std::sort(recs.begin(), recs.end(),
                  [](const StageRecord& a, const StageRecord& b) { return a.start_s < b.start_s; });
        std::vector<int> seq;
        for (auto& r : recs)
          if (r.queue == rt.cpu().index()) {
            if (r.name == "hybridgen logits, layer 0") seq.push_back(0);
            if (r.name == "hybridgen speculative q + logits, layer 1") seq.push_back(1);
          }
        ASSERT_EQ(seq.size(), 20u);  // 10 decode steps
        for (size_t i = 0; i < seq.size(); ++i) EXPECT_EQ(seq[i], int(i % 2)) << "stage " << i;
      });
}

// `query_on: accelerator` projects the same speculative query on the accelerator that the CPU
// stage projects with `cpu`: with every offloaded token selected, the CPU's logits (of that
// query) enter the merged softmax, so the two runs' logits agree at every step. The modeled clock
// sees the projection move: W_q's bytes leave the CPU stages and join the accelerator's stage.
TEST(HybridGen, QueryOnTheAcceleratorMatchesTheCpuProjection) {
  for (const char* spec : {"synthetic:tiny-llama", "synthetic:tiny-qwen2", "synthetic:tiny-opt"}) {
    Model m = load_model(spec);
    const auto toks = token_stream(36, m.hp.n_vocab, 5);
    const int prompt = 20;
    std::vector<std::vector<float>> logits[2];
    std::vector<StageRecord> log[2];
    for (int accel = 0; accel < 2; ++accel) {
      RuntimeConfig rc;
      rc.device = "emulated";
      Runtime rt(rc);
      auto kv = make_strategy("hybridgen", StrategyContext{rt.accel_backend(), &rt, &m},
                              {{"gpu_kv_tokens", "6"},
                               {"k", "fixed"},
                               {"k_fixed", "1000"},
                               {"mode", "post"},
                               {"query_on", accel ? "accelerator" : "cpu"}});
      rt.accel()
          .submit("run", {}, {},
                  [&] { logits[accel] = step_logits(m, rt.accel_backend(), *kv, toks, prompt); })
          .wait();
      log[accel] = rt.log().snapshot();
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t s = 0; s < logits[0].size(); ++s) {
      double mx = 0;
      for (float v : logits[0][s]) mx = std::max(mx, double(std::abs(v)));
      ASSERT_TRUE(
          test::all_close(logits[1][s].data(), logits[0][s].data(), logits[0][s].size(), {1e-5 * mx, 1e-5}))
          << spec << " step " << s;
    }
    // Per speculated (step, layer): the CPU stage's DRAM bytes lose W_q's, the accelerator gains them.
    const int64_t wq = int64_t(m.layers[1][Slot::kWq].bytes());
    // The accelerator's stage is logged in segments (split at its waits) that share its work,
    // each rounded down: the sum may fall short by up to a byte per segment.
    int64_t spec_stages[2] = {0, 0}, cpu_dram[2] = {0, 0}, accel_gpu[2] = {0, 0}, segments = 0;
    for (int a = 0; a < 2; ++a)
      for (auto& r : log[a]) {
        if (r.name.rfind("hybridgen speculative", 0) == 0)
          ++spec_stages[a], cpu_dram[a] += r.work.bytes[size_t(Tier::kDram)];
        if (r.kind == StageKind::kAccelCompute)
          accel_gpu[a] += r.work.bytes[size_t(Tier::kGpu)], segments += a;
      }
    EXPECT_EQ(spec_stages[0], int64_t(toks.size() - prompt) * (m.hp.n_layers - 1)) << spec;
    EXPECT_EQ(spec_stages[1], spec_stages[0]) << spec;
    EXPECT_EQ(cpu_dram[0] - cpu_dram[1], spec_stages[0] * wq) << spec;
    EXPECT_NEAR(double(accel_gpu[1] - accel_gpu[0]), double(spec_stages[0] * wq), double(segments)) << spec;
    EXPECT_GT(segments, 1) << spec;
  }
}


}  // namespace
}  // namespace hg

namespace hg {
namespace {
using namespace test;

// The merge reads the CPU's logits and the selected V rows: in the event log the accelerator's
// work after them depends on each of those transfers (not only on the CPU stage that queued them),
// so the modeled replay cannot start the merge before they arrive.
TEST(HybridGen, MergeWaitsForTheLogitsAndValueRowsInTheLog) {
  Model m = load_model("synthetic:tiny-llama");
  for (const char* spec : {"true", "false"})
    emulated_step_logits(m, "hybridgen",
                         {{"gpu_kv_tokens", "6"}, {"k", "fixed"}, {"k_fixed", "8"}, {"mode", "post"},
                          {"speculative_query", spec}},
                         token_stream(40, m.hp.n_vocab, 4), 24, [&](Runtime& rt, KvStrategy&) {
                           const auto log = rt.log().snapshot();
                           std::set<int64_t> consumed;
                           for (auto& r : log)
                             if (r.kind == StageKind::kAccelCompute) consumed.insert(r.deps.begin(), r.deps.end());
                           int n = 0;
                           for (auto& r : log)
                             if (r.name == "cpu logits to gpu" || r.name == "selected V to gpu") {
                               ++n;
                               EXPECT_TRUE(consumed.count(r.id)) << r.name << " (stage " << r.id << ") speculative " << spec;
                             }
                           EXPECT_GT(n, 0) << "speculative " << spec;
                         });
}

}  // namespace
}  // namespace hg
