// KV strategies, registered explicitly in register_strategies() (baselines/registry.cpp).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/decoder/kv_strategy.h"

namespace hg {

struct StrategyInfo {
  std::string name;
  std::string doc;
  std::function<std::unique_ptr<KvStrategy>(Backend&)> make;
};

const std::vector<StrategyInfo>& strategies();
// Throws InputError naming the known strategies when `name` is not one.
std::unique_ptr<KvStrategy> make_strategy(const std::string& name, Backend& backend);

}  // namespace hg
