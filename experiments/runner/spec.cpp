// Experiment spec: strict parsing, overrides, expansion.
#include "experiments/runner/spec.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "baselines/registry.h"
#include "datasets/tasks.h"
#include "engine/core/error.h"
#include "engine/decoder/host_estimate.h"
#include "engine/core/json_text.h"
#include "engine/core/mapped_file.h"
#include "engine/core/yaml_util.h"
#include "engine/runtime/clock.h"
#include "engine/tokenizer/chat_template.h"

namespace hg {
namespace {

const std::vector<std::string> kTopKeys = {"name",  "description", "models", "strategies", "baseline", "sweep", "device",
                                           "clock", "execute",     "repeats", "warmup",    "seed",     "output",
                                           "eval",  "limit",       "device_costs"};

// "file:line" of a node, or "file (--set)" for a node an override made (it has no line).
std::string where(const std::string& file, const YAML::Node& n) {
  const int line = n.Mark().line;
  return line >= 0 && !n.Mark().is_null() ? fmt::format("{}:{}", file, line + 1) : fmt::format("{} (--set)", file);
}

[[noreturn]] void fail(const std::string& file, const YAML::Node& n, const std::string& msg) {
  throw InputError(where(file, n) + ": " + msg);
}

std::string scalar(const std::string& file, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) fail(file, n, fmt::format("'{}' must be a single value (a string or number)", key));
  return n.Scalar();
}

// An integer in [lo, hi] (hi: the field's type's largest by default, so nothing narrows).
int64_t integer(const std::string& file, const YAML::Node& n, const std::string& key, int64_t lo,
                int64_t hi = std::numeric_limits<int64_t>::max()) {
  const std::string s = scalar(file, n, key);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range && p == s.data() + s.size())
    fail(file, n, fmt::format("'{}' must be <= {}, got {}", key, hi, s));
  if (ec != std::errc() || p != s.data() + s.size()) {
    // A number followed by letters is a unit where the key's name already says the unit.
    size_t digits = 0;
    while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) ++digits;
    if (digits > 0 && digits < s.size())
      fail(file, n, fmt::format("'{}' value '{}' has a unit; the unit is in the key's name, give a plain number", key, s));
    fail(file, n, fmt::format("'{}' must be an integer, got '{}'", key, s));
  }
  if (v > hi) fail(file, n, fmt::format("'{}' must be <= {}, got {}", key, hi, s));
  if (v < lo) fail(file, n, fmt::format("'{}' must be >= {}, got {}", key, lo, v));
  return v;
}

// An int field: an integer in [lo, INT_MAX].
int int_field(const std::string& file, const YAML::Node& n, const std::string& key, int64_t lo) {
  return int(integer(file, n, key, lo, std::numeric_limits<int>::max()));
}

std::vector<std::string> split(const std::string& s, char c) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, c)) out.push_back(cur);
  return out;
}

// Applies one "path=value" override to the document. Paths are dot-separated keys (sequence items
// by index); under `sweep` the rest of the path is one key, so `sweep.hybridgen.k_min=[128,256]`
// sets the axis `hybridgen.k_min`.
void apply_set(YAML::Node root, const std::string& file, const std::string& set) {
  const size_t eq = set.find('=');
  if (eq == std::string::npos || eq == 0) input_error("--set '{}': expected KEY=VALUE (e.g. execute=dry)", set);
  std::vector<std::string> path = split(set.substr(0, eq), '.');
  // STRATEGY.PARAM=V: that parameter for every point, i.e. the sweep axis STRATEGY.PARAM (an axis
  // takes one value as well as a list), as `eval`, `bench` and `generate` take it.
  const auto& known = strategies();
  const auto named = std::find_if(known.begin(), known.end(), [&](const StrategyInfo& st) { return st.name == path[0]; });
  if (path.size() == 2 && named != known.end()) {
    // The strategy must be one of the file's, and the parameter one of its schema's.
    std::vector<std::string> in_file;
    for (const auto& e : root["strategies"])
      in_file.push_back(e.IsScalar() ? e.Scalar() : e.IsMap() && e["name"] ? e["name"].Scalar() : "");
    if (std::find(in_file.begin(), in_file.end(), path[0]) == in_file.end()) {
      std::string list;
      for (auto& n : in_file) list += (list.empty() ? "" : ", ") + n;
      input_error("--set '{}': strategy {} is not in {} (its strategies: {})", set, path[0], file, list);
    }
    std::vector<std::string> params;
    for (const ParamSpec& ps : named->params) params.push_back(ps.name);
    if (std::find(params.begin(), params.end(), path[1]) == params.end())
      input_error("--set '{}': strategy {} has no parameter '{}' (did you mean '{}'? `hgbench strategies` lists them)",
                  set, path[0], path[1], nearest_key(path[1], params));
    path = {"sweep", path[0] + "." + path[1]};
  }
  if (path.size() > 2 && path[0] == "sweep") {
    std::string rest = path[1];
    for (size_t i = 2; i < path.size(); ++i) rest += "." + path[i];
    path = {"sweep", rest};
  }
  YAML::Node value;
  try {
    value = YAML::Load(set.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    // A flow list of plain items YAML's flow rules refuse (a synthetic spec's `?` and `:`): each item
    // taken as the string it is written as.
    const std::string v = set.substr(eq + 1);
    bool retried = false;
    if (v.size() >= 2 && v.front() == '[' && v.back() == ']' && v.find_first_of("{}\"'[", 1) == std::string::npos) {
      YAML::Node list(YAML::NodeType::Sequence);
      const std::string inner = v.substr(1, v.size() - 2);
      for (size_t at = 0; at <= inner.size();) {
        const size_t comma = std::min(inner.find(',', at), inner.size());
        std::string item = inner.substr(at, comma - at);
        while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(item.begin());
        while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
        if (!item.empty()) list.push_back(item);
        at = comma + 1;
      }
      value = list, retried = true;
    }
    if (!retried) input_error("--set '{}': the value is not YAML ({})", set, e.msg);
  }
  if (std::find(kTopKeys.begin(), kTopKeys.end(), path[0]) == kTopKeys.end())
    input_error("{}: --set '{}': unknown key '{}' (did you mean '{}'? a strategy's parameter is STRATEGY.PARAM=V)", file,
                set, path[0], nearest_key(path[0], kTopKeys));
  // A path segment inside a list: its index.
  auto index = [&](const YAML::Node& list, const std::string& seg) {
    size_t idx = 0;
    auto [p, ec] = std::from_chars(seg.data(), seg.data() + seg.size(), idx);
    if (ec != std::errc() || p != seg.data() + seg.size() || idx >= list.size())
      input_error("--set '{}': '{}' is not an index of the list (0..{})", set, seg, list.size() - 1);
    return idx;
  };
  std::vector<YAML::Node> chain = {root};
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    YAML::Node cur = chain.back();
    YAML::Node next;
    if (cur.IsSequence()) {
      next = cur[index(cur, path[i])];
    } else {
      next = cur[path[i]];
      if (!next.IsDefined() || next.IsNull() || next.IsScalar()) {
        cur[path[i]] = YAML::Node(YAML::NodeType::Map);
        next = cur[path[i]];
      }
    }
    chain.push_back(next);
  }
  YAML::Node last = chain.back();
  if (last.IsSequence()) {
    last[index(last, path.back())] = value;
  } else {
    last[path.back()] = value;
  }
}

// A sweep axis' values: a non-empty list, or one scalar.
std::vector<YAML::Node> axis_values(const std::string& file, const YAML::Node& n, const std::string& key) {
  std::vector<YAML::Node> v;
  if (n.IsSequence()) {
    for (auto x : n) v.push_back(x);
    if (v.empty()) fail(file, n, fmt::format("sweep '{}' is empty (give at least one value)", key));
  } else if (n.IsScalar()) {
    v.push_back(n);
  } else {
    fail(file, n, fmt::format("sweep '{}' must be a list of values", key));
  }
  return v;
}

// Checks a strategy parameter value against the strategy's schema; the error names the line.
void check_param(const std::string& file, const YAML::Node& at, const std::string& strategy, const std::string& param,
                 const std::string& value) {
  try {
    StrategyParams(strategy, strategy_info(strategy).params, {{param, value}});
  } catch (const InputError& e) {
    fail(file, at, e.what());
  }
}

ExperimentSpec parse_node(YAML::Node y, const std::string& file) {
  ExperimentSpec s;
  s.file = file;
  check_keys(y, kTopKeys, file, "");
  auto str_key = [&](const char* key, std::string& out) {
    if (y[key]) out = scalar(file, y[key], key);
  };
  if (!y["name"]) input_error("{}: missing key 'name'", file);
  str_key("name", s.name);
  // The name is a directory under results/ by default: one path component of plain characters.
  if (s.name.empty() || s.name == "." || s.name == ".." ||
      s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != std::string::npos)
    fail(file, y["name"], fmt::format("name '{}' must be letters, digits, '.', '_' or '-' (it names results/<name>)", s.name));
  str_key("description", s.description);
  str_key("device", s.device);
  str_key("clock", s.clock);
  str_key("execute", s.execute);
  str_key("device_costs", s.device_costs);
  str_key("output", s.output);
  // A path is a string: a plain 5, true or ~ is a number, a boolean or null, not a directory name.
  if (y["output"] && y["output"].Tag() == "?") {
    const std::string& o = s.output;
    char* end = nullptr;
    (void)std::strtod(o.c_str(), &end);
    static const std::set<std::string> kNotPaths = {"true", "false", "yes",   "no",   "on",
                                                    "off",  "null",  "~",     "True", "False",
                                                    "Null", "TRUE",  "FALSE", "NULL"};
    if ((!o.empty() && end == o.c_str() + o.size()) || kNotPaths.count(o))
      fail(file, y["output"],
           fmt::format("'output' must be a path, got {} (quote it to mean a directory named so)", o));
  }
  if (y["repeats"]) s.repeats = int_field(file, y["repeats"], "repeats", 1);
  if (y["warmup"]) s.warmup = int_field(file, y["warmup"], "warmup", 0);
  if (y["seed"]) s.seed = uint64_t(integer(file, y["seed"], "seed", 0));
  if (s.device != "emulated" && s.device != "cuda" && s.device != "auto")
    fail(file, y["device"], fmt::format("device '{}' (expected emulated, cuda or auto)", s.device));
  if (s.execute != "real" && s.execute != "dry" && s.execute != "auto")
    fail(file, y["execute"], fmt::format("execute '{}' (expected real, dry or auto)", s.execute));
  if (s.clock != "measured" && s.clock != "modeled" && s.clock.rfind("modeled:", 0) != 0)
    fail(file, y["clock"], fmt::format("clock '{}' (expected measured, modeled or modeled:<platform>)", s.clock));
  if (s.execute != "real" && s.clock == "measured" && !y["eval"])
    fail(file, y["execute"] ? y["execute"] : y, "execute: dry computes nothing to measure; it needs clock: modeled:<platform>");
  if (s.device_costs != "off") {
    if (s.device == "cuda")
      fail(file, y["device_costs"], "device_costs: is for the emulated device (a GPU pays its own costs)");
    try {
      (void)load_platform(s.device_costs, std::string(HG_SOURCE_DIR) + "/experiments/platforms");
    } catch (const InputError& e) {
      fail(file, y["device_costs"], fmt::format("device_costs '{}' (expected off or a platform): {}", s.device_costs, e.what()));
    }
  }
  if (s.execute == "dry" && s.device == "cuda")
    fail(file, y["device"], "execute: dry runs on the emulated device (it computes nothing); use device: emulated");

  // models
  const YAML::Node models = y["models"];
  if (!models) input_error("{}: missing key 'models'", file);
  if (models.IsScalar()) s.models.push_back(models.Scalar());
  else if (models.IsSequence())
    for (auto m : models) s.models.push_back(scalar(file, m, "models"));
  else fail(file, models, "'models' must be a list of model specs (paths or synthetic:<preset>)");
  if (s.models.empty()) fail(file, models, "'models' is empty");
  // A model file is stored by its absolute path (resolved against the working directory), so that
  // rows and a resumed run name the same file wherever they are read.
  // (A name the OS refuses, too long or not a path, stays as given: loading it names the problem.)
  for (std::string& m : s.models) {
    std::error_code ec;
    if (m.rfind("synthetic:", 0) == 0 || !std::filesystem::exists(m, ec)) continue;
    const std::filesystem::path abs = std::filesystem::weakly_canonical(std::filesystem::absolute(m, ec), ec);
    if (!ec) m = abs.string();
  }

  // strategies
  const YAML::Node strats = y["strategies"];
  if (!strats) input_error("{}: missing key 'strategies'", file);
  if (!strats.IsSequence() || strats.size() == 0) fail(file, strats, "'strategies' must be a non-empty list");
  for (auto e : strats) {
    StrategyEntry se;
    YAML::Node params;
    if (e.IsScalar()) {
      se.name = e.Scalar();
    } else if (e.IsMap()) {
      check_keys(e, {"name", "label", "params", "gpu_kv_share"}, file, "strategies[]");
      if (!e["name"]) fail(file, e, "a strategy entry needs 'name'");
      se.name = scalar(file, e["name"], "name");
      if (e["label"]) se.label = scalar(file, e["label"], "label");
      params = e["params"];
      if (e["gpu_kv_share"]) {
        const std::string t = scalar(file, e["gpu_kv_share"], "gpu_kv_share");
        char* end = nullptr;
        const double x = std::strtod(t.c_str(), &end);
        if (end == t.c_str() || *end || !(x > 0 && x <= 64))
          fail(file, e["gpu_kv_share"],
               fmt::format(
                   "gpu_kv_share '{}': expected a share of the point's KV in (0, 64] (1: it all fits)", t));
        se.gpu_kv_share = x;
      }
    } else {
      fail(file, e, "a strategy entry is a name or a mapping with name, label, params, gpu_kv_share");
    }
    try {
      strategy_info(se.name);
    } catch (const InputError& err) {
      fail(file, e.IsMap() ? e["name"] : e, err.what());
    }
    if (params.IsDefined() && !params.IsNull()) {
      if (!params.IsMap()) fail(file, params, "'params' must be a mapping of parameter: value");
      std::vector<std::string> names;
      for (auto& p : strategy_info(se.name).params) names.push_back(p.name);
      check_keys(params, names, file, se.name + ".params");
      for (auto it = params.begin(); it != params.end(); ++it) {
        const std::string k = it->first.Scalar(), v = scalar(file, it->second, k);
        check_param(file, it->second, se.name, k, v);
        se.params[k] = v;
      }
    }
    if (se.label.empty()) se.label = se.name;
    for (auto& other : s.strategies)
      if (other.label == se.label)
        fail(file, e, fmt::format("label '{}' appears twice (give each entry its own label)", se.label));
    s.strategies.push_back(std::move(se));
  }
  s.baseline = s.strategies.front().label;
  if (y["baseline"]) {
    s.baseline = scalar(file, y["baseline"], "baseline");
    std::vector<std::string> labels;
    for (auto& e : s.strategies) labels.push_back(e.label);
    if (std::find(labels.begin(), labels.end(), s.baseline) == labels.end())
      fail(file, y["baseline"], fmt::format("baseline '{}' is not a strategy label (did you mean '{}'?)", s.baseline,
                                            nearest_key(s.baseline, labels)));
  }

  // eval
  if (const YAML::Node ev = y["eval"]) {
    if (!ev.IsMap()) fail(file, ev, "'eval' must be a mapping (tasks, shots, limit, context, data_dir, …)");
    check_keys(ev, {"tasks", "shots", "limit", "context", "data_dir", "fewshot_seed", "lm_eval", "copa_spacing", "add_bos",
                    "reference", "protocol", "chat_template", "haystack", "squad", "hotpotqa"}, file, "eval");
    EvalSpec& e = s.eval;
    e.enabled = true;
    const YAML::Node t = ev["tasks"];
    if (!t) fail(file, ev, "'eval' needs 'tasks' (a list of piqa, openbookqa, copa, rte)");
    std::vector<YAML::Node> tv;
    if (t.IsSequence()) for (auto x : t) tv.push_back(x);
    else tv.push_back(t);
    if (tv.empty()) fail(file, t, "'eval.tasks' is empty");
    for (auto& x : tv) {
      const std::string name = scalar(file, x, "tasks");
      std::vector<std::string> known = task_names();
      known.insert(known.end(), needle_task_names().begin(), needle_task_names().end());
      if (std::find(known.begin(), known.end(), name) == known.end())
        fail(file, x, fmt::format("unknown task '{}' (did you mean '{}'?)", name, nearest_key(name, known)));
      e.tasks.push_back(name);
    }
    if (ev["shots"]) e.shots = int_field(file, ev["shots"], "shots", 0);
    if (ev["limit"]) e.limit = int_field(file, ev["limit"], "limit", 0);
    if (ev["context"]) {
      e.context = scalar(file, ev["context"], "context");
      if (e.context != "prefill" && e.context != "stream")
        fail(file, ev["context"], fmt::format("context '{}' (expected prefill or stream)", e.context));
    }
    if (ev["protocol"]) {
      e.protocol = scalar(file, ev["protocol"], "protocol");
      if (e.protocol != "query_aware" && e.protocol != "query_agnostic")
        fail(file, ev["protocol"], fmt::format("protocol '{}' (expected query_aware or query_agnostic)", e.protocol));
      for (auto& t : e.tasks)
        if (!is_needle_task(t) && e.protocol != "query_aware")
          fail(file, ev["protocol"], fmt::format("protocol applies to the retrieval tasks; '{}' is multiple choice (its "
                                                 "context modes: eval.context)", t));
    }
    if (ev["chat_template"]) {
      e.chat_template = scalar(file, ev["chat_template"], "chat_template");
      if (e.chat_template != "none" && e.chat_template != "auto" && e.chat_template != "llama3" &&
          e.chat_template != "chatml")
        fail(file, ev["chat_template"],
             fmt::format("chat_template '{}' (expected {})", e.chat_template, kChatTemplateChoices));
    }
    if (ev["data_dir"]) e.data_dir = scalar(file, ev["data_dir"], "data_dir");
    if (ev["haystack"]) e.haystack = scalar(file, ev["haystack"], "haystack");
    if (ev["squad"]) e.squad = scalar(file, ev["squad"], "squad");
    if (ev["hotpotqa"]) e.hotpotqa = scalar(file, ev["hotpotqa"], "hotpotqa");
    if (ev["fewshot_seed"]) e.fewshot_seed = uint64_t(integer(file, ev["fewshot_seed"], "fewshot_seed", 0));
    if (ev["lm_eval"]) {
      const std::string v = scalar(file, ev["lm_eval"], "lm_eval");
      if (std::find(lm_eval_versions().begin(), lm_eval_versions().end(), v) == lm_eval_versions().end())
        fail(file, ev["lm_eval"], fmt::format("lm_eval '{}' (expected one of {})", v, fmt::join(lm_eval_versions(), ", ")));
      e.lm_eval = lm_eval_rules(v, file);
    }
    if (ev["copa_spacing"]) {
      const std::string c = scalar(file, ev["copa_spacing"], "copa_spacing");
      if (c != "single" && c != "double")
        fail(file, ev["copa_spacing"], fmt::format("copa_spacing '{}' (expected double, lm-eval 0.4, or single, 0.3)", c));
      e.lm_eval.copa_double_space = c == "double";
    }
    if (ev["add_bos"]) {
      const std::string b = scalar(file, ev["add_bos"], "add_bos");
      if (!parse_bos_rule(b, &e.lm_eval.bos))
        fail(file, ev["add_bos"], fmt::format("add_bos '{}' (expected none, tokenizer or always; true/false also)", b));
    }
    if (ev["reference"]) {
      e.reference = scalar(file, ev["reference"], "reference");
      if (e.reference != "none") {
        try {
          strategy_info(e.reference);
        } catch (const InputError& err) {
          fail(file, ev["reference"], std::string(err.what()) + " (or none)");
        }
      }
    }
    if (y["limit"]) e.limit = int_field(file, y["limit"], "limit", 0);  // the shorthand wins: --set limit=20
    if (s.clock != "measured")
      fail(file, y["clock"], "an accuracy experiment (eval) scores items; it has no modeled clock (use clock: measured)");
    if (s.execute == "dry")
      fail(file, y["execute"], "an accuracy experiment (eval) computes log-likelihoods; it cannot run dry (use execute: real)");
  }

  if (y["limit"] && !s.eval.enabled) fail(file, y["limit"], "'limit' (items per task) needs an 'eval' block");

  // sweep
  std::vector<std::string> valid;
  for (const SweepAxis& ax : sweep_axes())
    if (s.eval.enabled ? ax.accuracy : ax.timing) valid.push_back(ax.name);
  for (auto& e : s.strategies)
    for (auto& p : strategy_info(e.name).params) {
      const std::string k = e.name + "." + p.name;
      if (std::find(valid.begin(), valid.end(), k) == valid.end()) valid.push_back(k);
    }
  bool swept_platform = false;
  if (const YAML::Node sw = y["sweep"]) {
    if (!sw.IsMap()) fail(file, sw, "'sweep' must be a mapping of axis: [values]");
    check_keys(sw, valid, file, "sweep");
    for (auto it = sw.begin(); it != sw.end(); ++it) {
      const std::string key = it->first.Scalar();
      std::vector<std::string> vals;
      const SweepAxis* axis = sweep_axis(key);
      for (const YAML::Node& v : axis_values(file, it->second, key)) {
        if (axis) {
          vals.push_back(axis->parse(s, file, v));
        } else {  // strategy.param
          const size_t dot = key.find('.');
          const std::string val = scalar(file, v, key);
          check_param(file, v, key.substr(0, dot), key.substr(dot + 1), val);
          vals.push_back(val);
        }
      }
      swept_platform = swept_platform || key == "platform";
      s.sweep.emplace_back(key, std::move(vals));
    }
  }
  if (y["sweep"] && y["sweep"]["gpu_kv_share"] && y["sweep"]["gpu_kv_bytes"])
    fail(file, y["sweep"]["gpu_kv_share"],
         "gpu_kv_share and gpu_kv_bytes both set the accelerator KV budget: give one");
  if (swept_platform && s.clock == "measured")
    fail(file, y["sweep"]["platform"], "sweep 'platform' needs clock: modeled (each point is replayed on its platform)");
  if (s.clock == "modeled" && !swept_platform)
    fail(file, y["clock"], "clock: modeled needs a platform (clock: modeled:<platform>, or sweep: {platform: [...]})");
  if (s.clock.rfind("modeled:", 0) == 0) {
    if (swept_platform) fail(file, y["clock"], "give the platform once: clock: modeled:<platform> or sweep.platform");
    try {
      if (!calibrates_each_run(s.clock.substr(8)))
        load_platform(s.clock.substr(8), std::string(HG_SOURCE_DIR) + "/experiments/platforms");
    } catch (const InputError& err) {
      fail(file, y["clock"], err.what());
    }
  }
  if (s.output.empty()) s.output = "results/" + s.name;
  s.effective = y;
  return s;
}

}  // namespace

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}


std::string resolve_execute(ExperimentSpec& s, bool have_gpu) {
  if (s.execute != "auto") return "";
  if (s.eval.enabled) {  // scoring always computes; auto picks the device
    s.execute = "real";
    s.device = have_gpu ? "cuda" : "emulated";
    s.effective["execute"] = "real";
    s.effective["device"] = s.device;
    return have_gpu ? "execute: auto → real on the CUDA device"
                    : "execute: auto → real on the emulated accelerator (no CUDA device here)";
  }
  if (have_gpu) {
    s.execute = "real";
    s.device = "cuda";
    s.clock = "measured";
    s.effective["execute"] = "real";
    s.effective["device"] = "cuda";
    s.effective["clock"] = "measured";
    return "execute: auto → real on the CUDA device (measured)";
  }
  s.execute = "dry";
  s.device = "emulated";
  s.effective["execute"] = "dry";
  s.effective["device"] = "emulated";
  return "execute: auto → dry: no CUDA device here, so the paper's shapes run as a MODELED projection on " +
         (s.clock.rfind("modeled:", 0) == 0 ? s.clock.substr(8) : std::string("the swept platforms")) +
         " (nothing is measured; give --set execute=real on a machine with a GPU)";
}

const std::vector<std::string>& sweep_keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    for (const SweepAxis& ax : sweep_axes())
      if (ax.timing) v.push_back(ax.name);
    return v;
  }();
  return k;
}

const std::vector<SweepAxis>& sweep_axes() {
  using Spec = ExperimentSpec;
  using Json = nlohmann::ordered_json;
  auto int_axis = [](const char* name, int64_t lo, auto field) {
    SweepAxis a;
    a.name = name;
    using T = std::remove_reference_t<decltype(std::declval<Point&>().*field)>;
    a.parse = [name, lo](const Spec&, const std::string& file, const YAML::Node& v) {
      return std::to_string(integer(file, v, name, lo, std::numeric_limits<T>::max()));
    };
    a.apply = [field](Point& p, const std::string& v, const Spec&) {
      p.*field = std::remove_reference_t<decltype(p.*field)>(std::stoll(v));
    };
    a.record = [name, field](Json& j, const Point& p) { j[name] = p.*field; };
    return a;
  };
  auto choice = [](const char* name, std::vector<std::string> allowed) {
    return [name, allowed](const Spec&, const std::string& file, const YAML::Node& v) {
      const std::string c = scalar(file, v, name);
      if (std::find(allowed.begin(), allowed.end(), c) == allowed.end()) {
        std::string list;
        for (auto& x : allowed) list += (list.empty() ? "" : " or ") + x;
        fail(file, v, fmt::format("{} '{}' (expected {})", name, c, list));
      }
      return c;
    };
  };
  // A parameter every strategy of the file that takes it receives (recorded under strategy_params).
  auto shared_param = [](const char* name, auto takes, const char* none) {
    SweepAxis a;
    a.name = name;
    a.accuracy = true;
    a.parse = [name, takes, none](const Spec& s, const std::string& file, const YAML::Node& v) {
      const std::string r = scalar(file, v, name);
      bool any = false;
      for (auto& e : s.strategies)
        if (takes(strategy_info(e.name))) check_param(file, v, e.name, name, r), any = true;
      if (!any) fail(file, v, none);
      return r;
    };
    a.apply = [name, takes](Point& p, const std::string& v, const Spec& s) {
      for (auto& e : s.strategies)
        if (takes(strategy_info(e.name))) p.strategy_params[e.name][name] = v;
    };
    return a;
  };
  static const std::vector<SweepAxis> axes = [&] {
    std::vector<SweepAxis> v;
    v.push_back(int_axis("prompt_tokens", 1, &Point::prompt_tokens));
    v.push_back(int_axis("decode_tokens", 0, &Point::decode_tokens));
    v.push_back(int_axis("batch", 1, &Point::batch));
    SweepAxis placement;
    placement.name = "placement";
    placement.parse = choice("placement", {"semantic", "interleave"});
    placement.apply = [](Point& p, const std::string& x, const Spec&) { p.placement = x; };
    placement.record = [](Json& j, const Point& p) { j["placement"] = p.placement.empty() ? Json() : Json(p.placement); };
    v.push_back(placement);
    // Sizes: an integer of bytes or a number with a unit (2GiB, 512MiB, 1.5GB), as the CLI's.
    auto sized = [](SweepAxis a, const char* name) {
      const auto plain = a.parse;
      a.parse = [plain, name](const Spec& sp, const std::string& file, const YAML::Node& v) {
        if (v.IsScalar() && !v.Scalar().empty() && std::isalpha(static_cast<unsigned char>(v.Scalar().back()))) {
          try {
            return std::to_string(parse_bytes(v.Scalar(), name));
          } catch (const InputError& e) {
            fail(file, v, e.what());
          }
        }
        return plain(sp, file, v);
      };
      return a;
    };
    v.push_back(sized(int_axis("gpu_memory_bytes", 0, &Point::gpu_memory_bytes), "gpu_memory_bytes"));
    SweepAxis kv = sized(int_axis("gpu_kv_bytes", 0, &Point::gpu_kv_bytes), "gpu_kv_bytes");
    kv.record = [](Json& j, const Point& p) {  // recorded when set: earlier points' ids stay
      if (p.gpu_kv_bytes > 0) j["gpu_kv_bytes"] = p.gpu_kv_bytes;
    };
    kv.csv_default = "0";
    v.push_back(kv);
    SweepAxis share;
    share.name = "gpu_kv_share";
    share.parse = [](const Spec& s, const std::string& file, const YAML::Node& x) {
      const std::string t = scalar(file, x, "gpu_kv_share");
      double d = 0;
      auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
      if (ec != std::errc() || ptr != t.data() + t.size() || !(d > 0 && d <= 64))
        fail(file, x,
             fmt::format("gpu_kv_share '{}': expected a share of the point's KV in (0, 64] (1: it all fits)",
                         t));
      return t;
    };
    share.apply = [](Point& p, const std::string& x, const Spec&) { p.gpu_kv_share = std::stod(x); };
    share.record = [](Json& j, const Point& p) {  // recorded when set: earlier points' ids stay
      if (p.gpu_kv_share > 0) j["gpu_kv_share"] = p.gpu_kv_share;
    };
    share.csv_default = "0";
    v.push_back(share);
    SweepAxis platform;
    platform.name = "platform";
    platform.parse = [](const Spec&, const std::string& file, const YAML::Node& x) {
      const std::string p = scalar(file, x, "platform");
      try {
        if (!calibrates_each_run(p)) load_platform(p, std::string(HG_SOURCE_DIR) + "/experiments/platforms");
      } catch (const InputError& err) {
        fail(file, x, err.what());
      }
      return p;
    };
    platform.apply = [](Point& p, const std::string& x, const Spec&) { p.platform = x; };
    platform.record = [](Json& j, const Point& p) { j["platform"] = p.platform.empty() ? Json() : Json(p.platform); };
    v.push_back(platform);
    v.push_back(shared_param(
        "budget", [](const StrategyInfo& i) { return i.budgeted; },
        "sweep 'budget': no strategy of this file takes a budget (exact attention only)"));
    SweepAxis ratio = shared_param(
        "kv_ratio",
        [](const StrategyInfo& i) {
          return std::any_of(i.params.begin(), i.params.end(), [](const ParamSpec& p) { return p.name == "kv_ratio"; });
        },
        "sweep 'kv_ratio': no strategy of this file has a kv_ratio parameter");
    ratio.timing = false;  // Fig. 14 is an accuracy figure
    v.push_back(ratio);
    // Accuracy experiments.
    SweepAxis shots = int_axis("shots", 0, &Point::shots), limit = int_axis("limit", 0, &Point::limit);
    for (SweepAxis* a : {&shots, &limit}) a->timing = false, a->accuracy = true;
    // The retrieval tasks have no few-shot examples and no context mode.
    shots.record = [](Json& j, const Point& p) {
      if (!is_needle_task(p.task)) j["shots"] = p.shots;
    };
    SweepAxis context;
    context.name = "context";
    context.timing = false, context.accuracy = true;
    context.parse = choice("context", {"prefill", "stream"});
    context.apply = [](Point& p, const std::string& x, const Spec&) { p.context = x; };
    context.record = [](Json& j, const Point& p) {
      if (!is_needle_task(p.task)) j["context"] = p.context;
    };
    v.push_back(shots);
    v.push_back(context);
    v.push_back(limit);
    // Long-context retrieval tasks (datasets/needle.h): the prompt's length in tokens and the
    // needle's depth in percent; recorded for those tasks only (other points keep their ids).
    SweepAxis needle_tokens = int_axis("needle_tokens", 16, &Point::needle_tokens);
    needle_tokens.timing = false, needle_tokens.accuracy = true;
    needle_tokens.record = [](Json& j, const Point& p) {
      if (p.needle_tokens > 0) j["needle_tokens"] = p.needle_tokens;
    };
    SweepAxis depth;
    depth.name = "depth";
    depth.timing = false, depth.accuracy = true;
    depth.parse = [](const Spec&, const std::string& file, const YAML::Node& x) {
      return std::to_string(integer(file, x, "depth", 0, 100));
    };
    depth.apply = [](Point& p, const std::string& x, const Spec&) { p.depth = std::stoi(x); };
    depth.record = [](Json& j, const Point& p) {
      if (p.depth >= 0) j["depth"] = p.depth;
    };
    v.push_back(needle_tokens);
    v.push_back(depth);
    return v;
  }();
  return axes;
}

const SweepAxis* sweep_axis(const std::string& name) {
  for (const SweepAxis& a : sweep_axes())
    if (a.name == name) return &a;
  return nullptr;
}

namespace {
// An experiment file (and each --set) is UTF-8 text without NUL or other control bytes: they would
// reach config.yaml, rows and generated scripts. The error names the line and column.
void check_text(const std::string& text, const std::string& where, bool lines) {
  int line = 1, col = 1;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const std::string at = lines ? fmt::format("{}:{}: column {}", where, line, col) : where;
    if (c == '\n') {
      ++line, col = 1, ++i;
      continue;
    }
    if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f)
      input_error("{}: control byte 0x{:02x} (an experiment file is UTF-8 text)", at, c);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + size_t(n) <= text.size();
    for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + size_t(k)]) >> 6) == 0x2;
    if (ok && n > 1) {  // no overlong forms, no surrogates, nothing beyond U+10FFFF
      uint32_t cp = c & (0x7f >> n);
      for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + size_t(k)]) & 0x3f);
      ok = cp >= (n == 2   ? 0x80u
                  : n == 3 ? 0x800u
                           : 0x10000u) &&
           cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    }
    if (!ok) input_error("{}: byte 0x{:02x} is not UTF-8 (an experiment file is UTF-8 text)", at, c);
    i += size_t(n), ++col;
  }
}
}  // namespace

ExperimentSpec parse_experiment(const std::string& yaml, const std::string& file, const std::vector<std::string>& sets) {
  check_text(yaml, file, true);
  for (const std::string& set : sets) {
    std::string shown;  // the flag as typed, its bytes outside printable ASCII escaped
    for (unsigned char c : set)
      shown += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
    check_text(set, "--set '" + shown + "'", false);
  }
  YAML::Node y = yaml_load_one(yaml, file);
  if (!y.IsMap()) input_error("{}: an experiment file is a mapping (name, models, strategies, sweep, …)", file);
  for (auto& set : sets) apply_set(y, file, set);
  // A conversion yaml-cpp refuses below (a node of an unexpected kind) is the file's error too.
  auto parse = [&] {
    try {
      return parse_node(y, file);
    } catch (const YAML::Exception& e) {
      input_error("{}:{}: {}", file, e.mark.line + 1, e.msg);
    }
  };
  if (sets.empty()) return parse();
  try {
    return parse();
  } catch (const InputError& e) {  // the value may come from an override, which has no line of its own
    std::string all;
    for (auto& s : sets) all += (all.empty() ? "" : ", ") + s;
    throw InputError(std::string(e.what()) + " [after --set " + all + "]");
  }
}

ExperimentSpec load_experiment(const std::string& file, const std::vector<std::string>& sets) {
  std::error_code ec;
  if (std::filesystem::exists(file, ec) && !std::filesystem::is_regular_file(file, ec))
    input_error("{}: not a regular file (an experiment YAML file was expected)", file);
  return parse_experiment(read_regular_file(file, kMaxYamlBytes), file, sets);
}

std::vector<Point> expand(const ExperimentSpec& spec) {
  // Axes: models first, then the sweep in file order; the last varies fastest.
  std::vector<std::pair<std::string, std::vector<std::string>>> axes = {{"model", spec.models}};
  if (spec.eval.enabled) axes.push_back({"task", spec.eval.tasks});
  for (auto& a : spec.sweep) axes.push_back(a);
  // Bounded before anything is allocated: a sweep of a million points is a typo, not a plan.
  constexpr size_t kMaxPoints = 100000;
  size_t total = 1;
  for (auto& a : axes) {
    total *= a.second.size();
    if (total > kMaxPoints)
      input_error("{}: the sweep expands to more than {} points (the product of its axes); split it into files",
                  spec.file, kMaxPoints);
  }
  std::vector<Point> pts;
  pts.reserve(total);
  std::vector<size_t> idx(axes.size(), 0);
  for (size_t n = 0; n < total; ++n) {
    Point p;
    if (spec.eval.enabled) p.shots = spec.eval.shots, p.limit = spec.eval.limit, p.context = spec.eval.context;
    if (spec.clock.rfind("modeled:", 0) == 0) p.platform = spec.clock.substr(8);
    for (size_t a = 0; a < axes.size(); ++a) {
      const std::string& k = axes[a].first;
      const std::string& v = axes[a].second[idx[a]];
      if (k == "model") p.model = v;
      else if (k == "task") p.task = v;
      else if (const SweepAxis* ax = sweep_axis(k)) ax->apply(p, v, spec);
      else p.strategy_params[k.substr(0, k.find('.'))][k.substr(k.find('.') + 1)] = v;
    }
    bool repeat_of_depth = false;  // a task without a needle (cwe, fwe) is one point for every depth
    if (is_needle_task(p.task)) {  // defaults of the retrieval tasks; the other tasks have neither
      if (p.needle_tokens == 0) p.needle_tokens = kNeedleTokensDefault;
      if (p.depth < 0) p.depth = kNeedleDepthDefault;
      if (!needle_task_has_depth(p.task)) {
        p.depth = -1;
        for (size_t a = 0; a < axes.size(); ++a) repeat_of_depth = repeat_of_depth || (axes[a].first == "depth" && idx[a] > 0);
      }
    } else {
      p.needle_tokens = 0, p.depth = -1;
    }
    if (repeat_of_depth) {
      for (size_t a = axes.size(); a-- > 0;) {
        if (++idx[a] < axes[a].second.size()) break;
        idx[a] = 0;
      }
      continue;
    }
    p.index = int(pts.size());
    nlohmann::ordered_json j;
    j["model"] = p.model;
    if (spec.eval.enabled) j["task"] = p.task;
    for (const SweepAxis& ax : sweep_axes())
      if (ax.record && (spec.eval.enabled ? ax.accuracy : ax.timing)) ax.record(j, p);
    j["device"] = spec.device;
    if (!spec.eval.enabled) j["clock"] = spec.clock.rfind("modeled", 0) == 0 ? "modeled" : "measured";
    j["execute"] = spec.execute;
    if (!spec.eval.enabled) j["seed"] = spec.seed;
    j["strategy_params"] = p.strategy_params;
    p.values = j;
    p.id = fmt::format("{:016x}", fnv1a(json_text(j))).substr(0, 12);
    pts.push_back(std::move(p));
    for (size_t a = axes.size(); a-- > 0;) {
      if (++idx[a] < axes[a].second.size()) break;
      idx[a] = 0;
    }
  }
  return pts;
}

}  // namespace hg
