// The accelerator's call counters (engine/backend/metered_backend.h) and the fixed costs the
// emulated accelerator spends, then the call budgets of every strategy: on a runtime whose
// accelerator has memory of its own (ContractBackend: copies and waits as on a GPU), the launches,
// copy calls and synchronisations of a decode step per layer, at two context lengths and two KV
// head counts.
#include <chrono>
#include <map>
#include <string>

#include "baselines/registry.h"
#include "contract_backend.h"
#include "strategy_test_util.h"
#include "engine/backend/metered_backend.h"
#include "engine/decoder/decoder.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "engine/core/error.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/spec.h"
#include "test_util.h"

namespace hg {
namespace {

// Greedy generation of n tokens per sequence on rt, past EOS.
GenerateOptions greedy_on(Runtime& rt, int n) {
  GenerateOptions o;
  o.runtime = &rt;
  o.n_new = n;
  o.stop_at_eos = false;
  o.sampler.greedy = true;
  return o;
}

TEST(DeviceCalls, MeteredBackendCountsEachCallAndSpendsItsCost) {
  DeviceCounters c;
  auto be = make_metered_backend(make_cpu_backend(), &c, {});
  std::vector<float> x(64, 1.0f), y(64, 2.0f);
  be->add(y.data(), x.data(), 64);
  be->relu(y.data(), 64);
  be->upload(y.data(), x.data(), 256);
  be->download(x.data(), y.data(), 128);
  be->synchronize();
  EXPECT_EQ(be->max_value(y.data(), 64), 1.0f);
  int32_t top[2];
  be->logit_top_k(y.data(), 2, 32, 32, 2, top);
  const DeviceCounts n = c.snapshot();
  EXPECT_EQ(n.launches, 3);  // add, relu, max_value
  EXPECT_EQ(n.copies_h2d, 1);
  EXPECT_EQ(n.bytes_h2d, 256);
  EXPECT_EQ(n.copies_d2h, 1);
  EXPECT_EQ(n.bytes_d2h, 128);
  EXPECT_EQ(n.syncs, 3);  // the download, synchronize() and max_value's scalar
  EXPECT_EQ(n.host_policy_elems, 64);
  EXPECT_EQ((n - n).launches, 0);

  // With costs, each call spends its cost on the calling thread: 20 launches of 500 µs take 10 ms.
  DeviceCounters c2;
  auto slow = make_metered_backend(make_cpu_backend(), &c2, {500, 0, 0});
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) slow->relu(y.data(), 64);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.0099);
  EXPECT_EQ(c2.snapshot().launches, 20);
}

TEST(DeviceCalls, TransfersIntoAndOutOfTheGpuTierAreCopyCalls) {
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto g = rt.memory().allocate(Tier::kGpu, 4096);
  auto h = rt.memory().allocate(Tier::kDram, 4096);
  const DeviceCounts before = rt.device_counts();
  rt.transfers().copy(g.data(), Tier::kGpu, h.data(), Tier::kDram, 4096).wait();
  rt.transfers().copy(h.data(), Tier::kDram, g.data(), Tier::kGpu, 1024).wait();
  // Rows 0-3 and 8: two runs of consecutive rows, two copy calls on the host path.
  const std::vector<int32_t> rows = {0, 1, 2, 3, 8};
  rt.transfers().gather_rows(g.data(), Tier::kGpu, h.data(), Tier::kDram, 64, 64, rows).wait();
  const DeviceCounts d = rt.device_counts() - before;
  EXPECT_EQ(d.copies_h2d, 3);
  EXPECT_EQ(d.bytes_h2d, 4096 + 5 * 64);
  EXPECT_EQ(d.copies_d2h, 1);
  EXPECT_EQ(d.bytes_d2h, 1024);
}

TEST(DeviceCalls, DeviceCostsComeFromAProfilesMeasurements) {
  const PlatformProfile p = load_platform("h200-measured", std::string(HG_SOURCE_DIR) + "/experiments/platforms");
  const DeviceCosts c = device_costs_of(p);
  EXPECT_DOUBLE_EQ(c.launch_us, p.achieved.launch_us);
  EXPECT_DOUBLE_EQ(c.copy_us, p.achieved.copy_us);
  EXPECT_DOUBLE_EQ(c.sync_us, p.achieved.stage_us);
  EXPECT_TRUE(c.any());
  // Dry and cuda runtimes spend none; the emulated one spends what it was given.
  RuntimeConfig rc;
  rc.device = "emulated";
  rc.device_costs = c;
  EXPECT_DOUBLE_EQ(Runtime(rc).device_costs().launch_us, c.launch_us);
  rc.dry = true;
  rc.stage_clock = p;
  EXPECT_FALSE(Runtime(rc).device_costs().any());
}

// An experiment names the profile whose costs its emulated accelerator spends; a bad one is an
// error naming the file and line.
TEST(DeviceCalls, ExperimentDeviceCostsNameAProfile) {
  const std::string base = "name: c\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\n";
  EXPECT_EQ(parse_experiment(base + "device_costs: h200-measured\n", "c.yaml").device_costs, "h200-measured");
  EXPECT_EQ(parse_experiment(base, "c.yaml").device_costs, "off");
  try {
    parse_experiment(base + "device_costs: nowhere\n", "c.yaml");
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml:4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device_costs 'nowhere'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_experiment(base + "device: cuda\ndevice_costs: h200-measured\n", "c.yaml"), InputError);
}

// measure_generation records the prompt's calls and each measured decode step's.
TEST(DeviceCalls, MeasurementsCarryThePromptsAndEachStepsCalls) {
  Model m = load_model("synthetic:tiny-llama");
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy("full", StrategyContext{rt.accel_backend(), &rt, &m}, {});
  const Measurement ms = measure_generation(&rt, m, rt.accel_backend(), *kv, {{1, 20, 30, 40}}, greedy_on(rt, 5), 1);
  EXPECT_GT(ms.prefill_device.launches, 0);
  ASSERT_EQ(ms.step_device.size(), 3u);  // 4 decode steps, the first a warm-up
  for (const auto& s : ms.step_device) EXPECT_EQ(s.launches, ms.step_device[0].launches);
  EXPECT_GT(ms.step_device[0].launches, 0);
  const auto j = device_counts_json(ms.step_device[0], 2);
  EXPECT_DOUBLE_EQ(j["launches"].get<double>(), double(ms.step_device[0].launches) / 2);
}

// The launches and copy calls the modeled clock charges are the ones the meter counted, stage by
// stage: per decode step, the stage log's sums equal the meter's counts for every strategy, and for
// `full` they equal the decoder's own count of its ops (forward_launches).
TEST(DeviceCalls, TheClockChargesTheCallsTheMeterCounted) {
  Model m = load_model("synthetic:tiny-llama");
  auto cases = test::offloading_cases("3");
  cases.insert(cases.begin(), {"full", {}});
  for (const auto& [name, params] : cases) {
    const std::string what = test::case_label(name, params);
    RuntimeConfig rc;
    rc.device = "emulated";
    rc.device_backend = [] { return std::make_unique<test::ContractBackend>(); };
    Runtime rt(rc);
    auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
    std::vector<int32_t> toks = test::token_stream(24, int(m.hp.n_vocab), 7);
    toks[0] = 1;
    const Measurement ms = measure_generation(&rt, m, rt.accel_backend(), *kv, {toks}, greedy_on(rt, 4), 0);
    ASSERT_EQ(ms.step_device.size(), 3u) << what;
    for (int64_t step = 1; step <= 3; ++step) {
      int64_t launches = 0, copies = 0;
      for (const StageRecord& r : ms.log)
        if (r.step == step) launches += r.work.launches, copies += r.work.copy_calls;
      const DeviceCounts& c = ms.step_device[size_t(step - 1)];
      EXPECT_EQ(launches, c.launches) << what << " step " << step;
      EXPECT_EQ(copies, c.copies()) << what << " step " << step;
      // The decoder's count has the logits row's device copy as a launch, and not the strategy's
      // K and V writes (one each per layer for `full`) nor the logits' download for the sampler.
      if (name == "full") {
        EXPECT_EQ(launches + copies, forward_launches(m, 1, 1, 512) + 2 * m.hp.n_layers + 1) << "step " << step;
        EXPECT_EQ(c.copies_d2h, 1) << "step " << step;
      }
    }
  }
}

// One decode step's calls per layer for a strategy on a device-memory accelerator (copies through
// the backend, waits as on a GPU), the mean over the measured steps.
struct StepCalls {
  double launches = 0, copies = 0, syncs = 0, d2h_bytes = 0;
};

StepCalls step_calls(const std::string& name, const std::map<std::string, std::string>& params, int kv_heads,
                     int prompt) {
  Model m = load_model("synthetic:tiny-llama?kv_heads=" + std::to_string(kv_heads));
  RuntimeConfig rc;
  rc.device = "emulated";
  rc.device_backend = [] { return std::make_unique<test::ContractBackend>(); };
  Runtime rt(rc);
  auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
  std::vector<int32_t> toks = test::token_stream(prompt, int(m.hp.n_vocab), 7);
  toks[0] = 1;
  const Measurement ms = measure_generation(&rt, m, rt.accel_backend(), *kv, {toks}, greedy_on(rt, 6), 2);
  DeviceCounts sum;
  for (const auto& s : ms.step_device) sum += s;
  const double per = double(ms.step_device.size()) * double(m.hp.n_layers);
  return {double(sum.launches) / per, double(sum.copies()) / per,
          double(sum.syncs) / per, double(sum.bytes_d2h) / per};
}

// The call budget of a decode step per layer, on a device-memory accelerator: synchronisations
// never grow with the context or the KV head count, and neither do launches and copy calls (a
// constant per layer for every strategy). InfiniGen skews every head in one product with the
// stacked skew and fetches into rows laid out for attention. The eviction strategies write a token's heads and move an eviction's rows in one call
// each; every ring and partial-key logit is one heads_logits launch per layer; HybridGen's copies are
// one transfer per layer and tier and its selected V rows one copy_rows launch. H2O's and
// Keyformer's scores accumulate and are ranked on the accelerator (only the victims' slots come
// back); InfiniGen sends its speculated scores to the host for its top-k (d2h bytes grow with the
// context).
TEST(DeviceCallBudgets, LaunchesCopiesAndSyncsPerDecodeStepAndLayer) {
  struct Growth {
    double launches_per_head = 0, copies_per_head = 0;
    bool scores_to_host = false;  // attention scores cross to the host each step (d2h bytes grow with the context)
  };
  const auto growth = [](const std::string& name, const std::map<std::string, std::string>&) -> Growth {
    if (name == "infinigen") return {0, 0, true};
    return {};  // full, flexgen, moe_lightning
  };
  auto cases = test::offloading_cases("3");
  cases.insert(cases.begin(), {"full", {}});
  for (const auto& [name, params] : cases) {
    const std::string what = test::case_label(name, params);
    const StepCalls base = step_calls(name, params, 2, 24);
    const StepCalls longer = step_calls(name, params, 2, 48);
    const StepCalls heads = step_calls(name, params, 4, 24);
    const Growth g = growth(name, params);
    ::testing::Message msg;
    msg << what << ": launches " << base.launches << " / " << longer.launches << " (2x context) / " << heads.launches
        << " (2x KV heads); copies " << base.copies << " / " << longer.copies << " / " << heads.copies << "; syncs "
        << base.syncs << " / " << longer.syncs << " / " << heads.syncs << "; d2h bytes " << base.d2h_bytes << " / "
        << longer.d2h_bytes;
    SCOPED_TRACE(msg);
    EXPECT_GT(base.launches, 0);
    EXPECT_DOUBLE_EQ(longer.syncs, base.syncs);
    EXPECT_DOUBLE_EQ(heads.syncs, base.syncs);
    EXPECT_DOUBLE_EQ(longer.copies, base.copies);
    EXPECT_DOUBLE_EQ((heads.copies - base.copies) / 2, g.copies_per_head);
    if (g.scores_to_host) {
      EXPECT_GT(longer.d2h_bytes, base.d2h_bytes);
    } else {
      EXPECT_DOUBLE_EQ(longer.d2h_bytes, base.d2h_bytes);
    }
    EXPECT_DOUBLE_EQ(longer.launches, base.launches);
    EXPECT_DOUBLE_EQ((heads.launches - base.launches) / 2, g.launches_per_head);
  }
}

}  // namespace
}  // namespace hg
