// Strategy parameters: each strategy declares its schema once (name, type, default, unit, doc);
// `hgbench strategies`, `--set S.param=value` and YAML use it. Values are validated strictly:
// an unknown name is an error with the nearest valid one, a bad value names what was expected.
#pragma once
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace hg {

// No upper bound (ParamSpec::max).
inline constexpr double kNoMax = std::numeric_limits<double>::infinity();

struct ParamSpec {
  enum class Type { kInt, kFloat, kBool, kEnum };
  std::string name;
  Type type = Type::kInt;
  std::string dflt;
  std::string unit;  // "tokens", "ratio", "" …
  std::string doc;
  std::vector<std::string> choices;  // for kEnum
  // Inclusive range of a kInt or kFloat value, checked when parameters are validated (`validate`,
  // `--set`, before any run).
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
};

// The parameters every KV strategy takes, declared once here so that a comparison holds them equal
// by construction: `kv_dtype` (element type of every K and V the strategy stores or moves; the
// paper's FP16 by default) for all, `budget` (the attended fraction of the context, matched across
// the budgeted methods) for those whose attention is not exact.
ParamSpec kv_dtype_param();
ParamSpec budget_param();
// The link schedule of every strategy that loads KV from host memory each step (FlexGen, and the
// eviction methods with kv_home dram): prefetch layer i+1's data while layer i runs, or serially.
ParamSpec overlap_param();

class StrategyParams {
 public:
  StrategyParams() = default;
  // Validates `values` against `schema` (for strategy `owner`) and fills defaults.
  StrategyParams(const std::string& owner, const std::vector<ParamSpec>& schema,
                 const std::map<std::string, std::string>& values);
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get(const std::string& name) const;
  // Whether the request set `name` (else it holds its default).
  bool given(const std::string& name) const { return given_.count(name) > 0; }
  // The effective settings, for result rows.
  const std::map<std::string, std::string>& all() const { return v_; }

 private:
  std::string owner_;
  std::map<std::string, std::string> v_;
  std::set<std::string> given_;
};

std::string param_type_name(ParamSpec::Type t);

}  // namespace hg
