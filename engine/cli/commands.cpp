// The command table and the helpers the commands share.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>

#include "engine/cli/cli.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/runtime/runtime.h"

namespace hg::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> c = {
      {"run", "run an experiment file (also: hgbench FILE.yaml): rows.jsonl, summary.csv, a table", cmd_run},
      {"validate", "check an experiment file against the schema without running it", cmd_validate},
      {"merge", "join shard result directories into one result set", cmd_merge},
      {"compare", "two result directories side by side: B ÷ A per point and strategy, geometric means",
       cmd_compare},
      {"report",
       "one self-contained HTML page of a result directory: tables, plots, configuration, provenance",
       cmd_report},
      {"submit", "run an experiment on Slurm: a job array of shards and a merge job", cmd_submit},
      {"reproduction",
       "regenerate docs/reproduction.md's tables and figures from the experiments' result directories",
       cmd_reproduction},
      {"eval", "score PIQA, OpenBookQA, COPA, RTE through KV strategies (lm-eval 0.4 requests)", cmd_eval},
      {"tokenize", "print the token ids of a text with a model's tokenizer", cmd_tokenize},
      {"generate", "generate text with a model and report prefill/decode tokens/s", cmd_generate},
      {"bench", "decode tok/s at given context lengths and prefill tok/s, against the bandwidth limit",
       cmd_bench},
      {"info", "print a model's architecture, shapes, dtype, parameters and tokenizer", cmd_info},
      {"models", "list model formats and synthetic presets", cmd_models},
      {"strategies", "list KV strategies and their parameters", cmd_strategies},
      {"calibrate", "measure this machine and write the `this-machine` platform profile", cmd_calibrate},
      {"export", "write a model (e.g. synthetic:llama-3.2-1b?dtype=f16) as a GGUF file llama.cpp loads",
       cmd_export},
  };
  return c;
}

void print_usage() {
  fmt::print("hgbench — long-context LLM decoding under KV-cache pressure\n\n"
             "usage: hgbench FILE.yaml [options]   (run an experiment; hgbench run --help)\n"
             "       hgbench <command> [options]   (hgbench <command> --help for details)\n\ncommands:\n");
  for (auto& c : commands()) fmt::print("  {:<12} {}\n", c.name, c.summary);
}

int parse_cli(CLI::App& app, const std::string& name, const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {name};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<const char*> argv;
  for (auto& s : argv_s) argv.push_back(s.c_str());
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    for (auto& ch : what)
      if (ch == '\n') ch = ' ';
    // The experiment form parses as "hgbench" (FILE.yaml) and is documented as `hgbench run`.
    if (name == "hgbench") throw InputError(fmt::format("{} (see hgbench run --help)", what));
    throw InputError(fmt::format("{}: {} (see hgbench {} --help)", name, what, name));
  }
  return -1;
}

LoadOptions load_options(const std::string& weights, const std::string& cmd) {
  LoadOptions lo;
  if (!weights.empty()) {
    DType t;
    if (!parse_dtype(weights, &t)) input_error("{}: --weights '{}' (expected f32, f16 or bf16)", cmd, weights);
    lo.weight_dtype = t;
  }
  return lo;
}

std::map<std::string, std::map<std::string, std::string>> strategy_sets(const std::vector<std::string>& sets,
                                                                        const std::string& cmd,
                                                                        const std::vector<std::string>& strategies) {
  std::map<std::string, std::map<std::string, std::string>> out;
  for (auto& kv : sets) {
    const size_t dot = kv.find('.'), eq = kv.find('=');
    if (dot == std::string::npos || eq == std::string::npos || eq < dot)
      input_error("{}: --set '{}' must be STRATEGY.PARAM=VALUE", cmd, kv);
    const std::string sn = kv.substr(0, dot);
    if (std::find(strategies.begin(), strategies.end(), sn) == strategies.end())
      input_error("{}: --set '{}' names strategy '{}', which --strategy does not name", cmd, kv, sn);
    out[sn][kv.substr(dot + 1, eq - dot - 1)] = kv.substr(eq + 1);
  }
  return out;
}

std::optional<PlatformProfile> clock_profile(const std::string& clock, const std::string& cmd) {
  if (clock.rfind("modeled:", 0) == 0)
    return load_platform(clock.substr(8), std::string(HG_SOURCE_DIR) + "/experiments/platforms");
  if (clock != "measured") input_error("{}: --clock '{}' (expected measured or modeled:<platform>)", cmd, clock);
  return std::nullopt;
}

DeviceCosts device_costs_option(const std::string& v, const std::string& cmd, const std::string& device) {
  if (v == "off") return {};
  if (device != "emulated")
    input_error("{}: --device-costs {} is for --device emulated (a GPU pays its own costs)", cmd, v);
  return device_costs_of(load_platform(v, std::string(HG_SOURCE_DIR) + "/experiments/platforms"));
}

void check_threads(int n, const std::string& cmd) {
  const int hw = std::max(1, hardware_threads()), most = 4 * hw;
  if (n < 1 || n > most)
    input_error("{}: --threads {}: expected 1 to {} (4 × this machine's {} hardware threads)", cmd, n, most,
                hw);
}

void check_positions(const Model& model, int64_t prompt, int64_t decode, const std::string& cmd) {
  if (prompt + decode > model.hp.max_pos)
    input_error("{}: a prompt of {} tokens and {} to generate ({} positions) exceed the model's {} positions",
                cmd, prompt, decode, prompt + decode, model.hp.max_pos);
}

void require_host_memory_or_input_error(const HostEstimate& e, const std::string& cmd) {
  try {
    require_host_memory(e, cmd);
  } catch (const OutOfMemoryError& x) {
    input_error("{}", x.what());
  }
}

std::vector<int> int_list(const std::string& s, const std::string& what, const std::string& cmd) {
  std::vector<int> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t c = s.find(',', pos);
    const std::string x = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    int n = 0;
    auto [p, ec] = std::from_chars(x.data(), x.data() + x.size(), n);
    if (ec != std::errc() || p != x.data() + x.size() || n <= 0)
      input_error("{}: {} '{}' is not a list of positive integers", cmd, what, s);
    v.push_back(n);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return v;
}

}  // namespace hg::cli
