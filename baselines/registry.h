// KV strategies, registered explicitly in register_strategies() (baselines/registry.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/model.h"
#include "engine/kv/kv_strategy.h"
#include "engine/kv/strategy_params.h"

namespace hg {

class Runtime;
enum class DeviceKind : uint8_t;

// What a strategy is built with: the accelerator's backend and, when the run has one, the
// runtime (tiers, queues, transfers). Without a runtime a strategy keeps KV in host memory.
struct StrategyContext {
  Backend& backend;
  Runtime* runtime = nullptr;
  const Model* model = nullptr;  // weights, for strategies that speculate (InfiniGen, HybridGen)
  bool native_16bit_kv = false;  // set by make_strategy from StrategyInfo
};

struct StrategyInfo {
  std::string name;
  std::string doc;
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<KvStrategy>(const StrategyContext&, const StrategyParams&)> make;
  // Runs on the CUDA device (its accelerator-side buffers behind the backend's interface); every
  // strategy runs on the cpu and emulated devices.
  bool runs_on_cuda = false;
  // Attends to a subset of the context and obeys the shared `budget` parameter (budget_param()).
  bool budgeted = false;
  // Stores its KV in 16-bit types on the real (not dry) path of a host-memory accelerator; without
  // it a 16-bit kv_dtype runs as F32 there and rows say so (KvStrategy::effective_params()).
  bool native_16bit_kv = false;
};

// UnsupportedError (exit 2) when `info`'s strategy does not run on `device`, naming those that do.
void check_strategy_device(const StrategyInfo& info, DeviceKind device);

const std::vector<StrategyInfo>& strategies();
// Throws InputError naming the known strategies when `name` is not one.
// values: parameter overrides (`--set name.param=value`), validated against the schema.
std::unique_ptr<KvStrategy> make_strategy(const std::string& name, const StrategyContext& ctx,
                                          const std::map<std::string, std::string>& values = {});
const StrategyInfo& strategy_info(const std::string& name);

// The KV element type a strategy was asked for (`kv_dtype`), and the one it stores: the requested
// type in dry runs (bytes are counted at its size) and where the strategy's kernels read it
// (StrategyInfo::native_16bit_kv, on a host-memory backend), else F32. A strategy reports the difference in
// effective_params().
DType requested_kv_dtype(const StrategyParams& p);
DType effective_kv_dtype(const StrategyContext& ctx, const StrategyParams& p);

}  // namespace hg
