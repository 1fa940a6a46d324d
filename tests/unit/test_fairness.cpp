// Equal footing by construction: every strategy stores and moves KV of one element type (F16 by
// default), budgeted methods read one attended fraction, the offloading methods share FlexGen's
// overlap schedule, the prefill writes each prompt token's KV once, and the rows say how much of the
// context each method attended. Dry runs on the paper's machine A: the same code paths, no values.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "baselines/registry.h"
#include "engine/core/error.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/spec.h"
#include "test_util.h"

namespace hg {
namespace {
using Json = nlohmann::ordered_json;

// One dry run per strategy entry of `strategies` (YAML list) at one point; rows by label.
std::map<std::string, Json> dry_rows(const std::string& strategies, int prompt, int decode, int batch = 1,
                                     const std::vector<std::string>& sets = {}) {
  const std::string y = "name: f\nmodels: [\"synthetic:llama-3.2-1b?layers=2\"]\nstrategies: " + strategies +
                        "\nsweep:\n  prompt_tokens: [" + std::to_string(prompt) + "]\n  decode_tokens: [" +
                        std::to_string(decode) + "]\n  batch: [" + std::to_string(batch) +
                        "]\ndevice: emulated\nclock: modeled:machine-a\nexecute: dry\n";
  ExperimentSpec spec = parse_experiment(y, "f.yaml", sets);
  Runner run(spec);
  std::map<std::string, Json> out;
  for (const Point& p : expand(spec))
    for (auto& e : spec.strategies) run.run(p, e, {}, [&](Json r) { out[e.label] = r; });
  for (auto& [l, r] : out) EXPECT_EQ(r["status"], "ok") << l << ": " << r.dump();
  return out;
}

// parse_experiment's InputError message for `yaml` as f.yaml; "" when it parses.
std::string parse_error(const std::string& yaml) {
  return test::input_error_of([&] { parse_experiment(yaml, "f.yaml"); });
}

double link(const Json& r, const char* field, const char* name) {
  return r[field].contains(name) ? r[field][name].get<double>() : 0.0;
}

TEST(FairFooting, EveryStrategyDeclaresTheSharedParameters) {
  for (const auto& s : strategies()) {
    if (s.name == "null") continue;
    std::map<std::string, const ParamSpec*> by;
    for (auto& p : s.params) by[p.name] = &p;
    ASSERT_TRUE(by.count("kv_dtype")) << s.name;
    EXPECT_EQ(by["kv_dtype"]->dflt, "f16") << s.name;
    EXPECT_EQ(by.count("budget"), s.budgeted ? 1u : 0u) << s.name;
  }
  // A range lives in the schema: it is an error when the parameters are read, before any run.
  for (auto [strategy, param, value] : {std::tuple{"hybridgen", "k_min", "0"}, {"hybridgen", "budget", "1.5"},
                                        {"h2o", "kv_ratio", "-0.1"}, {"streamingllm", "window", "0"}}) {
    const StrategyInfo& info = strategy_info(strategy);
    try {
      StrategyParams(strategy, info.params, {{param, value}});
      ADD_FAILURE() << strategy << "." << param << "=" << value << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(parse_experiment("name: f\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [{name: hybridgen, "
                                "params: {k_min: 0}}]\n",
                                "f.yaml"),
               InputError);
}

// The real path stores what was asked for: on the emulated accelerator (host memory) every
// strategy keeps K and V rows of the requested type.
TEST(FairFooting, EveryStrategyStoresTheRequestedKvTypeOnTheEmulatedAccelerator) {
  Model m = load_model("synthetic:tiny-llama");
  for (const auto& s : strategies()) {
    if (s.name == "null") continue;
    for (const char* dt : {"f16", "bf16", "f32"}) {
      RuntimeConfig rc;
      rc.device = "emulated";
      Runtime rt(rc);
      auto kv = make_strategy(s.name, StrategyContext{rt.accel_backend(), &rt, &m}, {{"kv_dtype", dt}});
      ASSERT_TRUE(kv);
      EXPECT_EQ(std::string(dtype_name(kv->kv_dtype())), dt) << s.name;
      EXPECT_FALSE(kv->effective_params().count("kv_dtype")) << s.name << " " << dt;
    }
  }
}

// Prefill link bytes: each prompt token's K and V go to the host once (2 bytes per element), and
// nothing stored is read back, except FlexGen's prefetch of layer 0 for the first decode step.
// InfiniGen reads the prompt's KV back for its partial-key cache and prefill attention (its own
// method's calibration and a departure documented in docs/strategies.md): not checked here.
TEST(FairFooting, PrefillWritesEachTokensKvOnceAndReadsNothingBack) {
  const int prompt = 2048, layers = 2, kv_heads = 8, dim = 64;
  const double layer_kv = 2.0 * prompt * kv_heads * dim * 2;  // K and V of one layer, F16
  const auto rows =
      dry_rows("[full, flexgen, moe_lightning, h2o, keyformer, streamingllm, infinigen, hybridgen]", prompt, 2);
  for (auto& [label, r] : rows) {
    const double up = link(r, "link_bytes_prefill", "dram->gpu"), down = link(r, "link_bytes_prefill", "gpu->dram");
    if (label == "full") {
      EXPECT_EQ(up + down, 0) << label;
      continue;
    }
    const double per_layer = layer_kv;
    if (label == "hybridgen")  // the resident ring's newest 1024 tokens stay on the accelerator
      EXPECT_EQ(down, layers * per_layer * (prompt - 1024) / prompt) << label;
    else if (label == "infinigen")  // + the calibration prompt's F32 queries (32 heads) for the host's SVD
      EXPECT_EQ(down, layers * (per_layer + double(prompt) * 32 * dim * 4)) << label;
    else
      EXPECT_EQ(down, layers * per_layer) << label;
    EXPECT_EQ(up, label == "flexgen" ? per_layer : 0.0) << label;
  }
}

// FlexGen's schedule for every method that loads KV from host memory each step: with overlap the
// modeled step is within a few percent of max(accelerator, transfer); without it the step is
// their sum.
TEST(FairFooting, OverlappedStepIsTheMaxOfAcceleratorAndTransfer) {
  const std::string list = "[flexgen, h2o, {name: keyformer, params: {kv_ratio: 0.9}}, {name: streamingllm, params: "
                           "{window: 8000}}]";
  for (const char* overlap : {"true", "false"}) {
    std::vector<std::string> sets;
    for (const char* s : {"flexgen", "h2o", "keyformer", "streamingllm"})
      sets.push_back(std::string("sweep.") + s + ".overlap=[" + overlap + "]");
    for (auto& [label, r] : dry_rows(list, 16384, 32, 1, sets)) {
      const Json& p = r["figures"]["modeled"]["pipeline"];
      const double crit = p["critical_s"], accel = p["accel_s"], xfer = p["transfer_s"];
      ASSERT_GT(xfer, 0.2 * accel) << label << ": the check needs a transfer-heavy step";
      if (std::string(overlap) == "true")
        EXPECT_LT(crit, 1.05 * std::max(accel, xfer)) << label << " crit " << crit << " accel " << accel << " xfer " << xfer;
      else
        EXPECT_GT(crit, 0.95 * (accel + xfer)) << label << " crit " << crit << " accel " << accel << " xfer " << xfer;
    }
  }
}

// One budget for all: the `budget` axis sets every budgeted method to the same attended fraction,
// and every row reports what it attended (HybridGen's scheduler may raise K above K_min: at least;
// InfiniGen's first full_layers, and always layer 0, attend everything).
TEST(FairFooting, BudgetAxisMatchesTheAttendedFraction) {
  const std::string y = R"(name: f
models: ["synthetic:llama-3.2-1b?layers=2"]
strategies: [flexgen, h2o, keyformer, streamingllm, {name: infinigen, params: {full_layers: 0}}, hybridgen]
sweep:
  prompt_tokens: [8192]
  decode_tokens: [4]
  budget: [0.1]
device: emulated
clock: modeled:machine-a
execute: dry
)";
  ExperimentSpec spec = parse_experiment(y, "f.yaml");
  Runner run(spec);
  const Point p = expand(spec).at(0);
  for (auto& e : spec.strategies)
    run.run(p, e, {}, [&](Json r) {
      ASSERT_EQ(r["status"], "ok") << r.dump();
      const Json& a = r["figures"]["attended"];
      const double f = a["fraction"];
      if (e.name == "flexgen") EXPECT_DOUBLE_EQ(f, 1.0);
      else if (e.name == "infinigen")  // layer 0 of 2 loads its full KV (nothing to speculate from)
        EXPECT_NEAR(f, (1 + 0.1) / 2, 0.01) << a.dump();
      else if (e.name == "hybridgen") {
        EXPECT_GE(f, 0.099) << e.name;
        EXPECT_GT(a["cpu_tokens"].get<double>(), 0) << e.name;
      } else {
        EXPECT_NEAR(f, 0.1, 0.01) << e.name << " " << a.dump();
      }
      EXPECT_EQ(r["figures"]["time_metric"], "end_to_end");
      EXPECT_NEAR(r["figures"]["time_s"].get<double>(),
                  r["figures"]["prefill_s"].get<double>() + r["figures"]["decode_s"].get<double>(), 1e-12);
    });
  // An axis no strategy of the file can obey is an error that names it.
  try {
    parse_experiment("name: f\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [flexgen]\nsweep:\n  budget: [0.1]\n",
                     "f.yaml");
    ADD_FAILURE() << "budget axis without a budgeted strategy was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
  }
}

// One accelerator KV budget for all (gpu_kv_bytes): every strategy's resident and staged KV on the
// gpu tier stays within it, by construction (the memory system refuses more, naming the budget),
// and what fits stays there: HybridGen's ring shrinks or grows to fit; FlexGen and the eviction methods keep
// as many whole layers there as fit beside two staging layers and stream the rest. 8 layers of the
// 1B shape at 2K: the whole F16 KV is 33.6 MB, one layer of it 4.2 MB.
TEST(FairFooting, EveryStrategyKeepsItsAcceleratorKvWithinOneBudget) {
  for (const int64_t budget : {int64_t(16) << 20, int64_t(64) << 20}) {
    const std::string y = "name: f\nmodels: [\"synthetic:llama-3.2-1b?layers=8\"]\nstrategies: [full, flexgen, "
                          "moe_lightning, h2o, keyformer, streamingllm, infinigen, hybridgen]\nsweep:\n  "
                          "prompt_tokens: [2048]\n  decode_tokens: [4]\n  gpu_kv_bytes: [" +
                          std::to_string(budget) + "]\ndevice: emulated\nclock: modeled:machine-a\nexecute: dry\n";
    ExperimentSpec spec = parse_experiment(y, "f.yaml");
    Runner run(spec);
    const Point p = expand(spec).at(0);
    std::map<std::string, Json> rows;
    for (auto& e : spec.strategies) run.run(p, e, {}, [&](Json r) { rows[e.label] = r; });
    // One layer of the whole KV (2052 tokens, 8 KV heads of 64, K and V at F16).
    const int64_t layer = int64_t(2052) * 8 * 64 * 2 * 2, whole = 8 * layer;
    for (auto& [label, r] : rows) {
      SCOPED_TRACE(label + " at " + std::to_string(budget) + " bytes");
      EXPECT_EQ(r["point"]["gpu_kv_bytes"], budget);
      if (label == "full" && budget < (int64_t(32) << 20)) {  // the oracle cannot offload
        EXPECT_EQ(r["status"], "failed") << r.dump();
        EXPECT_NE(r.value("reason", "").find("gpu_kv_bytes"), std::string::npos) << r.dump();
        continue;
      }
      ASSERT_EQ(r["status"], "ok") << r.dump();
      const Json& g = r["tiers"]["gpu"];
      EXPECT_EQ(g["kv_budget_bytes"], budget);
      EXPECT_LE(g["kv_peak_bytes"].get<int64_t>(), budget);
      if (label != "moe_lightning") {
        EXPECT_GT(g["kv_peak_bytes"].get<int64_t>(), 0);
      }
      // Nobody starved: FlexGen (its cache_gpu share) and the eviction methods (their stores, a
      // layer each while the prompt is held) keep whole layers resident beside two staging layers,
      // so they leave less than one layer of the budget unused, or hold all; HybridGen's ring,
      // shrunk to fit, leaves under 10 %.
      const int64_t peak = g["kv_peak_bytes"].get<int64_t>();
      const bool evicting = label == "h2o" || label == "keyformer" || label == "streamingllm";
      if (label == "flexgen" || evicting) {
        if (budget < whole) {
          EXPECT_GE(peak, budget - layer) << r.dump();
        }
        EXPECT_EQ(r["requested_vs_effective"].value(evicting ? "gpu_kv_layers" : "cache_gpu_layers", ""),
                  budget < whole ? "1" : "8");
      }
      if (label == "hybridgen" && budget < whole) {
        EXPECT_GE(double(peak), 0.9 * double(budget));
      }
    }
    const Json& rve_h2o = rows["h2o"]["requested_vs_effective"];
    const Json& rve_hg = rows["hybridgen"]["requested_vs_effective"];
    if (budget < (int64_t(32) << 20)) {
      EXPECT_EQ(rve_h2o.value("kv_home", ""), "split") << rve_h2o.dump();
      ASSERT_TRUE(rve_hg.contains("gpu_kv_tokens")) << rve_hg.dump();
      EXPECT_LT(std::stoi(rve_hg["gpu_kv_tokens"].get<std::string>()), 1024);
    } else {
      EXPECT_EQ(rve_h2o.value("kv_home", ""), "gpu") << rve_h2o.dump();
      // Its default ring grows to the whole context when that fits (prompt + decode tokens).
      EXPECT_EQ(rve_hg.value("gpu_kv_tokens", ""), "2052") << rve_hg.dump();
    }
  }
}

// gpu_kv_share: the budget as a share of each point's whole KV (16-bit elements, prompt + decode
// tokens, every layer and sequence), resolved per point and recorded beside the share.
TEST(FairFooting, KvShareIsThePointsShareOfItsWholeKv) {
  const std::string y =
      "name: f\nmodels: [\"synthetic:llama-3.2-1b?layers=8\"]\nstrategies: [flexgen]\nsweep:\n  "
      "prompt_tokens: [1024, 2048]\n  decode_tokens: [4]\n  batch: [2]\n  gpu_kv_share: [0.5]\n"
      "device: emulated\nclock: modeled:machine-a\nexecute: dry\n";
  ExperimentSpec spec = parse_experiment(y, "f.yaml");
  Runner run(spec);
  for (const Point& p : expand(spec)) {
    Json row;
    run.run(p, spec.strategies.at(0), {}, [&](Json r) { row = r; });
    ASSERT_EQ(row["status"], "ok") << row.dump();
    const int64_t whole = int64_t(2) * (p.prompt_tokens + 4) * 8 * 8 * 64 * 2 * 2;
    EXPECT_EQ(row["point"]["gpu_kv_share"], 0.5);
    EXPECT_EQ(row["tiers"]["gpu"]["kv_budget_bytes"].get<int64_t>(), whole / 2);
    EXPECT_LE(row["tiers"]["gpu"]["kv_peak_bytes"].get<int64_t>(), whole / 2);
  }
  // Both ways of setting the budget in one file are refused, naming the line.
  const std::string both = parse_error(
      "name: f\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [flexgen]\nsweep:\n  gpu_kv_bytes: [1000]\n"
      "  gpu_kv_share: [0.5]\n");
  EXPECT_NE(both.find("f.yaml:6"), std::string::npos) << "gpu_kv_share beside gpu_kv_bytes: '" << both << "'";
  const std::string zero = parse_error(
      "name: f\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [flexgen]\nsweep:\n  gpu_kv_share: [0]\n");
  EXPECT_NE(zero.find("gpu_kv_share"), std::string::npos) << "a share of 0: '" << zero << "'";
}

// Two regimes in one table: an entry's own gpu_kv_share replaces the point's, so `full` runs with
// the whole KV on the accelerator beside methods that hold half of it; the row says so.
TEST(FairFooting, AnEntrysShareIsTheFitsRegime) {
  const std::string y =
      "name: f\nmodels: [\"synthetic:llama-3.2-1b?layers=8\"]\nstrategies:\n  - flexgen\n  - full\n"
      "  - {name: full, label: full@fits, gpu_kv_share: 1}\nsweep:\n  prompt_tokens: [1024]\n  "
      "decode_tokens: [4]\n"
      "  gpu_kv_share: [0.5]\ndevice: emulated\nclock: modeled:machine-a\nexecute: dry\n";
  ExperimentSpec spec = parse_experiment(y, "f.yaml");
  Runner run(spec);
  const Point p = expand(spec).at(0);
  std::map<std::string, Json> rows;
  for (auto& e : spec.strategies) run.run(p, e, {}, [&](Json r) { rows[e.label] = r; });
  const int64_t whole = int64_t(1028) * 8 * 8 * 64 * 2 * 2;
  EXPECT_EQ(rows["flexgen"]["tiers"]["gpu"]["kv_budget_bytes"].get<int64_t>(), whole / 2);
  EXPECT_EQ(rows["full"]["status"], "failed") << rows["full"].dump();  // half the KV: the oracle cannot run
  ASSERT_EQ(rows["full@fits"]["status"], "ok") << rows["full@fits"].dump();
  EXPECT_EQ(rows["full@fits"]["tiers"]["gpu"]["kv_budget_bytes"].get<int64_t>(), whole);
  EXPECT_EQ(rows["full@fits"]["entry_gpu_kv_share"], 1.0);
  EXPECT_EQ(rows["full@fits"]["point_id"], rows["flexgen"]["point_id"]);  // the same column of the table
  const std::string x = parse_error(
      "name: f\nmodels: [\"synthetic:tiny-llama\"]\nstrategies:\n  - {name: full, gpu_kv_share: x}\n");
  EXPECT_NE(x.find("f.yaml:4"), std::string::npos) << "a share 'x': '" << x << "'";
}

// Every modeled row carries its band (peak and achieved ends), the achieved end no faster, and
// table.txt gives each cell as the band of the two ends' ratios.
TEST(FairFooting, ModeledRowsCarryTheirBand) {
  for (auto& [label, r] : dry_rows("[flexgen, hybridgen]", 2048, 4)) {
    SCOPED_TRACE(label);
    const Json& b = r["figures"]["modeled"]["band"];
    const double pk = b["peak"]["end_to_end_s"], ac = b["achieved"]["end_to_end_s"];
    EXPECT_GT(pk, 0);
    EXPECT_GT(ac, pk);
    // machine-a is a datasheet profile: the row's own figure is the peak end.
    EXPECT_DOUBLE_EQ(r["figures"]["time_s"].get<double>(), pk);
    EXPECT_GT(b["achieved"]["decode_tokens_per_s"].get<double>(), 0);
    EXPECT_NE(b["achieved_source"].get<std::string>().find("H200"), std::string::npos);
  }
}

// At a matched budget a row attends the budget (within 0.02 of the context) or says why not.
TEST(FairFooting, AnAttendedFractionOffItsBudgetSaysWhy) {
  const auto rows = dry_rows(
      "[{name: streamingllm, label: sl, params: {budget: 0.2}}, {name: hybridgen, label: hg, params: "
      "{budget: 0.2}}, {name: hybridgen, label: hg-ring, params: {budget: 0.2, gpu_kv_tokens: 1024}}]",
      2048, 4);
  // Under a budget HybridGen's own ring holds half of it and the CPU selects the other half.
  for (const char* label : {"sl", "hg"}) {
    const Json& a = rows.at(label)["figures"]["attended"];
    EXPECT_NEAR(a["fraction"].get<double>(), 0.2, 0.02) << label << " " << a.dump();
    EXPECT_FALSE(a.contains("budget_note")) << label << " " << a.dump();
  }
  const Json& hg = rows.at("hg")["figures"]["attended"];
  EXPECT_NEAR(hg["accel_tokens"].get<double>(), hg["cpu_tokens"].get<double>(), 0.02 * 2048) << hg.dump();
  // A ring the request sized above the budget is attended in full; the row says so.
  const Json& ring = rows.at("hg-ring")["figures"]["attended"];
  ASSERT_GT(std::abs(ring["fraction"].get<double>() - 0.2), 0.02) << ring.dump();
  ASSERT_TRUE(ring.contains("budget_note")) << ring.dump();
  EXPECT_NE(ring["budget_note"].get<std::string>().find("accelerator-resident tokens"), std::string::npos)
      << ring.dump();
}

// A dry run's band repeats to the last digit at both ends: stages submitted inside an accelerator
// segment are placed by the work it reported, never by the wall clock, even where the segment's
// only modeled cost is a fixed one.
TEST(FairFooting, DryBandRepeatsToTheDigit) {
  const auto a = dry_rows("[flexgen, h2o, hybridgen, infinigen]", 1024, 6);
  const auto b = dry_rows("[flexgen, h2o, hybridgen, infinigen]", 1024, 6);
  for (auto& [label, r] : a) {
    SCOPED_TRACE(label);
    const Json &x = r["figures"]["modeled"]["band"], &y = b.at(label)["figures"]["modeled"]["band"];
    for (const char* end : {"peak", "achieved"})
      for (const char* f : {"prefill_s", "end_to_end_s", "decode_token_s_median"})
        EXPECT_EQ(x[end][f].get<double>(), y[end][f].get<double>()) << end << "." << f;
  }
}

// HybridGen's speculative query (query_on: cpu) is one projection of all rows per layer: W_q is
// read once per layer whatever the batch, so batch 4 reads the keys of 4 sequences and W_q once.
TEST(FairFooting, HybridGenReadsWqOncePerLayerAtAnyBatch) {
  const std::string e = "[{name: hybridgen, params: {k: fixed, mode: post, gpu_kv_tokens: 256}}]";
  const Json one = dry_rows(e, 2048, 4, 1).at("hybridgen"), four = dry_rows(e, 2048, 4, 4).at("hybridgen");
  const double b1 = one["work_per_step"]["cpu"]["dram_bytes"], b4 = four["work_per_step"]["cpu"]["dram_bytes"];
  // llama-3.2-1b: W_q is 2048 × 2048 (F32 synthetic weights); layer 1 speculates (layer 0 uses
  // its true query).
  const double wq = 2048.0 * 2048 * 4;
  EXPECT_DOUBLE_EQ(4 * b1 - b4, 3 * wq) << "b1 " << b1 << " b4 " << b4;
}

}  // namespace
}  // namespace hg
