// hgbench subcommands. Each returns the process exit status; InputError → 2 is mapped in main().
#pragma once
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hg::cli {

int cmd_generate(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
int cmd_strategies(const std::vector<std::string>& args);
int cmd_models(const std::vector<std::string>& args);
int cmd_calibrate(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
// Parses args with a CLI11 app: -1 to go on, else the status to return (0 after --help).
int parse_cli(CLI::App& app, const std::string& name, const std::vector<std::string>& args);
int cmd_run(const std::vector<std::string>& args);
int cmd_validate(const std::vector<std::string>& args);
int cmd_merge(const std::vector<std::string>& args);
void print_usage();

}  // namespace hg::cli
