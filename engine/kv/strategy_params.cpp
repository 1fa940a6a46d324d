// Strategy parameter validation.
#include "engine/kv/strategy_params.h"

#include <charconv>
#include <cmath>

#include "engine/core/error.h"
#include "engine/core/yaml_util.h"

namespace hg {

std::string param_type_name(ParamSpec::Type t) {
  switch (t) {
    case ParamSpec::Type::kInt: return "int";
    case ParamSpec::Type::kFloat: return "float";
    case ParamSpec::Type::kBool: return "bool";
    case ParamSpec::Type::kEnum: return "enum";
  }
  return "?";
}

ParamSpec kv_dtype_param() {
  return {"kv_dtype", ParamSpec::Type::kEnum, "f16", "",
          "element type of the KV cache: what is stored, moved over the link and read by attention",
          {"f32", "f16", "bf16"}};
}

ParamSpec budget_param() {
  return {"budget", ParamSpec::Type::kFloat, "0", "ratio",
          "attended fraction of the current context, the same for every budgeted method (0: the method's own "
          "budget parameters)",
          {}, 0.0, 1.0};
}

ParamSpec overlap_param() {
  return {"overlap", ParamSpec::Type::kBool, "true", "",
          "prefetch layer i+1's KV while layer i computes (false: every load waited for where it is needed)", {}};
}

namespace {
bool valid(const ParamSpec& p, const std::string& v) {
  switch (p.type) {
    case ParamSpec::Type::kInt: {
      int64_t x;
      auto [e, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      return ec == std::errc() && e == v.data() + v.size();
    }
    case ParamSpec::Type::kFloat: {
      try {
        size_t n = 0;
        std::stod(v, &n);
        return n == v.size();
      } catch (...) {
        return false;
      }
    }
    case ParamSpec::Type::kBool: return v == "true" || v == "false";
    case ParamSpec::Type::kEnum:
      for (auto& c : p.choices)
        if (c == v) return true;
      return false;
  }
  return false;
}
}  // namespace

StrategyParams::StrategyParams(const std::string& owner, const std::vector<ParamSpec>& schema,
                               const std::map<std::string, std::string>& values)
    : owner_(owner) {
  std::vector<std::string> names;
  for (auto& p : schema) {
    names.push_back(p.name);
    v_[p.name] = p.dflt;
  }
  for (auto& [k, v] : values) {
    const ParamSpec* spec = nullptr;
    for (auto& p : schema)
      if (p.name == k) spec = &p;
    if (!spec) {
      if (names.empty()) input_error("strategy {}: takes no parameters (got '{}')", owner, k);
      input_error("strategy {}: unknown parameter '{}' (did you mean '{}'?)", owner, k, nearest_key(k, names));
    }
    if (!valid(*spec, v)) {
      std::string expect = param_type_name(spec->type);
      if (spec->type == ParamSpec::Type::kEnum) {
        expect = "one of";
        for (auto& c : spec->choices) expect += " " + c;
      }
      input_error("strategy {}: {}={} is not valid (expected {})", owner, k, v, expect);
    }
    if (spec->type == ParamSpec::Type::kInt || spec->type == ParamSpec::Type::kFloat) {
      const double x = std::stod(v);
      if (!(x >= spec->min && x <= spec->max)) {
        auto num = [](double b) { return fmt::format("{}", b); };
        const std::string range = std::isinf(spec->max) ? ">= " + num(spec->min)
                                  : std::isinf(spec->min) ? "<= " + num(spec->max)
                                                          : "in [" + num(spec->min) + ", " + num(spec->max) + "]";
        input_error("strategy {}: {}={} is out of range (expected {})", owner, k, v, range);
      }
    }
    v_[k] = v;
    given_.insert(k);
  }
}

const std::string& StrategyParams::get(const std::string& name) const {
  auto it = v_.find(name);
  if (it == v_.end()) throw std::logic_error("strategy " + owner_ + ": no parameter " + name);
  return it->second;
}
int64_t StrategyParams::get_int(const std::string& name) const { return std::stoll(get(name)); }
double StrategyParams::get_float(const std::string& name) const { return std::stod(get(name)); }
bool StrategyParams::get_bool(const std::string& name) const { return get(name) == "true"; }

}  // namespace hg
