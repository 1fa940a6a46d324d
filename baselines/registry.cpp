// The one place strategies are registered.
#include "baselines/registry.h"

#include <set>

#include "baselines/full/full.h"
#include "baselines/null/null.h"
#include "engine/core/error.h"

namespace hg {

StrategyInfo flexgen_info();
StrategyInfo moe_lightning_info();
StrategyInfo h2o_info();
StrategyInfo keyformer_info();
StrategyInfo streamingllm_info();
StrategyInfo hybridgen_info();
StrategyInfo infinigen_info();

namespace {
std::vector<StrategyInfo> register_strategies() {
  std::vector<StrategyInfo> s;
  s.push_back({"full", "all KV on the accelerator, exact attention (the oracle)",
               {{"kv_dtype", ParamSpec::Type::kEnum, "f32", "", "element type of the KV cache", {"f32", "f16", "bf16"}}},
               [](const StrategyContext& c, const StrategyParams& p) {
                 DType t = DType::kF32;
                 parse_dtype(p.get("kv_dtype"), &t);
                 return std::make_unique<FullStrategy>(c.backend, c.runtime, t);
               }});
  s.push_back(flexgen_info());
  s.push_back(moe_lightning_info());
  s.push_back(h2o_info());
  s.push_back(keyformer_info());
  s.push_back(streamingllm_info());
  s.push_back(infinigen_info());
  s.push_back(hybridgen_info());
  s.push_back({"null", "no KV, zero attention output: not a method; measures the harness's own overhead", {},
               [](const StrategyContext&, const StrategyParams&) { return std::make_unique<NullStrategy>(); }});
  return s;
}
}  // namespace

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> s = register_strategies();
  return s;
}

const StrategyInfo& strategy_info(const std::string& name) {
  std::string names;
  for (auto& s : strategies()) {
    if (s.name == name) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  input_error("unknown strategy '{}' (expected one of: {})", name, names);
}

std::unique_ptr<KvStrategy> make_strategy(const std::string& name, const StrategyContext& ctx,
                                          const std::map<std::string, std::string>& values) {
  const StrategyInfo& info = strategy_info(name);
  StrategyParams params(name, info.params, values);
  // On a CUDA device the accelerator's memory is device memory. `full` (F32 KV) and the strategies
  // that offload KV (flexgen, moe_lightning, hybridgen) keep their accelerator-side buffers behind
  // the backend's interface (tests/unit/test_device_contract.cpp); the others read and write host
  // pointers.
  if (ctx.runtime && ctx.runtime->device() == DeviceKind::kCuda) {
    static const std::set<std::string> on_device = {"full", "flexgen", "moe_lightning", "hybridgen"};
    if (!on_device.count(name))
      throw UnsupportedError(
          fmt::format("strategy {} does not run on the cuda device yet (full, flexgen, "
                      "moe_lightning and hybridgen do); use --device emulated",
                      name));
    if (name == "full" && params.get("kv_dtype") != "f32")
      throw UnsupportedError("strategy full on the cuda device: kv_dtype must be f32");
  }
  return info.make(ctx, std::move(params));
}

}  // namespace hg
