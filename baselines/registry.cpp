// The one place strategies are registered.
#include "baselines/registry.h"

#include "baselines/full/full.h"
#include "engine/core/error.h"

namespace hg {

namespace {
std::vector<StrategyInfo> register_strategies() {
  std::vector<StrategyInfo> s;
  s.push_back({"full", "all KV kept, exact attention (the oracle)",
               [](const StrategyContext& c) { return std::make_unique<FullStrategy>(c.backend, c.runtime); }});
  return s;
}
}  // namespace

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> s = register_strategies();
  return s;
}

std::unique_ptr<KvStrategy> make_strategy(const std::string& name, const StrategyContext& ctx) {
  std::string names;
  for (auto& s : strategies()) {
    if (s.name == name) return s.make(ctx);
    names += (names.empty() ? "" : ", ") + s.name;
  }
  input_error("unknown strategy '{}' (expected one of: {})", name, names);
}

}  // namespace hg
