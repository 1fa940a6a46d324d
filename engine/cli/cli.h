// What the hgbench commands share: the command table, CLI11 parsing with hgbench's error rules,
// and the options several commands read (sizes, weight types, --set, --clock).
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/metered_backend.h"
#include "engine/decoder/host_estimate.h"
#include "engine/formats/formats.h"
#include "engine/runtime/clock.h"
#include "experiments/runner/spec.h"

namespace CLI {
class App;
}

namespace hg::cli {

// One subcommand: its name, the line `hgbench --help` shows, and its entry point (the process exit
// status; InputError → 2 is mapped in main()).
struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};
// Every command, in the order --help lists them (commands.cpp).
const std::vector<Command>& commands();
void print_usage();

// Parses args with app: -1 to go on, 0 after --help (printed). A parse error is an InputError
// naming the command ("generate: --model is required (see hgbench generate --help)").
int parse_cli(CLI::App& app, const std::string& name, const std::vector<std::string>& args);

// Sizes ("123", "64MiB", "2GiB", "1.5GB"): parse_bytes (engine/decoder/host_estimate.h).
// --weights f32|f16|bf16 ("" → the file's).
LoadOptions load_options(const std::string& weights, const std::string& cmd);
// --set STRATEGY.PARAM=VALUE options, per strategy; each must name one of `strategies`.
std::map<std::string, std::map<std::string, std::string>> strategy_sets(const std::vector<std::string>& sets,
                                                                        const std::string& cmd,
                                                                        const std::vector<std::string>& strategies);
// --clock measured | modeled:<platform> → the platform profile for modeled, none for measured.
std::optional<PlatformProfile> clock_profile(const std::string& clock, const std::string& cmd);
// --device-costs: "off", or a platform whose measured fixed costs the emulated accelerator spends.
DeviceCosts device_costs_option(const std::string& v, const std::string& cmd, const std::string& device);
// "128,4096" → positive integers.
std::vector<int> int_list(const std::string& s, const std::string& what, const std::string& cmd);
// A thread count from the command line: 1 to 4 × this machine's hardware threads, else an InputError
// (tens of thousands of OpenMP threads crash or stall the runtime).
void check_threads(int n, const std::string& cmd);
// A prompt of `prompt` tokens and `decode` more within the model's positions, else an InputError
// naming both numbers and the limit.
void check_positions(const Model& model, int64_t prompt, int64_t decode, const std::string& cmd);
// require_host_memory (engine/decoder/host_estimate.h) for a command-line request: too large for this
// machine is bad input (exit 2) naming the estimate and what is available.
void require_host_memory_or_input_error(const HostEstimate& e, const std::string& cmd);

int cmd_generate(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
int cmd_models(const std::vector<std::string>& args);
int cmd_strategies(const std::vector<std::string>& args);
int cmd_calibrate(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_run(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_validate(const std::vector<std::string>& args);
int cmd_merge(const std::vector<std::string>& args);
int cmd_compare(const std::vector<std::string>& args);
int cmd_report(const std::vector<std::string>& args);
int cmd_submit(const std::vector<std::string>& args);
int cmd_reproduction(const std::vector<std::string>& args);

}  // namespace hg::cli
