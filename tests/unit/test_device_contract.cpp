// The device-memory contract of Backend (engine/backend/backend.h) that the cuda backend relies
// on, checked on any machine through ContractBackend (contract_backend.h). The decoder and the
// `full` strategy, and the offloading strategies on a runtime whose accelerator is that backend,
// must run models without a violation and to the same tokens as on the CPU backend.
#include <cstdlib>
#include <cstring>
#include <map>

#include "baselines/full/full.h"
#include "baselines/registry.h"
#include "contract_backend.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "test_util.h"

namespace hg {
namespace {

GenerateOptions greedy(int n) {
  GenerateOptions o;
  o.n_new = n;
  o.stop_at_eos = false;
  o.sampler.greedy = true;
  return o;
}

// All three architectures, a ragged batch of two prompts (prefill rows of two sequences, then
// decode rows): the same tokens as the CPU backend, no contract violation, no leaked memory.
TEST(DeviceContract, DecoderAndFullStrategyKeepToBackendMemory) {
  for (const char* preset : {"tiny-llama", "tiny-qwen2", "tiny-opt"}) {
    Model m = load_model(std::string("synthetic:") + preset);
    const std::vector<std::vector<int32_t>> prompts = {{1, 20, 30, 40, 50, 60, 70}, {1, 90, 80}};
    auto cpu = make_cpu_backend();
    FullStrategy kc(*cpu);
    const auto want = generate(m, *cpu, kc, prompts, greedy(8));
    test::ContractBackend cb;
    {
      FullStrategy kd(cb);
      const auto got = generate(m, cb, kd, prompts, greedy(8));
      EXPECT_EQ(got.tokens, want.tokens) << preset;
    }
    const auto v = cb.violations();
    EXPECT_TRUE(v.empty()) << preset << ": " << (v.empty() ? "" : v.front());
  }
}

// The strategies that move KV between tiers, on a runtime whose accelerator is the contract
// backend (gpu tier on its memory, transfers through its upload/download, as with a GPU): no
// violation, and the same tokens as the same strategy on the plain emulated accelerator (CPU
// backend, host memory). A ragged batch of two prompts; HybridGen's ring (6 tokens) is shorter
// than the first prompt, so prefill and decode both offload (configurations: offloading_cases()).
TEST(DeviceContract, OffloadingStrategiesKeepToDeviceMemory) {
  Model m = load_model("synthetic:tiny-llama");
  const std::vector<std::vector<int32_t>> prompts = {{1, 20, 30, 40, 50, 60, 70, 11, 12}, {1, 90, 80}};
  // Selective (K = 3) and exact (K = 1000) HybridGen configurations.
  auto cases = test::offloading_cases("3");
  for (auto& c : test::offloading_cases("1000"))
    if (c.first == "hybridgen") cases.push_back(c);
  for (const auto& [name, params] : cases) {
    const std::string what = test::case_label(name, params);
    std::vector<std::vector<int32_t>> tokens[2];
    for (int device = 0; device < 2; ++device) {
      RuntimeConfig rc;
      rc.device = "emulated";
      if (device) rc.device_backend = [] { return std::make_unique<test::ContractBackend>(); };
      Runtime rt(rc);
      auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
      GenerateOptions o = greedy(8);
      o.runtime = &rt;
      tokens[device] = generate(m, rt.accel_backend(), *kv, prompts, o).tokens;
      if (device) {
        const auto v = static_cast<test::ContractBackend&>(rt.unmetered_accel_backend()).violations();
        EXPECT_TRUE(v.empty()) << what << ": " << v.size()
                               << " violations, first: " << (v.empty() ? "" : v.front());
        if (name != "moe_lightning") {  // MoE-Lightning keeps nothing on the gpu tier
          EXPECT_GT(rt.memory().ledger().usage(Tier::kGpu).peak, 0) << what;
        }
      }
    }
    EXPECT_EQ(tokens[1], tokens[0]) << what;
  }
}

// HybridGen's selected V rows reach the accelerator by DMA: on a device the accelerator backend
// gathers them from pinned dram and mapped far memory itself (no CPU copy into a staging buffer),
// and the bytes it gathers are the bytes the transfer engine logs for those stages per link.
TEST(DeviceContract, HybridGenGathersSelectedVFromHostMemory) {
  Model m = load_model("synthetic:tiny-llama");
  RuntimeConfig rc;
  rc.device = "emulated";
  rc.device_backend = [] { return std::make_unique<test::ContractBackend>(); };
  Runtime rt(rc);
  auto& cb = static_cast<test::ContractBackend&>(rt.unmetered_accel_backend());
  auto kv = make_strategy("hybridgen", StrategyContext{rt.accel_backend(), &rt, &m},
                          {{"gpu_kv_tokens", "6"}, {"k", "fixed"}, {"k_fixed", "3"}, {"placement", "interleave"},
                           {"page_tokens", "4"}});
  GenerateOptions o = greedy(8);
  o.runtime = &rt;
  generate(m, rt.accel_backend(), *kv, {{1, 20, 30, 40, 50, 60, 70, 11, 12}}, o);
  int64_t logged[kNumTiers] = {};
  for (const StageRecord& r : rt.log().snapshot())
    if (r.name == "selected V to gpu") logged[size_t(r.work.src)] += r.work.transfer_bytes;
  EXPECT_GT(logged[size_t(Tier::kDram)], 0);
  EXPECT_GT(logged[size_t(Tier::kFar)], 0);
  EXPECT_EQ(cb.gathered_from_host_bytes(), logged[size_t(Tier::kDram)] + logged[size_t(Tier::kFar)]);
  const auto v = cb.violations();
  EXPECT_TRUE(v.empty()) << (v.empty() ? "" : v.front());
}

}  // namespace
}  // namespace hg

namespace hg {
namespace {

// InfiniGen projects the speculative queries of a step's decode rows in one matmul per layer (W_q
// read once, as its authors' code projects the batch), not one per row: four sequences decoding
// together make as many projections, counted by their norms, as one sequence alone.
TEST(DeviceContract, InfiniGenProjectsTheBatchsSpeculativeQueriesOnce) {
  Model m = load_model("synthetic:tiny-llama");
  std::map<std::string, int64_t> calls[2];
  for (int b = 0; b < 2; ++b) {
    RuntimeConfig rc;
    rc.device = "emulated";
    rc.device_backend = [] { return std::make_unique<test::ContractBackend>(); };
    Runtime rt(rc);
    auto kv = make_strategy("infinigen", StrategyContext{rt.accel_backend(), &rt, &m}, {{"full_layers", "1"}});
    GenerateOptions o = greedy(6);
    o.runtime = &rt;
    const std::vector<int32_t> prompt = {1, 20, 30, 40, 50, 60, 70, 11, 12};
    generate(m, rt.accel_backend(), *kv, std::vector<std::vector<int32_t>>(b == 0 ? 1 : 4, prompt), o);
    calls[b] = static_cast<test::ContractBackend&>(rt.unmetered_accel_backend()).calls();
  }
  ASSERT_GT(calls[0]["rms_norm"], 0);
  EXPECT_EQ(calls[1]["rms_norm"], calls[0]["rms_norm"]);  // per row, batch 4 would add 3 per layer and step
}

}  // namespace
}  // namespace hg
