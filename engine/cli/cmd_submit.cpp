// `hgbench submit`: hands an experiment's sweep to Slurm — a job array of shard tasks (each
// `hgbench FILE --shard $SLURM_ARRAY_TASK_ID/N` into its own directory) and a merge job after it.
// The merge job depends on the array with afterany and checks completeness itself, so a shard
// that failed is reported by number (afterok would leave the merge pending forever instead).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/core/error.h"
#include "experiments/runner/spec.h"

namespace hg::cli {
namespace {
namespace fs = std::filesystem;

// Control characters as \n, \t or \xHH, so that an error naming the value stays one line.
std::string escaped(const std::string& s) {
  std::string o;
  for (unsigned char c : s)
    o += c == '\n' ? "\\n" : c == '\t' ? "\\t" : std::iscntrl(c) ? fmt::format("\\x{:02x}", c) : std::string(1, char(c));
  return o;
}

// Single-quoted for the shell.
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string sbatch_header(const std::string& job, const std::string& log, const std::string& partition,
                          const std::string& gres, const std::string& time, const std::string& extra) {
  std::string h = "#!/bin/bash\n";
  h += fmt::format("#SBATCH --job-name={}\n#SBATCH --output={}\n", job, log);
  if (!partition.empty()) h += fmt::format("#SBATCH --partition={}\n", partition);
  if (!gres.empty()) h += fmt::format("#SBATCH --gres={}\n", gres);
  if (!time.empty()) h += fmt::format("#SBATCH --time={}\n", time);
  if (!extra.empty()) h += extra;
  return h;
}

// Runs `cmd` through the shell; returns its stdout and exit status.
std::pair<std::string, int> run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {"", -1};
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  return {out, WIFEXITED(st) ? WEXITSTATUS(st) : -1};
}

std::string write_script(const std::string& path, const std::string& text) {
  std::ofstream o(path);
  o << text;
  if (!o) input_error("submit: cannot write {}", path);
  o.close();
  fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  return path;
}

}  // namespace

int cmd_submit(const std::vector<std::string>& args) {
  const std::string cmd = "submit";
  CLI::App app{"Submits an experiment to Slurm: a job array of N shard tasks and a merge job that runs after them. "
               "Result layout: DIR/shards/shard-I/ (each shard's rows), DIR/merged/ (the set), DIR/slurm/ (scripts, "
               "logs).",
               cmd};
  std::string file, out, partition, gres, time, only, hgbench_bin, sbatch = "sbatch";
  std::vector<std::string> sets;
  int shards = 0;
  bool dry_run = false;
  app.add_option("file", file, "experiment YAML")->required();
  app.add_option("--set", sets, "override any key: KEY=VALUE (passed to every shard)");
  app.add_option("--shards", shards, "number of array tasks (shards of the sweep)")->required();
  app.add_option("--partition,-p", partition, "Slurm partition");
  app.add_option("--gres", gres, "generic resources per task, e.g. gpu:1");
  app.add_option("--time,-t", time, "time limit per task, e.g. 02:00:00");
  app.add_option("--only", only, "resubmit these shards only (e.g. 1,3), plus a new merge job");
  app.add_option("--out,-o", out, "result directory (default: the file's `output`, else results/<name>)");
  app.add_option("--hgbench", hgbench_bin, "the hgbench binary the tasks run (default: this one)");
  app.add_option("--sbatch", sbatch, "the sbatch command (default: sbatch)");
  app.add_flag("--dry-run", dry_run, "print the two scripts and the sbatch commands; submit nothing");
  if (int rc = parse_cli(app, cmd, args); rc >= 0) return rc;
  if (shards < 1) input_error("submit: --shards must be >= 1");
  // #SBATCH lines take a value as it is: one with a newline or another control character would
  // end the line and start a shell command of its own.
  for (auto [flag, v] : {std::pair{"--partition", &partition}, {"--gres", &gres}, {"--time", &time}})
    if (std::any_of(v->begin(), v->end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)) || c == ' '; }))
      input_error("submit: {} '{}' has a space or a control character (a newline would start a shell line in the "
                  "job script)", flag, escaped(*v));
  for (auto& s : sets)
    if (std::any_of(s.begin(), s.end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); }))
      input_error("submit: --set '{}' has a control character", escaped(s));

  // The file must be valid here, not discovered broken in N tasks on the cluster.
  const ExperimentSpec spec = load_experiment(file, sets);
  const size_t n_points = expand(spec).size();
  if (size_t(shards) > n_points)
    input_error("submit: {} shards for {} points (each shard needs a point; give --shards <= {})", shards, n_points, n_points);
  std::vector<int> tasks;
  if (only.empty()) {
    for (int i = 0; i < shards; ++i) tasks.push_back(i);
  } else {
    if (only.find_first_not_of("0123456789,") != std::string::npos || only.front() == ',' || only.back() == ',')
      input_error("submit: --only '{}' is not a list of shard numbers (e.g. 1,3)", only);
    size_t p = 0;
    while (p < only.size()) {
      const size_t c = only.find(',', p);
      tasks.push_back(std::stoi(only.substr(p, c == std::string::npos ? std::string::npos : c - p)));
      if (c == std::string::npos) break;
      p = c + 1;
    }
  }
  for (int i : tasks)
    if (i < 0 || i >= shards) input_error("submit: --only shard {} is not in 0..{}", i, shards - 1);

  const fs::path cwd = fs::current_path();
  const fs::path base = fs::absolute(out.empty() ? spec.output : out);
  const std::string exe = hgbench_bin.empty() ? fs::read_symlink("/proc/self/exe").string() : fs::absolute(hgbench_bin).string();
  const std::string file_abs = fs::absolute(file).string();
  const std::string slurm_dir = (base / "slurm").string(), shard_root = (base / "shards").string();
  // Every value the scripts carry: no control character anywhere (a newline ends a comment or an
  // #SBATCH line and starts a shell line), and no space in the #SBATCH header, which has no quoting.
  const auto refuse = [](const char* what, const std::string& v, bool header) {
    if (std::any_of(v.begin(), v.end(), [&](char c) {
          return std::iscntrl(static_cast<unsigned char>(c)) || (header && c == ' ');
        }))
      input_error("submit: {} '{}' has a {}control character (it would start a shell line in the job script)",
                  what, escaped(v), header ? "space or a " : "");
  };
  refuse("the output directory", base.string(), true);
  refuse("the experiment's name", spec.name, true);
  refuse("the experiment file's path", file_abs, false);
  refuse("the working directory", cwd.string(), false);
  refuse("the hgbench binary's path", exe, false);
  std::string set_args;
  for (auto& s : sets) set_args += " --set " + sh_quote(s);
  std::string array_spec;
  for (int i : tasks) array_spec += (array_spec.empty() ? "" : ",") + std::to_string(i);

  const std::string job = "hgbench-" + spec.name;
  std::string array = sbatch_header(job, slurm_dir + "/shard-%a.out", partition, gres, time,
                                    fmt::format("#SBATCH --array={}\n", array_spec));
  array += fmt::format(
      "# Shard $SLURM_ARRAY_TASK_ID of {n} of {file}; a resubmitted shard resumes its directory.\n"
      "set -u\n"
      "cd {cwd}\n"
      "d={root}/shard-$SLURM_ARRAY_TASK_ID\n"
      "if [ -s \"$d/rows.jsonl\" ]; then where=(--resume \"$d\"); else where=(-o \"$d\" --force); fi\n"
      "{exe} {file}{sets} --shard \"$SLURM_ARRAY_TASK_ID/{n}\" \"${{where[@]}}\"\n"
      "rc=$?\n"
      "# 1: some points failed and are recorded as rows (a result); anything else fails the task.\n"
      "[ \"$rc\" -le 1 ] && exit 0 || exit \"$rc\"\n",
      fmt::arg("n", shards), fmt::arg("file", sh_quote(file_abs)), fmt::arg("cwd", sh_quote(cwd.string())),
      fmt::arg("root", sh_quote(shard_root)), fmt::arg("exe", sh_quote(exe)), fmt::arg("sets", set_args));
  std::string shard_dirs;
  for (int i = 0; i < shards; ++i) shard_dirs += " " + sh_quote(shard_root + "/shard-" + std::to_string(i));
  std::string merge = sbatch_header(job + "-merge", slurm_dir + "/merge-%j.out", partition, "", time, "");
  merge += fmt::format("# Joins the {n} shards when they are all complete; otherwise names the missing ones.\n"
                       "cd {cwd}\n"
                       "exec {exe} merge{dirs} --shards {n} --out {out} --force\n",
                       fmt::arg("n", shards), fmt::arg("cwd", sh_quote(cwd.string())), fmt::arg("exe", sh_quote(exe)),
                       fmt::arg("dirs", shard_dirs), fmt::arg("out", sh_quote((base / "merged").string())));

  if (dry_run) {
    fmt::print("# {}/array.sbatch\n{}\n# {}/merge.sbatch\n{}\n", slurm_dir, array, slurm_dir, merge);
    fmt::print("# submit: {} --parsable {}/array.sbatch  →  ARRAY_ID\n"
               "#         {} --parsable --dependency=afterany:ARRAY_ID {}/merge.sbatch\n",
               sbatch, slurm_dir, sbatch, slurm_dir);
    return 0;
  }
  std::error_code ec;
  fs::create_directories(slurm_dir, ec);
  fs::create_directories(shard_root, ec);
  if (ec) input_error("submit: cannot create {} ({})", slurm_dir, ec.message());
  std::string tag = only.empty() ? "" : "-only-" + array_spec;
  for (auto& c : tag) c = c == ',' ? '_' : c;
  const std::string a_path = write_script(slurm_dir + "/array" + tag + ".sbatch", array);
  const std::string m_path = write_script(slurm_dir + "/merge.sbatch", merge);
  auto [a_out, a_rc] = run_capture(sbatch + " --parsable " + sh_quote(a_path) + " 2>&1");
  if (a_rc != 0) {
    fmt::print(stderr, "submit: {} failed (exit {}): {}", sbatch, a_rc, a_out);
    return a_rc == 127 ? 2 : 1;
  }
  const std::string array_id = a_out.substr(0, a_out.find_first_of(";\n"));
  auto [m_out, m_rc] =
      run_capture(sbatch + " --parsable --dependency=afterany:" + array_id + " " + sh_quote(m_path) + " 2>&1");
  if (m_rc != 0) {
    fmt::print(stderr, "submit: the merge job was not submitted ({} exit {}): {}", sbatch, m_rc, m_out);
    return 1;
  }
  const std::string merge_id = m_out.substr(0, m_out.find_first_of(";\n"));
  fmt::print("submitted {}: array job {} (shards {} of {}), merge job {} (after the array)\n"
             "shards: {}/shard-I   merged: {}/merged   logs: {}\n",
             spec.name, array_id, array_spec, shards, merge_id, shard_root, base.string(), slurm_dir);
  return 0;
}

}  // namespace hg::cli
