// KV strategies, registered explicitly in register_strategies() (baselines/registry.cpp).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/decoder/kv_strategy.h"

namespace hg {

class Runtime;

// What a strategy is built with: the accelerator's backend and, when the run has one, the
// runtime (tiers, queues, transfers). Without a runtime a strategy keeps KV in host memory.
struct StrategyContext {
  Backend& backend;
  Runtime* runtime = nullptr;
};

struct StrategyInfo {
  std::string name;
  std::string doc;
  std::function<std::unique_ptr<KvStrategy>(const StrategyContext&)> make;
};

const std::vector<StrategyInfo>& strategies();
// Throws InputError naming the known strategies when `name` is not one.
std::unique_ptr<KvStrategy> make_strategy(const std::string& name, const StrategyContext& ctx);

}  // namespace hg
