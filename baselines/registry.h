// KV strategies, registered explicitly in register_strategies() (baselines/registry.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/model.h"
#include "engine/decoder/kv_strategy.h"
#include "engine/decoder/strategy_params.h"

namespace hg {

class Runtime;
enum class DeviceKind : uint8_t;

// What a strategy is built with: the accelerator's backend and, when the run has one, the
// runtime (tiers, queues, transfers). Without a runtime a strategy keeps KV in host memory.
struct StrategyContext {
  Backend& backend;
  Runtime* runtime = nullptr;
  const Model* model = nullptr;  // weights, for strategies that speculate (InfiniGen, HybridGen)
};

struct StrategyInfo {
  std::string name;
  std::string doc;
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<KvStrategy>(const StrategyContext&, const StrategyParams&)> make;
  // Runs on the CUDA device (its accelerator-side buffers behind the backend's interface); every
  // strategy runs on the cpu and emulated devices.
  bool runs_on_cuda = false;
};

// UnsupportedError (exit 2) when `info`'s strategy does not run on `device`, naming those that do.
void check_strategy_device(const StrategyInfo& info, DeviceKind device);

const std::vector<StrategyInfo>& strategies();
// Throws InputError naming the known strategies when `name` is not one.
// values: parameter overrides (`--set name.param=value`), validated against the schema.
std::unique_ptr<KvStrategy> make_strategy(const std::string& name, const StrategyContext& ctx,
                                          const std::map<std::string, std::string>& values = {});
const StrategyInfo& strategy_info(const std::string& name);

}  // namespace hg
