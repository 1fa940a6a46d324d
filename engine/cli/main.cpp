// hgbench entry point: dispatches subcommands; maps errors to exit statuses
// (0 ok, 1 runtime failure, 2 bad input or unsupported request).
#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "engine/cli/commands.h"
#include "engine/core/error.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    hg::cli::print_usage();
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "generate") return hg::cli::cmd_generate(args);
    if (cmd == "info") return hg::cli::cmd_info(args);
    if (cmd == "strategies") return hg::cli::cmd_strategies(args);
    if (cmd == "models") return hg::cli::cmd_models(args);
    if (cmd == "calibrate") return hg::cli::cmd_calibrate(args);
    if (cmd == "bench") return hg::cli::cmd_bench(args);
    if (cmd == "export") return hg::cli::cmd_export(args);
    if (cmd == "validate") return hg::cli::cmd_validate(args);
    if (cmd == "merge") return hg::cli::cmd_merge(args);
    if (cmd == "run" || cmd.ends_with(".yaml") || cmd.ends_with(".yml")) {
      if (cmd != "run") args.insert(args.begin(), cmd);
      return hg::cli::cmd_run(args);
    }
    fmt::print(stderr, "hgbench: unknown command '{}' (expected generate, info, models, strategies, calibrate, bench, export; see --help)\n", cmd);
    return 2;
  } catch (const hg::InputError& e) {  // bad file, field or argument; unsupported request
    fmt::print(stderr, "hgbench: error: {}\n", e.what());
    return 2;
  } catch (const hg::OutOfMemoryError& e) {
    fmt::print(stderr, "hgbench: out of memory: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "hgbench: internal error: {}\n", e.what());
    return 1;
  }
}
