// `hgbench calibrate`: measures this machine into the `this-machine` platform profile.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/core/error.h"
#include "engine/runtime/runtime.h"

namespace hg::cli {

int cmd_calibrate(const std::vector<std::string>& args) {
  CLI::App app{"Measures this machine and writes the platform profile `this-machine` used by "
               "`clock: modeled:this-machine`: on the CPU worker's threads, dram and far read bandwidth, the extra "
               "cost of a random 512 B row over a stream on each, SGEMM FLOP/s; dram→far copy bandwidth; the "
               "accelerator's achieved rates through its own backend (the GPU, else the emulated accelerator on "
               "its threads): BF16 GEMM, F16 prefill attention, BF16 GEMV; host↔device copies on a GPU; and the "
               "fixed costs of a stage hand-off, a kernel launch and a copy call.",
               "calibrate"};
  std::string out = std::string(HG_SOURCE_DIR) + "/experiments/platforms/this-machine.yaml";
  CalibrateOptions co;
  app.add_option("--out", out, "where to write the profile")->capture_default_str();
  app.add_option("--seconds", co.seconds_per_measure, "seconds per measurement")->capture_default_str();
  if (int rc = parse_cli(app, "calibrate", args); rc >= 0) return rc;
  if (!(co.seconds_per_measure > 0)) input_error("calibrate: --seconds must be positive");
  std::string notes;
  PlatformProfile p = calibrate(co, &notes);
  save_platform(p, out, "Written by `hgbench calibrate` (measured on this machine): " + notes);
  fmt::print("{}\nwrote {}\n", notes, out);
  return 0;
}

}  // namespace hg::cli
