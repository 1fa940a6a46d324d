// Shared helpers of the strategy tests: teacher-forced runs on the emulated accelerator and
// the ref oracle, step-by-step logit comparison, and the brute-force check of H2O's and
// Keyformer's eviction order.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "baselines/full/full.h"
#include "baselines/registry.h"
#include "engine/decoder/generate.h"
#include "engine/kv/slot_store.h"
#include "engine/runtime/runtime.h"
#include "test_util.h"

namespace hg::test {

// Teacher-forced run: prefill `prompt` tokens of `toks`, then one decode step per remaining token.
// Returns the logits of the last prompt row and of every decode step; calls on_step(step) after each.
std::vector<std::vector<float>> step_logits(const Model& m, Backend& be, KvStrategy& kv, const std::vector<int32_t>& toks,
                                            int prompt, const std::function<void(int)>& on_step = {}, int max_rows = 512);
std::vector<int32_t> token_stream(int n, int vocab, uint64_t seed);
// Loads a synthetic spec or a ../shared path; empty when the shared file is absent.
std::optional<Model> load_test_model(const std::string& spec);
// Runs strategy `name` on the emulated accelerator over `toks` (teacher-forced, `prompt` tokens of
// prefill); `after` sees the runtime and the strategy once the run is over.
std::vector<std::vector<float>> emulated_step_logits(const Model& m, const std::string& name,
                                                     const std::map<std::string, std::string>& params,
                                                     const std::vector<int32_t>& toks, int prompt,
                                                     std::function<void(Runtime&, KvStrategy&)> after = {});
// Every step's logits within rtol of the step's largest |want| (absolute) and rtol (relative).
void expect_steps_close(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                        double rtol, const std::string& what);
// Runs `name` with `params` on the emulated accelerator and compares its logits at every
// teacher-forced step with the ref oracle's (atol = rtol·max|logit|).
void expect_matches_oracle(const Model& m, const std::string& name, const std::map<std::string, std::string>& params,
                           const std::vector<int32_t>& toks, int prompt, double rtol, const std::string& what,
                           std::function<void(Runtime&, KvStrategy&)> after = {});
// The per-head retained positions of layer l, head g, read from the store.
std::set<int32_t> held(const SlotStore& st, int l, int g);
// Drives a 1-layer eviction strategy with seeded q/k/v rows and checks every eviction against a
// brute-force re-implementation (double precision, explicit sets).
void brute_force_check(const std::string& name, const std::map<std::string, std::string>& params);
// The cases a strategy's own test file registers for the suites every strategy passes
// (test_strategy_contract.cpp, test_accuracy.cpp); a registered strategy (but `null`) without
// them fails Strategies.EveryRegisteredStrategy*. A new strategy adds its cases where its tests are:
//   const bool kRegistered = register_strategy_cases({"name", {small-budget params}, {exact}, {budget}});
// Exact: its logits match the ref oracle's at every decode step (settings under which nothing is
// evicted, or everything selected).
struct ExactCase {
  std::string model;  // synthetic spec or a ../shared path
  std::string strategy;
  std::map<std::string, std::string> params;
};
// Budgeted: it holds exactly budget(n) tokens per KV head once the context holds n tokens.
struct BudgetCase {
  std::string strategy;
  std::map<std::string, std::string> params;
  std::function<int32_t(int32_t)> budget;
};
// Small budgets, so that eviction, offloading and selection act within a few dozen tokens (HybridGen
// at a fixed K: its adaptive K follows measured times): the fork and batched-scoring suites.
struct StrategyCase {
  std::string strategy;
  std::map<std::string, std::string> params;
};
struct StrategyCases {
  std::string strategy;
  std::map<std::string, std::string> small_budget;
  std::vector<ExactCase> exact;
  std::vector<BudgetCase> budget;
};
// Called from a namespace-scope initializer; returns true. Each list is in strategy-name order.
bool register_strategy_cases(StrategyCases c);
std::vector<ExactCase> exact_cases();
std::vector<BudgetCase> budget_cases();
std::vector<StrategyCase> small_budget_cases();
// Keyformer's noise written independently of the strategy (test_keyformer.cpp).
double ref_gumbel(uint64_t seed, int layer, int seq, int row, int head, int32_t pos);

}  // namespace hg::test
