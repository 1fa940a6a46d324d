// hgbench subcommands. Each returns the process exit status; InputError → 2 is mapped in main().
#pragma once
#include <string>
#include <vector>

namespace hg::cli {

int cmd_generate(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
int cmd_strategies(const std::vector<std::string>& args);
int cmd_models(const std::vector<std::string>& args);
int cmd_calibrate(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
void print_usage();

}  // namespace hg::cli
