// hgbench entry point: dispatches to the command table (engine/cli/commands.cpp); a file argument
// ending in .yaml/.yml runs that experiment. Exit statuses: 0 ok, 1 runtime failure (or a failed
// experiment point), 2 bad input or unsupported request, 130 interrupted.
#include <csignal>
#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/yaml_util.h"

int main(int argc, char** argv) {
  // A file-size limit makes writes fail with EFBIG (reported with the path) instead of killing us.
  std::signal(SIGXFSZ, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    hg::cli::print_usage();
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "version") {
    fmt::print("hgbench {} ({} build, g++ {})\n", HG_VERSION, HG_BUILD_TYPE, __VERSION__);
    return 0;
  }
  std::string cmd = args[0];
  if (cmd.ends_with(".yaml") || cmd.ends_with(".yml") || cmd == "--resume" || cmd.rfind("--resume=", 0) == 0) cmd = "run";
  else args.erase(args.begin());
  try {
#if defined(__x86_64__) && defined(__AVX2__)
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
      throw hg::UnsupportedError("this hgbench was built for x86-64-v3 (AVX2, FMA) and this CPU lacks it; "
                                 "rebuild with -DHG_ARCH_FLAGS=-march=x86-64");
#endif
    hg::active_cpu_isa();  // HG_CPU_ISA checked before any work
    std::string names;
    std::vector<std::string> all;
    for (auto& c : hg::cli::commands()) {
      if (cmd == c.name) return c.run(args);
      names += (names.empty() ? "" : ", ") + std::string(c.name);
      all.emplace_back(c.name);
    }
    size_t dist = 0;
    std::string near = hg::nearest_key(cmd, all, &dist);
    if (dist > std::max<size_t>(2, cmd.size() / 3)) near.clear();  // nothing close: no guess
    fmt::print(stderr, "hgbench: unknown command '{}'{} (expected FILE.yaml or one of {}; see --help)\n", cmd,
               near.empty() ? "" : " — did you mean '" + near + "'?", names);
    return 2;
  } catch (const hg::InputError& e) {  // bad file, field or argument; unsupported request
    fmt::print(stderr, "hgbench: error: {}\n", e.what());
    return 2;
  } catch (const hg::IoError& e) {
    fmt::print(stderr, "hgbench: error: {}\n", e.what());
    return 1;
  } catch (const hg::OutOfMemoryError& e) {
    fmt::print(stderr, "hgbench: out of memory: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "hgbench: internal error: {}\n", e.what());
    return 1;
  }
}
