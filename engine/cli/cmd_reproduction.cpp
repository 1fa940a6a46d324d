// `hgbench reproduction`: regenerates the generated parts of docs/reproduction.md from result
// directories (experiments/runner/reproduction.h); scripts/reproduce runs the experiments first.
#include <fstream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/core/atomic_file.h"
#include "engine/core/error.h"
#include "experiments/runner/reproduction.h"

namespace hg::cli {

int cmd_reproduction(const std::vector<std::string>& args) {
  CLI::App app{"Regenerates the parts of docs/reproduction.md between `<!-- generated: NAME -->` and "
               "`<!-- end generated: NAME -->` from the result directories RESULTS/<experiment> (seqlen, models, "
               "batch, mapping, ablation, map: dry and deterministic; clock_check: measured). The prose around them "
               "is kept. scripts/reproduce runs the experiments and then this.",
               "reproduction"};
  std::string doc = std::string(HG_SOURCE_DIR) + "/docs/reproduction.md", results = "results/reproduction";
  bool check = false;
  app.add_option("--doc", doc, "the document to regenerate")->capture_default_str();
  app.add_option("--results", results, "the directory holding one result directory per experiment")
      ->capture_default_str();
  app.add_flag("--check", check, "write nothing; exit 1 when the document would change");
  if (int rc = parse_cli(app, "reproduction", args); rc >= 0) return rc;
  std::ifstream in(doc, std::ios::binary);
  if (!in) input_error("reproduction: {}: cannot read", doc);
  std::stringstream ss;
  ss << in.rdbuf();
  const ReproductionReport rep = regenerate_reproduction(ss.str(), doc, results);
  const bool same = rep.text == ss.str();
  for (auto& k : rep.kept)
    fmt::print(stderr, "hgbench reproduction: part '{}' kept as it was: {}/clock_check has no rows (scripts/reproduce --measured)\n", k, results);
  if (check) {
    fmt::print("{}: {} ({} generated parts from {})\n", doc, same ? "up to date" : "would change", rep.parts.size(),
               results);
    return same ? 0 : 1;
  }
  if (!same) write_file_atomic(doc, rep.text);
  fmt::print("{}: {} ({} generated parts from {})\n", doc, same ? "unchanged" : "rewritten", rep.parts.size(), results);
  return 0;
}

}  // namespace hg::cli
