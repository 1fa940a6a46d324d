// `hgbench calibrate`: measures this machine into the `this-machine` platform profile.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/core/error.h"
#include "engine/runtime/runtime.h"

namespace hg::cli {

int cmd_calibrate(const std::vector<std::string>& args) {
  CLI::App app{"Measures this machine (dram and far read bandwidth, the extra cost of a random 512 B row over a "
               "stream on each, dram→far copy bandwidth, SGEMM FLOP/s; GPU rates when a device exists) and writes "
               "the platform profile `this-machine` used by `clock: modeled:this-machine`.",
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
