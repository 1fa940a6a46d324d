// The one place strategies are registered.
#include "baselines/registry.h"


#include "baselines/full/full.h"
#include "baselines/null/null.h"
#include "engine/core/error.h"
#include "engine/runtime/runtime.h"

namespace hg {

StrategyInfo flexgen_info();
StrategyInfo moe_lightning_info();
StrategyInfo h2o_info();
StrategyInfo keyformer_info();
StrategyInfo streamingllm_info();
StrategyInfo snapkv_info();
StrategyInfo hybridgen_info();
StrategyInfo infinigen_info();

namespace {
std::vector<StrategyInfo> register_strategies() {
  std::vector<StrategyInfo> s;
  s.push_back({"full", "all KV on the accelerator, exact attention (the oracle)",
               {},
               [](const StrategyContext& c, const StrategyParams& p) {
                 return std::make_unique<FullStrategy>(c.backend, c.runtime, effective_kv_dtype(c, p),
                                                       requested_kv_dtype(p));
               },
               /*runs_on_cuda=*/true, /*budgeted=*/false, /*native_16bit_kv=*/true});
  s.push_back(flexgen_info());
  s.push_back(moe_lightning_info());
  s.push_back(h2o_info());
  s.push_back(keyformer_info());
  s.push_back(streamingllm_info());
  s.push_back(infinigen_info());
  s.push_back(hybridgen_info());
  s.push_back(snapkv_info());
  s.push_back({"null", "no KV, zero attention output: not a method; measures the harness's own overhead", {},
               [](const StrategyContext&, const StrategyParams&) { return std::make_unique<NullStrategy>(); }});
  // The shared parameters, declared once: every method stores and moves KV of one element type,
  // and every budgeted method reads one attended fraction.
  for (auto& i : s) {
    if (i.name == "null") continue;
    i.params.push_back(kv_dtype_param());
    if (i.budgeted) i.params.push_back(budget_param());
  }
  return s;
}
}  // namespace

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> s = register_strategies();
  return s;
}

void check_strategy_device(const StrategyInfo& info, DeviceKind device) {
  if (device != DeviceKind::kCuda || info.runs_on_cuda) return;
  std::string on;
  for (auto& s : strategies())
    if (s.runs_on_cuda) on += (on.empty() ? "" : ", ") + s.name;
  throw UnsupportedError(fmt::format("strategy {} does not run on the cuda device yet ({} do); use --device emulated",
                                     info.name, on));
}

DType requested_kv_dtype(const StrategyParams& p) {
  DType t = DType::kF32;
  if (p.all().count("kv_dtype")) parse_dtype(p.get("kv_dtype"), &t);
  return t;
}

DType effective_kv_dtype(const StrategyContext& ctx, const StrategyParams& p) {
  const DType want = requested_kv_dtype(p);
  if (want == DType::kF32) return want;
  if (ctx.runtime && ctx.runtime->dry()) return want;  // dry: no values; bytes at the element size
  return ctx.native_16bit_kv ? want : DType::kF32;
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
  if (ctx.runtime) check_strategy_device(info, ctx.runtime->device());
  StrategyContext c = ctx;
  c.native_16bit_kv = info.native_16bit_kv;
  return info.make(c, std::move(params));
}

}  // namespace hg
