// `hgbench FILE.yaml` (run an experiment), `hgbench validate FILE`, `hgbench merge DIR…`,
// `compare`, `report`: option parsing over experiments/runner (sweep, recorder, report).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>

#include "engine/backend/backend.h"
#include "engine/cli/cli.h"
#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/formats/formats.h"
#include "experiments/runner/recorder.h"
#include "experiments/runner/report.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/spec.h"
#include "experiments/runner/sweep.h"

namespace hg::cli {

int cmd_run(const std::vector<std::string>& args) {
  CLI::App app{"Runs an experiment file: every point of its sweep through every strategy, rows to a result directory.",
               "hgbench FILE.yaml"};
  std::string file, output, resume, shard;
  std::vector<std::string> sets;
  bool list = false, force = false;
  app.add_option("file", file, "experiment YAML (experiments/*.yaml); with --resume DIR alone, DIR's config.yaml");
  app.add_option("--set", sets, "override any key: KEY=VALUE, nested with dots (sweep.prompt_tokens=[2048,4096])");
  app.add_flag("--list", list, "print the expanded points and exit");
  app.add_option("--output,-o", output, "result directory (default: the file's `output`, else results/<name>)");
  app.add_option("--resume", resume,
                 "continue the result directory DIR: finished rows are kept and skipped (without FILE, the run's own "
                 "effective configuration, DIR/config.yaml)");
  app.add_flag("--force", force, "replace a non-empty output directory");
  app.add_option("--shard", shard, "run every N-th point starting at I (I/N, 0-based) into the same layout");
  if (int rc = parse_cli(app, "hgbench", args); rc >= 0) return rc;
  if (file.empty()) {
    if (resume.empty()) input_error("hgbench: give an experiment file (FILE.yaml), or --resume DIR to continue a run");
    file = resume + "/config.yaml";
    if (!file_present(file))
      input_error("{}: not found; --resume DIR alone continues a result directory from its config.yaml (give the "
                  "experiment file as well for one without it)",
                  file);
  }
  return run_sweep(load_experiment(file, sets), SweepOptions{output, resume, shard, force, list});
}

namespace {
// The host memory estimate of the file's largest point beside what this machine has. Synthetic
// models only: their shapes are known without loading weights; a file model's points are
// estimated as each starts (an out_of_memory row).
void print_largest_point(ExperimentSpec spec, const std::vector<Point>& points) {
  resolve_execute(spec, cuda_device_count_or_zero() > 0);
  const bool dry = spec.execute == "dry";
  std::map<std::string, HParams> shapes;
  HostEstimate largest;
  const Point* at = nullptr;
  for (const Point& p : points) {
    if (p.model.rfind("synthetic:", 0) != 0) continue;
    auto it = shapes.find(p.model);
    if (it == shapes.end()) {
      LoadOptions lo;
      lo.phantom_weights = true;
      it = shapes.emplace(p.model, load_model(p.model, lo).hp).first;
    }
    const HostEstimate e = point_host_estimate(it->second, p, dry);
    if (!at || e.bytes > largest.bytes) largest = e, at = &p;
  }
  if (!at) return;
  const int64_t avail = host_memory_available();
  fmt::print("largest point: {} ({}), an estimated {} of host memory; {} available here{}\n", at->id,
             describe(*at), format_bytes(largest.bytes),
             avail < 0 ? std::string("unknown") : format_bytes(avail),
             avail >= 0 && largest.bytes > avail ? " (it will fail as out_of_memory)" : "");
}
}  // namespace

int cmd_validate(const std::vector<std::string>& args) {
  CLI::App app{"Checks an experiment file against the schema without running it.", "hgbench validate"};
  std::string file;
  std::vector<std::string> sets;
  app.add_option("file", file, "experiment YAML")->required();
  app.add_option("--set", sets, "override a key first: KEY=VALUE");
  if (int rc = parse_cli(app, "validate", args); rc >= 0) return rc;
  ExperimentSpec spec = load_experiment(file, sets);
  check_inputs(spec);
  const auto points = expand(spec);
  fmt::print("{}: ok — {} points × {} strategies × {} repeats = {} rows (execute {}, clock {})\n", file, points.size(),
             spec.strategies.size(), spec.repeats, points.size() * spec.strategies.size() * size_t(spec.repeats),
             spec.execute, spec.clock);
  print_largest_point(spec, points);
  return 0;
}

int cmd_merge(const std::vector<std::string>& args) {
  CLI::App app{"Joins shard result directories into one result set with its summary.", "hgbench merge"};
  std::vector<std::string> dirs;
  std::string out;
  MergeOptions mo;
  app.add_option("dirs", dirs, "shard directories")->required();
  app.add_option("--out,-o", out, "merged result directory")->required();
  app.add_option("--shards", mo.shards,
                 "the set is shards 0..N-1 of N: report each shard that is absent or incomplete, by number, and "
                 "write nothing until all are there");
  app.add_flag("--force", mo.force, "replace a non-empty output directory");
  if (int rc = parse_cli(app, "merge", args); rc >= 0) return rc;
  if (mo.shards < 0) input_error("merge: --shards must be positive");
  const MergeReport rep = merge_results(dirs, out, mo);
  if (!rep.missing.empty()) {
    for (auto& m : rep.missing) fmt::print(stderr, "merge: {}\n", m);
    std::string nums;
    for (int i : rep.missing_shards) nums += (nums.empty() ? "" : ",") + std::to_string(i);
    fmt::print(stderr, "merge: {} of {} shards missing ({}); nothing written to {} (rerun them, e.g. hgbench submit FILE "
                       "--shards {} --only {})\n",
               rep.missing_shards.size(), mo.shards, nums, out, mo.shards, nums);
    return 1;
  }
  if (rep.duplicates)
    fmt::print(stderr, "merge: {} rows appear in more than one directory (a resubmitted shard); the first of each kept\n",
               rep.duplicates);
  fmt::print("{}merged {} directories: {} rows into {}\n", rep.table, dirs.size(), rep.rows, out);
  return 0;
}

int cmd_compare(const std::vector<std::string>& args) {
  CLI::App app{"Compares two result directories (before and after a change, two machines): matched points side by "
               "side, B ÷ A per point and strategy, geometric means.",
               "hgbench compare"};
  std::string a, b, out, match = fmt::format("{}", fmt::join(default_compare_keys(), ","));
  app.add_option("dir_a", a, "result directory A (the reference)")->required();
  app.add_option("dir_b", b, "result directory B")->required();
  app.add_option("--out,-o", out, "also write compare.csv and compare.txt there");
  app.add_option("--match", match,
                 "the point's keys two rows are matched on, comma-separated (the other keys may differ: the platform, "
                 "a strategy parameter), or 'all' for the whole point")
      ->capture_default_str();
  if (int rc = parse_cli(app, "compare", args); rc >= 0) return rc;
  std::vector<std::string> keys;
  if (match != "all")
    for (size_t at = 0; at <= match.size();) {
      const size_t comma = std::min(match.find(',', at), match.size());
      if (comma > at) keys.push_back(match.substr(at, comma - at));
      at = comma + 1;
    }
  const CompareReport rep = compare_results(a, b, out, keys);
  fmt::print(stderr, "{}", rep.warnings);
  fmt::print("{}", rep.table);
  if (!out.empty()) fmt::print("wrote {}/compare.csv and compare.txt\n", out);
  return 0;
}

int cmd_report(const std::vector<std::string>& args) {
  CLI::App app{"Writes DIR/report.html: one self-contained page (tables, plots, configuration, provenance).",
               "hgbench report"};
  std::string dir;
  app.add_option("dir", dir, "result directory")->required();
  if (int rc = parse_cli(app, "report", args); rc >= 0) return rc;
  fmt::print("wrote {}\n", write_report(dir));
  return 0;
}

}  // namespace hg::cli
