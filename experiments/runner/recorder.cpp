// Result directories, summaries and merges.
#include "experiments/runner/recorder.h"

#include <csv.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "engine/core/atomic_file.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/mapped_file.h"
#include "engine/runtime/bandwidth.h"
#include "experiments/runner/points.h"

namespace hg {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

const char* kRows = "rows.jsonl";
const char* kLockFile = ".lock";  // a result directory's writer lock (lock_result_dir)

void write_config(const std::string& dir, const ExperimentSpec& spec, const std::string& shard) {
  if (!shard.empty()) write_file_atomic(dir + "/shard.txt", shard + "\n");
  YAML::Emitter e;
  e << spec.effective;
  write_file_atomic(dir + "/config.yaml", "# effective experiment after overrides, from " + spec.file +
                                              (shard.empty() ? "" : ", shard " + shard) + "\n" + e.c_str() + "\n");
}

// The settings in which two effective experiments differ ("key (a there, b here)"), the output
// path and description aside.
std::vector<std::string> config_differences(const YAML::Node& there, const YAML::Node& here) {
  auto text = [](const YAML::Node& n) {
    if (!n) return std::string("(absent)");
    YAML::Emitter e;
    e << YAML::Flow << n;
    return std::string(e.c_str());
  };
  std::set<std::string> keys;
  for (const auto& n : {there, here})
    if (n.IsMap())
      for (auto it = n.begin(); it != n.end(); ++it) keys.insert(it->first.Scalar());
  std::vector<std::string> differ;
  for (const std::string& k : keys) {
    if (k == "output" || k == "description") continue;
    const std::string a = text(there[k]), b = text(here[k]);
    if (a != b) differ.push_back(fmt::format("{} ({} there, {} here)", k, a, b));
  }
  return differ;
}

// A result directory's files are read only when regular and within these sizes (a config.yaml is
// kilobytes; rows.jsonl about 10 kB a row).
constexpr int64_t kMaxConfigBytes = int64_t(16) << 20, kMaxRowsBytes = int64_t(16) << 30;

// The first line of DIR/shard.txt ("" when there is none).
std::string shard_of(const std::string& dir) {
  const std::string p = dir + "/shard.txt";
  if (!file_present(p)) return "";
  const std::string s = read_regular_file(p, 4096);
  return s.substr(0, s.find('\n'));
}

YAML::Node load_config(const std::string& file) {
  try {
    return YAML::Load(read_regular_file(file, kMaxConfigBytes));
  } catch (const YAML::Exception& e) {
    input_error("{}: cannot read it ({})", file, e.what());
  }
}

// A directory continued with --resume holds this experiment: the same effective settings (its
// config.yaml) and the same shard.
void check_same_experiment(const std::string& dir, const ExperimentSpec& spec, const std::string& shard) {
  const std::string cfg = dir + "/config.yaml";
  if (!fs::exists(cfg)) return;  // killed before its config was written: nothing to mix with
  const std::vector<std::string> differ = config_differences(load_config(cfg), spec.effective);
  if (!differ.empty())
    input_error("{}: --resume of another experiment: {} differ{} (give a new -o, or --force to replace it)", dir,
                fmt::join(differ, "; "), differ.size() == 1 ? "s" : "");
  const std::string had = shard_of(dir);
  if (had != shard)
    input_error("{}: --resume with shard '{}' of a directory of shard '{}'", dir, shard.empty() ? "none" : shard,
                had.empty() ? "none" : had);
}

// A summary file that could not be written whole (a full disk) is an error, never a success.
// --force replaces a result directory only: one holding what hgbench writes (config.yaml or
// rows.jsonl), never whatever directory an `output:` or `-o` happens to name.
void refuse_unless_result_dir(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "config.yaml") && !fs::exists(fs::path(dir) / kRows))
    input_error("{}: not an hgbench result directory (no config.yaml or {}); --force replaces only those — remove it "
                "yourself or give another -o", dir, kRows);
}

// Summaries are whole or keep their previous version; a failure says how to rewrite them.
void commit_checked(AtomicFile& f) {
  try {
    f.commit();
  } catch (const IoError& e) {
    throw IoError(fmt::format("{}; rows.jsonl is intact: rerun `hgbench merge` or --resume to rewrite the summary",
                              e.what()));
  }
}
void write_checked(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  commit_checked(f);
}

// The median, NaN when there is nothing (a strategy with no finished repeat at a point).
double median_of(const std::vector<double>& v) { return v.empty() ? NAN : median(v); }

// One CSV record through libcsv's quoting.
void csv_row(FILE* f, const std::vector<std::string>& fields) {
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) std::fputc(',', f);
    csv_fwrite(f, fields[i].data(), fields[i].size());
  }
  std::fputc('\n', f);
}

std::string num(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : ""; }

// A row's accelerator KV budget and peak (tiers.gpu), {-1, -1} when it has none.
std::pair<double, double> gpu_kv(const ResultRow& r) {
  const nlohmann::ordered_json::json_pointer b("/tiers/gpu/kv_budget_bytes"), p("/tiers/gpu/kv_peak_bytes");
  if (!r.ok || !r.json.contains(b) || !r.json.contains(p) || !r.json.at(b).is_number()) return {-1, -1};
  return {r.json.at(b).get<double>(), r.json.at(p).get<double>()};
}

// The axes points record, timing or accuracy ones, in the table's order (summary.csv's columns).
std::vector<const SweepAxis*> recorded_axes(bool accuracy) {
  std::vector<const SweepAxis*> v;
  for (const SweepAxis& ax : sweep_axes())
    if (ax.record && (accuracy ? ax.accuracy : ax.timing)) v.push_back(&ax);
  return v;
}
std::vector<std::string> axis_cells(const Json& pj, bool accuracy) {
  std::vector<std::string> v;
  for (const SweepAxis* ax : recorded_axes(accuracy)) v.push_back(pj.contains(ax->name) ? json_str(pj[ax->name]) : ax->csv_default);
  return v;
}

// Accuracy rows: summary.csv per (point, label) and a table of acc per task with the mean over
// tasks (the paper's Figs. 14, 20, 22), then the fidelity against the reference.
std::string write_accuracy_summary(const std::string& dir, const std::vector<ResultRow>& rows,
                                   const std::vector<std::string>& labels) {
  std::map<int, Json> points;
  std::map<std::pair<int, std::string>, const Json*> cell;  // the first ok repeat (scoring is deterministic)
  std::map<std::pair<int, std::string>, std::string> reason;
  for (auto& r : rows) {
    const int pi = r.point_index;
    points[pi] = r.point;
    points[pi]["id"] = r.point_id;
    const auto key = std::make_pair(pi, r.label);
    if (r.ok && !cell.count(key)) cell[key] = &r.json;
    else if (!r.ok) reason[key] = r.reason;
  }
  const std::string csv_path = dir + "/summary.csv";
  AtomicFile csv_file(csv_path);
  FILE* f = csv_file.file();
  std::vector<std::string> head = {"point_id", "point_index", "model", "task"};
  for (const SweepAxis* ax : recorded_axes(true)) head.push_back(ax->name);
  for (const char* k : {"label", "strategy", "status", "n", "acc", "acc_stderr", "acc_norm", "acc_norm_stderr",
                        "agreement", "mean_abs_ll_diff", "mean_kl", "reason"})
    head.push_back(k);
  const std::vector<std::string> swept = swept_params(points);  // one column each (Fig. 14's kv_ratio)
  for (auto& k : swept) head.push_back("param." + k);
  csv_row(f, head);
  for (auto& [pi, pj] : points)
    for (auto& label : labels) {
      const auto key = std::make_pair(pi, label);
      const Json* r = cell.count(key) ? cell[key] : nullptr;
      if (!r && !reason.count(key)) continue;
      const Json acc = r ? (*r)["accuracy"] : Json::object();
      const Json fid = r && (*r)["fidelity"].is_object() ? (*r)["fidelity"] : Json::object();
      auto g = [](const Json& j, const char* k) {
        return j.contains(k) && j[k].is_number() ? num(j[k].get<double>()) : std::string();
      };
      const std::string strategy = r ? (*r)["strategy"].get<std::string>() : "";
      std::vector<std::string> rec = {json_str(pj["id"]), std::to_string(pi), json_str(pj["model"]), json_str(pj["task"])};
      for (auto& c : axis_cells(pj, true)) rec.push_back(c);
      for (auto& c : std::vector<std::string>{label, strategy, r ? "ok" : "failed", r ? json_str(acc["n"]) : "", g(acc, "acc"),
                                      g(acc, "acc_stderr"), g(acc, "acc_norm"), g(acc, "acc_norm_stderr"),
                                      g(fid, "agreement"), g(fid, "mean_abs_ll_diff"), g(fid, "mean_kl"),
                                      reason.count(key) ? reason[key] : ""})
        rec.push_back(c);
      const Json& sp = pj.contains("strategy_params") ? pj["strategy_params"] : Json::object();
      for (auto& k : swept) rec.push_back(sp.contains(strategy) && sp[strategy].contains(k) ? json_str(sp[strategy][k]) : "");
      csv_row(f, rec);
    }
  commit_checked(csv_file);

  // Point names: the axes that vary (task first).
  const std::vector<std::string> varying = varying_axes(points);
  std::vector<std::string> names;
  for (auto& [pi, pj] : points) {
    std::string n;
    for (auto& k : varying) {
      if (!pj.contains(k)) continue;  // an axis this point does not have (a retrieval task without a needle: depth)
      std::string v = json_str(pj[k]);
      if (k == "model" && v.rfind("synthetic:", 0) == 0) v = v.substr(10, v.find('?') - 10);
      if (k == "model") v = fs::path(v).filename().string();
      if (k == "strategy_params") v = swept_values(pj[k]);
      n += (n.empty() ? "" : "/") + v;
    }
    names.push_back(n.empty() ? json_str(pj["task"]) : n);
  }
  size_t w0 = 16;
  for (auto& l : labels) w0 = std::max(w0, l.size() + 1);
  std::vector<size_t> widths;
  for (auto& n : names) widths.push_back(std::max<size_t>(13, n.size() + 1));
  auto table = [&](const std::string& title, auto&& cell_text, auto&& value, int mean_decimals = 3) {
    std::string out = title + "\n" + fmt::format("{:<{}}", "strategy", w0);
    for (size_t i = 0; i < names.size(); ++i) out += fmt::format("{:>{}}", names[i], widths[i]);
    out += fmt::format(" {:>9}\n", "mean");
    for (auto& label : labels) {
      out += fmt::format("{:<{}}", label, w0);
      size_t i = 0;
      double sum = 0;
      int n = 0;
      for (auto& [pi, pj] : points) {
        const auto key = std::make_pair(pi, label);
        const Json* r = cell.count(key) ? cell[key] : nullptr;
        out += fmt::format("{:>{}}", r ? cell_text(*r) : reason.count(key) ? "failed" : "-", widths[i++]);
        const double v = r ? value(*r) : NAN;
        if (std::isfinite(v)) sum += v, ++n;
      }
      out += fmt::format(" {:>9}\n", n ? fmt::format("{:.{}f}", sum / n, mean_decimals) : "-");
    }
    return out;
  };
  // What every column shares, named once above the tables: model, context mode, shots, items,
  // lm-eval rules (a setting that varies is in the column names instead).
  auto shared = [&](const char* key, const char* acc_key = nullptr) {
    std::set<std::string> vals;
    for (auto& [k, r] : cell) {
      const Json& src = acc_key ? (*r)["accuracy"] : (*r)["point"];
      const char* f = acc_key ? acc_key : key;
      if (src.contains(f)) vals.insert(f == std::string("model") ? fs::path(json_str(src[f])).filename().string()
                                                                 : json_str(f == std::string("lm_eval") ? src[f]["version"] : src[f]));
    }
    return fmt::format("{}", fmt::join(vals, ", "));
  };
  std::string caption = "model: " + shared("model");
  for (auto [title, key, acc_key] : {std::tuple{"context", "context", "context"}, {"shots", "shots", "shots"},
                                     {"items per point", "n", "n"}, {"lm-eval", "lm_eval", "lm_eval"},
                                     {"protocol", "protocol", "protocol"}})
    if (const std::string v = shared(key, acc_key); !v.empty()) caption += fmt::format(" | {}: {}", title, v);
  std::string out = caption + "\n" + table(
      "accuracy (acc ± standard error) per point",
      [](const Json& r) { return fmt::format("{:.3f}±{:.3f}", r["accuracy"]["acc"].get<double>(),
                                             r["accuracy"]["acc_stderr"].get<double>()); },
      [](const Json& r) { return r["accuracy"]["acc"].get<double>(); });
  // r[block][key] when it is a number, else NaN.
  const auto number_in = [](const Json& r, const char* block, const char* key) {
    const auto b = r.find(block);
    if (b == r.end() || !b->is_object()) return double(NAN);
    const auto v = b->find(key);
    return v != b->end() && v->is_number() ? v->get<double>() : double(NAN);
  };
  bool any_fid = false;
  for (auto& [k, r] : cell) any_fid = any_fid || (*r)["fidelity"].is_object();
  if (any_fid) {
    std::string ref;
    for (auto& [k, r] : cell)
      if ((*r)["fidelity"].is_object()) ref = (*r)["fidelity"].value("reference", "");
    auto is_ref = [](const Json& r) {  // the reference's own row has no fidelity
      auto f = r.find("fidelity");
      return std::string(f == r.end() || !f->is_object() ? "ref" : "-");
    };
    // NaN where a row has no such figure (retrieval tasks: no KL)
    auto fid = [&](const Json& r, const char* k) { return number_in(r, "fidelity", k); };
    out += "\n";
    out += table(
        "agreement with " + ref + " (fraction of items with the same answer)",
        [&](const Json& r) { const double v = fid(r, "agreement"); return std::isfinite(v) ? fmt::format("{:.3f}", v) : is_ref(r); },
        [&](const Json& r) { return fid(r, "agreement"); });
    bool any_kl = false;
    for (auto& [k, r] : cell) any_kl = any_kl || std::isfinite(fid(*r, "mean_kl"));
    if (any_kl) {  // retrieval tasks compare outputs, not distributions
      out += "\n";
      out += table(
          "mean KL(" + ref + " ‖ strategy) per scored token, nats",
          [&](const Json& r) { const double v = fid(r, "mean_kl"); return std::isfinite(v) ? fmt::format("{:.2e}", v) : is_ref(r); },
          [&](const Json& r) { return fid(r, "mean_kl"); });
    }
  }
  // Each strategy against the reference on the same items: what an unpaired ± hides.
  {
    std::string lines;
    for (auto& label : labels) {
      size_t i = 0;
      for (auto it = points.begin(); it != points.end(); ++it, ++i) {
        const auto key = std::make_pair(it->first, label);
        if (!cell.count(key)) continue;
        const Json& r = *cell[key];
        const auto pc = r.find("paired");
        if (pc == r.end() || !pc->is_object()) continue;
        const auto ci = (*pc)["ci95"];
        lines += fmt::format("{:<{}}{:<{}}{:>+8.3f}  [{:+.3f}, {:+.3f}]  McNemar p {:.3g}  ({} vs {} discordant)\n", label,
                             w0, names[i], widths[i] + 2, (*pc)["diff"].get<double>(),
                             ci[0].get<double>(), ci[1].get<double>(), (*pc)["mcnemar_p"].get<double>(),
                             (*pc)["only_strategy_right"].get<int>(), (*pc)["only_reference_right"].get<int>());
      }
    }
    if (!lines.empty()) {
      std::string ref;
      for (auto& [k, r] : cell)
        if (r->contains("paired") && (*r)["paired"].is_object()) ref = (*r)["paired"].value("reference", "");
      out += "\naccuracy − " + ref + "'s on the same items: difference [paired bootstrap 95% interval], McNemar's exact p "
             "(items only the strategy got right vs only " + ref + ")\n" + lines;
    }
  }
  // What the budgets compressed: a strategy at 1.000 attended every key of the steps scored.
  auto attended = [&](const Json& r) { return number_in(r, "accuracy", "attended_fraction"); };
  bool any_att = false;
  for (auto& [k, r] : cell) any_att = any_att || std::isfinite(attended(*r));
  if (any_att) {
    out += "\n";
    out += table(
        "attended fraction of the context on the scored decode steps",
        [&](const Json& r) { const double v = attended(r); return std::isfinite(v) ? fmt::format("{:.3f}", v) : std::string("-"); },
        attended);
  }
  // The scoring's throughput: token rows forwarded (prompt and decode) per second of wall clock.
  auto rate = [&](const Json& r) { return number_in(r, "figures", "scored_tokens_per_s"); };
  bool any_rate = false;
  for (auto& [k, r] : cell) any_rate = any_rate || std::isfinite(rate(*r));
  if (any_rate) {
    out += "\n";
    out += table(
        "scored tokens per second (prompt and decode rows forwarded, wall clock on this machine)",
        [&](const Json& r) { const double v = rate(r); return std::isfinite(v) ? fmt::format("{:.0f}", v) : std::string("-"); },
        rate, 0);
  }
  write_checked(dir + "/table.txt", out);
  return out;
}

}  // namespace

double band_figure(const ResultRow& r, const char* end, const char* key) {
  if (!r.ok) return NAN;
  const auto& j = r.json;
  const nlohmann::ordered_json::json_pointer at(std::string("/figures/modeled/band/") + end + "/" + key);
  return j.contains(at) && j.at(at).is_number() ? j.at(at).get<double>() : NAN;
}
double band_time(const ResultRow& r, const char* end) { return band_figure(r, end, "end_to_end_s"); }

std::string band_text(double a, double b) {
  const std::string lo = fmt::format("{:.2f}", std::min(a, b)), hi = fmt::format("{:.2f}", std::max(a, b));
  return lo == hi ? lo : lo + "–" + hi;
}

// A path as written, with `.` and `..` resolved lexically and no trailing separator, so that
// `out/x/../R` is checked as the `out/R` it names.
static std::string normal_dir(const std::string& dir) {
  std::string n = fs::path(dir).lexically_normal().string();
  while (n.size() > 1 && n.back() == '/') n.pop_back();
  return n.empty() ? std::string(".") : n;
}

// An exclusive lock on result directory `dir` (its .lock file, holding the writer's pid) for as
// long as the returned descriptor is open: one writer per directory; a second exits 2 naming the first.
static int lock_result_dir(const std::string& dir) {
  const std::string path = dir + "/" + kLockFile;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) input_error("{}: cannot open ({})", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    const std::string holder = n > 0 ? std::string(buf, size_t(n)) : std::string("?");
    input_error(
        "{}: another hgbench (pid {}) is writing this result directory; wait for it to end or give "
        "another output directory",
        dir, holder);
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
    ::close(fd);
    input_error("{}: cannot write ({})", path, std::strerror(errno));
  }
  return fd;
}

// Whether `dir` holds anything besides its lock file.
static bool holds_results(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename() != kLockFile) return true;
  return false;
}

ResultDir::ResultDir(const std::string& dir_in, const ExperimentSpec& spec, bool resume, bool force,
                     const std::string& shard)
    : dir_(normal_dir(dir_in)) {
  const std::string& dir = dir_;
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(dir, ec));
  if (exists && fs::is_symlink(fs::symlink_status(dir)))
    input_error("{}: the output directory is a symbolic link; give a real directory", dir);
  if (exists && !fs::is_directory(dir)) input_error("{}: exists and is not a directory", dir);
  if (resume && !exists) input_error("{}: --resume needs an existing result directory", dir);
  fs::create_directories(dir, ec);
  if (ec) input_error("{}: cannot create the output directory ({})", dir, ec.message());
  lock_.fd = lock_result_dir(dir);
  const bool non_empty = holds_results(dir);
  if (resume) {
    check_same_experiment(dir, spec, shard);
  } else if (non_empty) {
    if (!force)
      input_error("{}: the output directory is not empty (--resume to continue it, --force to replace it)", dir);
    refuse_unless_result_dir(dir);
    for (const auto& e : fs::directory_iterator(dir))  // the lock file stays, held
      if (e.path().filename() != kLockFile) fs::remove_all(e.path());
  }
  const std::string rows = dir + "/" + kRows;
  if (resume && fs::exists(rows)) {
    // Cut a torn last line (a kill mid-write) before appending after it.
    const std::string all = read_regular_file(rows, kMaxRowsBytes);
    const size_t keep = all.rfind('\n') == std::string::npos ? 0 : all.rfind('\n') + 1;
    if (keep != all.size()) fs::resize_file(rows, keep);
    for (auto& r : read_rows(dir)) {
      done_.insert(r.key());
      ++resumed_;
    }
  }
  write_config(dir, spec, shard);
  fd_ = ::open(rows.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) input_error("{}: cannot open for appending", rows);
}

std::map<std::string, std::string> recorded_inputs(const std::vector<ResultRow>& rows,
                                                   const std::string& where) {
  std::map<std::string, std::string> seen;
  const nlohmann::ordered_json::json_pointer at("/provenance/inputs");
  for (const ResultRow& r : rows) {
    if (!r.json.contains(at) || !r.json.at(at).is_object()) continue;
    for (const auto& [name, in] : r.json.at(at).items()) {
      if (!in.is_object() || !in.contains("path") || !in.contains("fnv1a64_size_head_tail")) continue;
      const std::string path = in["path"].get<std::string>();
      const std::string id = fmt::format("{} {}", in.value("bytes", int64_t(-1)),
                                         in["fnv1a64_size_head_tail"].get<std::string>());
      auto [it, fresh] = seen.emplace(path, id);
      if (!fresh && it->second != id)
        input_error(
            "{}: rows of two versions of {} (size and fingerprint {} and {}); rerun them into one directory",
            where, path, it->second, id);
    }
  }
  return seen;
}

ResultDir::~ResultDir() {
  if (fd_ >= 0) ::close(fd_);
}

ResultDir::Lock::~Lock() {
  if (fd >= 0) ::close(fd);
}

std::vector<int> ResultDir::done(const std::string& point_id, const std::string& label) const {
  std::vector<int> r;
  for (auto& [p, l, rep] : done_)
    if (p == point_id && l == label) r.push_back(rep);
  return r;
}

void ResultDir::append(const Json& row) {
  // A row the readers would refuse is never written.
  const ResultRow checked = ResultRow::parse(row, fmt::format("{}/{} (row being appended)", dir_, kRows));
  const std::string line = json_text(row) + "\n";
  ssize_t n = ::write(fd_, line.data(), line.size());
  if (n >= 0 && n < ssize_t(line.size())) {  // a short write: the rest tells why (or completes it)
    const ssize_t m = ::write(fd_, line.data() + n, line.size() - size_t(n));
    if (m > 0) n += m;
  }
  if (n != ssize_t(line.size())) {
    const int err = errno;
    // Undo a partial line so that the rows already written stay valid.
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    if (n > 0 && end >= n && ::ftruncate(fd_, end - n) != 0) {}
    throw IoError(fmt::format("{}/{}: cannot append a row ({}); the {} rows before it are intact (continue with "
                              "--resume {} once there is space)",
                              dir_, kRows, std::strerror(err), done_.size(), dir_));
  }
  ::fdatasync(fd_);
  done_.insert(checked.key());
}

std::vector<ResultRow> read_rows(const std::string& dir, bool* torn) {
  std::vector<ResultRow> rows;
  if (!file_present(dir + "/" + kRows)) input_error("{}: no {} (not a result directory)", dir, kRows);
  const std::string all = read_regular_file(dir + "/" + kRows, kMaxRowsBytes);
  if (torn) *torn = !all.empty() && all.back() != '\n';
  size_t pos = 0, line_no = 0;
  while (pos < all.size()) {
    const size_t nl = all.find('\n', pos);
    ++line_no;
    if (nl == std::string::npos) break;  // torn last line
    const std::string line = all.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    Json j;
    try {
      j = Json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      input_error("{}/{}:{}: not a JSON row ({})", dir, kRows, line_no, e.what());
    }
    rows.push_back(ResultRow::parse(std::move(j), fmt::format("{}/{}:{}", dir, kRows, line_no)));
  }
  return rows;
}

std::string write_summary(const std::string& dir, const std::vector<ResultRow>& rows, const std::string& baseline,
                          const std::vector<std::string>& labels) {
  if (std::any_of(rows.begin(), rows.end(), [](const ResultRow& r) { return r.accuracy; }))
    return write_accuracy_summary(dir, rows, labels);
  // (point index, label) → its rows; point index → the row's point and id.
  std::map<int, Json> points;
  std::map<std::pair<int, std::string>, std::vector<const ResultRow*>> cells;
  bool modeled = false, dry = false;
  for (auto& r : rows) {
    const int pi = r.point_index;
    points[pi] = r.point;
    points[pi]["id"] = r.point_id;
    cells[{pi, r.label}].push_back(&r);
    if (r.ok) {
      modeled = modeled || r.time_basis.rfind("modeled", 0) == 0;
      dry = dry || r.time_basis == "modeled (dry)";
    }
  }
  auto times = [&](int pi, const std::string& label) {
    std::vector<double> t;
    for (const ResultRow* r : cells[{pi, label}])
      if (r->ok) t.push_back(r->figure("time_s"));
    return t;
  };
  // Modeled rows' end-to-end latency at one end of the profile's band ("peak", "achieved").
  auto band_times = [&](int pi, const std::string& label, const char* end) {
    std::vector<double> t;
    for (const ResultRow* r : cells[{pi, label}])
      if (const double x = band_time(*r, end); !std::isnan(x)) t.push_back(x);
    return t;
  };
  // A band end's time over the baseline's at the same end and point.
  auto band_norm = [&](int pi, const std::string& label, const char* end) {
    return median_of(band_times(pi, label, end)) / median_of(band_times(pi, baseline, end));
  };
  bool banded = false;
  for (auto& r : rows) banded = banded || !std::isnan(band_time(r, "achieved"));
  // Axes that vary between points name them in the table.
  const std::vector<std::string> varying = varying_axes(points);

  const std::string csv_path = dir + "/summary.csv";
  AtomicFile csv_file(csv_path);
  FILE* f = csv_file.file();
  // The point's axes as the table of axes records them, then the row's figures.
  std::vector<std::string> head = {"point_id", "point_index", "model"};
  for (const SweepAxis* ax : recorded_axes(false)) head.push_back(ax->name);
  for (const char* k : {"label",
                        "strategy",
                        "status",
                        "repeats_ok",
                        "time_basis",
                        "time_metric",
                        "time_s_median",
                        "time_s_min",
                        "time_s_max",
                        "prefill_s_median",
                        "decode_s_median",
                        "decode_token_s_median",
                        "normalized_time",
                        "speedup_vs_baseline",
                        "attended_fraction",
                        "attended_accel_tokens",
                        "attended_cpu_tokens",
                        "kv_dtype",
                        "h2d_bytes_per_step",
                        "modeled_over_measured",
                        "time_s_peak",
                        "time_s_achieved",
                        "speedup_peak",
                        "speedup_achieved",
                        "gpu_kv_budget_bytes",
                        "gpu_kv_peak_bytes",
                        "reason"})
    head.push_back(k);
  // Every swept strategy parameter as a column: its value for the row's strategy ("" when the
  // strategy has no such parameter).
  const std::vector<std::string> swept = swept_params(points);
  for (auto& k : swept) head.push_back("param." + k);
  auto param_cells = [&](const Json& pj, const std::string& strategy) {
    std::vector<std::string> v;
    const Json& sp = pj.contains("strategy_params") ? pj["strategy_params"] : Json::object();
    for (auto& k : swept)
      v.push_back(sp.contains(strategy) && sp[strategy].contains(k) ? json_str(sp[strategy][k]) : "");
    return v;
  };
  csv_row(f, head);
  std::map<std::string, std::vector<double>> norm_by_label;
  for (auto& [pi, pj] : points) {
    const double base = median_of(times(pi, baseline));
    for (auto& label : labels) {
      const auto& rs = cells[{pi, label}];
      if (rs.empty()) continue;
      const std::vector<double> t = times(pi, label);
      const ResultRow* ok = nullptr;
      std::string reason, strategy = rs.front()->strategy;
      std::vector<double> tok, pre, dec, frac, acc, cpu, mom;
      double h2d = 0;
      for (const ResultRow* r : rs) {
        if (r->ok) {
          ok = r;
          tok.push_back(r->figure("decode_token_s"));
          pre.push_back(r->figure("prefill_s"));
          dec.push_back(r->figure("decode_s"));
          if (const double m = r->figure("modeled_over_measured", "end_to_end"); !std::isnan(m)) mom.push_back(m);
          if (const double fr = r->figure("attended", "fraction"); !std::isnan(fr)) {
            frac.push_back(fr);
            acc.push_back(r->figure("attended", "accel_tokens"));
            cpu.push_back(r->figure("attended", "cpu_tokens"));
          }
          if (auto lb = r->json.find("link_bytes_per_step"); lb != r->json.end() && lb->is_object())
            for (auto& [k, v] : lb->items())
              if (k.size() > 5 && k.substr(k.size() - 5) == "->gpu" && v.is_number())
                h2d += v.get<double>() / double(t.size());
        } else {
          reason = r->reason;
        }
      }
      const double med = median_of(t), nt = med / base;
      const double pk = median_of(band_times(pi, label, "peak")),
                   ac = median_of(band_times(pi, label, "achieved"));
      std::vector<double> kv_budget, kv_peak;
      for (const ResultRow* r : rs)
        if (r->ok)
          if (const auto g = gpu_kv(*r); g.first >= 0)
            kv_budget.push_back(g.first), kv_peak.push_back(g.second);
      if (std::isfinite(nt)) norm_by_label[label].push_back(nt);
      std::vector<std::string> rec = {json_str(pj["id"]), std::to_string(pi), json_str(pj["model"])};
      for (auto& c : axis_cells(pj, false)) rec.push_back(c);
      for (auto& c : std::vector<std::string>{label,
                                              strategy,
                                              ok ? (t.size() == rs.size() ? "ok" : "partial") : "failed",
                                              std::to_string(t.size()),
                                              ok ? ok->time_basis : "",
                                              ok ? ok->figure_text("time_metric", "decode") : "",
                                              num(med),
                                              t.empty() ? "" : num(*std::min_element(t.begin(), t.end())),
                                              t.empty() ? "" : num(*std::max_element(t.begin(), t.end())),
                                              num(median_of(pre)),
                                              num(median_of(dec)),
                                              num(median_of(tok)),
                                              num(nt),
                                              num(base / med),
                                              num(median_of(frac)),
                                              num(median_of(acc)),
                                              num(median_of(cpu)),
                                              ok ? ok->figure_text("kv_dtype", "") : "",
                                              num(h2d),
                                              num(median_of(mom)),
                                              num(pk),
                                              num(ac),
                                              num(1 / band_norm(pi, label, "peak")),
                                              num(1 / band_norm(pi, label, "achieved")),
                                              num(median_of(kv_budget)),
                                              num(median_of(kv_peak)),
                                              reason})
        rec.push_back(c);
      for (auto& c : param_cells(pj, strategy)) rec.push_back(c);
      csv_row(f, rec);
    }
  }
  commit_checked(csv_file);

  // The table: strategies down, points across, geometric mean last (the paper's Figs. 15-19).
  bool end_to_end = false;
  for (auto& r : rows) end_to_end = end_to_end || (r.ok && r.figure_text("time_metric", "") == "end_to_end");
  std::string out = fmt::format("{} normalised to {} per point, lower is better ({}){}\n",
                                end_to_end ? "end-to-end latency (prefill + decode)" : "decode time", baseline,
                                modeled ? (dry ? "MODELED, dry execution" : "MODELED") : "measured",
                                modeled ? " — modeled on a platform profile, not measured" : "");
  if (banded)
    out +=
        "each cell a band: the profile at its peak rates without fixed costs – at achieved rates with "
        "measured fixed costs (lower–higher)\n";
  if (const std::string axes = axes_caption(varying); !axes.empty()) out += "columns: " + axes + "\n";
  std::vector<std::string> names;
  size_t w0 = 16;
  for (auto& l : labels) w0 = std::max(w0, l.size() + 1);
  for (auto& [pi, pj] : points) names.push_back(point_name(pj, varying));
  std::vector<size_t> widths;
  const size_t cell_w = banded ? 11 : 8;
  out += fmt::format("{:<{}}", "strategy", w0);
  for (auto& n : names) {
    widths.push_back(std::max<size_t>(cell_w, n.size() + 1));
    out += fmt::format("{:>{}}", n, widths.back());
  }
  out += fmt::format("{:>{}}\n", "geomean", cell_w + 1);
  // A band's two ends, normalised each to the baseline's at the same end; the lower first.
  auto band_cell = [&](int pi, const std::string& label, double* lp, double* la) {
    const double p = band_norm(pi, label, "peak"), a = band_norm(pi, label, "achieved");
    *lp = p, *la = a;
    return std::isfinite(p) && std::isfinite(a) ? band_text(p, a) : std::string("failed");
  };
  bool partial_geomean = false;
  for (auto& label : labels) {
    out += fmt::format("{:<{}}", label, w0);
    size_t i = 0;
    double logsum = 0, logsum_p = 0, logsum_a = 0;
    int n = 0, n_band = 0;
    for (auto& [pi, pj] : points) {
      const double base = median_of(times(pi, baseline)), med = median_of(times(pi, label));
      const double nt = med / base;
      const bool any = !cells[{pi, label}].empty();
      std::string cell = !any ? "-" : std::isfinite(nt) ? fmt::format("{:.2f}", nt) : "failed";
      if (banded && any) {
        double p = NAN, a = NAN;
        cell = band_cell(pi, label, &p, &a);
        if (std::isfinite(p) && std::isfinite(a) && p > 0 && a > 0)
          logsum_p += std::log(p), logsum_a += std::log(a), ++n_band;
      }
      out += fmt::format("{:>{}}", cell, widths[i++]);
      if (std::isfinite(nt) && nt > 0) logsum += std::log(nt), ++n;
    }
    const bool partial = n > 0 && size_t(n) < points.size();
    partial_geomean = partial_geomean || partial;
    const std::string gm =
        !n ? "-"
        : banded && n_band
            ? band_text(std::exp(logsum_p / n_band), std::exp(logsum_a / n_band)) + (partial ? "*" : "")
            : fmt::format("{:.2f}{}", std::exp(logsum / n), partial ? "*" : "");
    out += fmt::format("{:>{}}\n", gm, cell_w + 1);
  }
  if (partial_geomean)
    out += "* geomean over fewer points than the table has (points not run yet or failed): not comparable across rows\n";
  // A measured run's absolute figures come first: seconds and decode tokens/s over the repeats, as
  // mean ± sd (one repeat: its value, no spread), so that a ratio can be read against its noise.
  if (!modeled) {
    auto spread = [](const std::vector<double>& v) {
      if (v.empty()) return std::string("failed");
      // `digits` significant digits, whole numbers once those are all before the point (no exponents).
      auto f = [](double x, int digits) {
        return std::abs(x) >= std::pow(10.0, digits - 1) ? fmt::format("{:.0f}", x) : fmt::format("{:.{}g}", x, digits);
      };
      return v.size() == 1 ? f(mean(v), 3) : f(mean(v), 3) + "±" + f(sample_sd(v), 2);
    };
    size_t reps = 0;
    for (auto& [key, rs] : cells) reps = std::max(reps, rs.size());
    std::string abs = fmt::format("{} in seconds, and decode tokens/s of all sequences (measured), mean ± sd over {} repeat{}\n",
                                  end_to_end ? "end-to-end latency" : "decode time", reps, reps == 1 ? " (no spread)" : "s");
    if (const std::string axes = axes_caption(varying); !axes.empty()) abs += "columns: " + axes + "\n";
    std::vector<size_t> aw;
    for (auto& n : names) aw.push_back(std::max<size_t>(13, n.size() + 1));
    for (int which = 0; which < 2; ++which) {
      abs += fmt::format("{:<{}}", which == 0 ? "seconds" : "decode tok/s", w0);
      for (size_t i = 0; i < names.size(); ++i) abs += fmt::format("{:>{}}", names[i], aw[i]);
      abs += "\n";
      for (auto& label : labels) {
        abs += fmt::format("{:<{}}", label, w0);
        size_t i = 0;
        for (auto& [pi, pj] : points) {
          // Tokens/s of all sequences: a decode step makes one token of each.
          const double batch = pj.contains("batch") && pj["batch"].is_number() ? pj["batch"].get<double>() : 1.0;
          std::vector<double> v;
          for (const ResultRow* r : cells[{pi, label}])
            if (r->ok) v.push_back(which == 0 ? r->figure("time_s") : batch / r->figure("decode_token_s"));
          abs += fmt::format("{:>{}}", cells[{pi, label}].empty() ? "-" : spread(v), aw[i++]);
        }
        abs += "\n";
      }
    }
    out = abs + "\n" + out;
  }
  // Beside the times, one block per recorded figure (shown when any row has it): how much of the
  // context each strategy attended (budgets are matched only where these agree) with the KV element
  // type it stored, and for real runs replayed on a profile the modeled clock against the same run.
  auto ok_fig = [&](int pi, const std::string& label, const char* key, const char* sub) {
    std::vector<double> v;
    for (const ResultRow* r : cells[{pi, label}])
      if (const double x = r->figure(key, sub); !std::isnan(x)) v.push_back(x);
    return median_of(v);
  };
  auto kv_type = [&](const std::string& label) {
    for (auto& [pi, pj] : points)
      for (const ResultRow* r : cells[{pi, label}])
        if (r->ok) return r->figure_text("kv_dtype", "-");
    return std::string("-");
  };
  // relative: each value over the baseline's at the same point.
  auto block = [&](const std::string& title, const char* key, const char* sub, int digits, bool with_kv,
                   bool relative = false) {
    bool any = false;
    for (auto& [pi, pj] : points)
      for (auto& label : labels) any = any || std::isfinite(ok_fig(pi, label, key, sub));
    if (!any) return;
    out += fmt::format("\n{}\n{:<{}}", title, "strategy", w0);
    for (size_t i = 0; i < names.size(); ++i) out += fmt::format("{:>{}}", names[i], widths[i]);
    out += with_kv ? fmt::format("{:>9}\n", "kv") : "\n";
    for (auto& label : labels) {
      out += fmt::format("{:<{}}", label, w0);
      size_t i = 0;
      for (auto& [pi, pj] : points) {
        const double v = ok_fig(pi, label, key, sub) / (relative ? ok_fig(pi, baseline, key, sub) : 1.0);
        out += fmt::format("{:>{}}", std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : "-", widths[i++]);
      }
      out += with_kv ? fmt::format("{:>9}\n", kv_type(label)) : "\n";
    }
  };
  // A block of text cells: a title, the point names, then one row per label of `which`.
  auto cell_block = [&](const std::string& title, const std::vector<std::string>& which,
                        const std::function<std::string(int, const std::string&)>& cell) {
    out += fmt::format("\n{}\n{:<{}}", title, "strategy", w0);
    for (size_t i = 0; i < names.size(); ++i) out += fmt::format("{:>{}}", names[i], widths[i]);
    out += "\n";
    for (auto& label : which) {
      out += fmt::format("{:<{}}", label, w0);
      size_t i = 0;
      for (auto& [pi, pj] : points) out += fmt::format("{:>{}}", cell(pi, label), widths[i++]);
      out += "\n";
    }
  };
  // Decode throughput beside the latency: the decode length decides how much the prefill weighs.
  if (banded)
    cell_block("decode tokens/s, all sequences (MODELED; achieved–peak ends of the band)", labels,
               [&](int pi, const std::string& label) {
                 std::vector<double> pk, ac;
                 for (const ResultRow* r : cells[{pi, label}]) {
                   if (const double x = band_figure(*r, "peak", "decode_tokens_per_s"); std::isfinite(x))
                     pk.push_back(x);
                   if (const double x = band_figure(*r, "achieved", "decode_tokens_per_s"); std::isfinite(x))
                     ac.push_back(x);
                 }
                 if (pk.empty() || ac.empty()) return std::string("-");
                 return fmt::format("{:.3g}–{:.3g}", std::min(median_of(pk), median_of(ac)),
                                    std::max(median_of(pk), median_of(ac)));
               });
  block("attended fraction of the context per decode step (mean), and the KV element type", "attended", "fraction", 3,
        true);
  // The scheduler's decisions (strategy_stats.mean): the mode and K the timed steps ran at, to set
  // beside the settings an accuracy run used.
  {
    auto stat = [](const ResultRow& r, const char* key) {
      const nlohmann::ordered_json::json_pointer at(std::string("/strategy_stats/mean/") + key);
      return r.ok && r.json.contains(at) && r.json.at(at).is_number() ? r.json.at(at).get<double>() : NAN;
    };
    std::vector<std::string> sched;
    for (auto& label : labels)
      for (auto& [pi, pj] : points)
        for (const ResultRow* r : cells[{pi, label}])
          if (std::isfinite(stat(*r, "mode_pre")) && (sched.empty() || sched.back() != label)) sched.push_back(label);
    if (!sched.empty())
      cell_block(
          "scheduler: share of decode steps in pre mode / mean K (strategy_stats.trajectory has each step)",
          sched, [&](int pi, const std::string& label) {
            std::vector<double> pre, k;
            for (const ResultRow* r : cells[{pi, label}])
              if (std::isfinite(stat(*r, "mode_pre")))
                pre.push_back(stat(*r, "mode_pre")), k.push_back(stat(*r, "K"));
            return pre.empty() ? std::string("-")
                               : fmt::format("{:.2f}/{:.0f}", median_of(pre), median_of(k));
          });
  }
  // Each strategy's accelerator KV peak beside the point's budget: who used the memory it was given.
  bool any_budget = false;
  for (auto& r : rows) any_budget = any_budget || gpu_kv(r).first > 0;
  if (any_budget)
    cell_block("accelerator KV peak / budget (MB; the budget is gpu_kv_bytes, shared by every strategy)",
               labels, [&](int pi, const std::string& label) {
                 std::vector<double> b, pk;
                 for (const ResultRow* r : cells[{pi, label}])
                   if (const auto g = gpu_kv(*r); g.first >= 0) b.push_back(g.first), pk.push_back(g.second);
                 return b.empty() ? std::string("-")
                        : median_of(b) > 0
                            ? fmt::format("{:.0f}/{:.0f}", median_of(pk) / 1e6, median_of(b) / 1e6)
                            : fmt::format("{:.0f}/-", median_of(pk) / 1e6);
               });
  block("modeled ÷ measured end-to-end latency (the modeled clock checked against the same run)",
        "modeled_over_measured", "end_to_end", 2, false);
  block("modeled ÷ measured per decode token (median step)", "modeled_over_measured", "decode_token", 2, false);
  // The same over the baseline's: the profile's absolute rates drift with the machine between
  // calibration and run, a factor every strategy shares; what is left is the clock's error in
  // the ratios the tables report.
  block("modeled ÷ measured relative to " + baseline + "'s (the error in ratios between strategies)",
        "modeled_over_measured", "end_to_end", 2, false, true);
  write_checked(dir + "/table.txt", out);
  return out;
}

MergeReport merge_results(const std::vector<std::string>& dirs, const std::string& out_in,
                          const MergeOptions& opts) {
  const std::string out = normal_dir(out_in);
  if (dirs.empty()) input_error("merge: give the shard directories to join");
  MergeReport rep;
  std::vector<ResultRow> all;
  std::set<std::tuple<std::string, std::string, int>> seen;
  std::string experiment;
  std::string first_dir;
  std::map<std::string, int> label_order;
  std::string baseline;
  std::optional<ExperimentSpec> spec;
  std::map<int, std::string> shard_dir;  // shard number → its directory
  // The output is written after its inputs are read, over whatever it held: it must be none of them.
  std::error_code ec;
  const fs::path out_abs = fs::weakly_canonical(fs::absolute(out), ec);
  for (auto& d : dirs) {
    const fs::path d_abs = fs::weakly_canonical(fs::absolute(d), ec);
    const auto within = [](const fs::path& a, const fs::path& b) {  // a is b or inside it
      const auto r = a.lexically_relative(b);
      return !r.empty() && *r.begin() != "..";
    };
    if (within(out_abs, d_abs) || within(d_abs, out_abs))
      input_error("merge: --out {} is, or holds, the input directory {}; give a new directory", out, d);
  }
  YAML::Node first_cfg;
  for (auto& d : dirs) {
    if (opts.shards > 0 && !fs::exists(d + "/config.yaml")) continue;  // a shard that has not run
    if (!file_present(d + "/config.yaml")) input_error("{}: no config.yaml (not a result directory)", d);
    const YAML::Node y = load_config(d + "/config.yaml");
    const std::string name = y["name"] ? y["name"].as<std::string>() : "";
    if (experiment.empty()) {
      experiment = name, first_dir = d, first_cfg = y;
    } else if (name != experiment) {
      input_error("{}: experiment '{}' does not match '{}' of {}", d, name, experiment, first_dir);
    } else if (const auto differ = config_differences(first_cfg, y); !differ.empty()) {
      input_error("{}: not a shard of the same experiment as {}: {} differ{}", d, first_dir, fmt::join(differ, "; "),
                  differ.size() == 1 ? "s" : "");
    }
    if (!spec) {
      spec = parse_experiment(YAML::Dump(y), d + "/config.yaml");
      baseline = spec->baseline;
      for (auto& e : spec->strategies) label_order.emplace(e.label, int(label_order.size()));
    }
    if (opts.shards > 0) {
      const std::string s = shard_of(d);
      if (s.empty()) input_error("{}: no shard.txt (not a shard directory of `hgbench FILE --shard I/N`)", d);
      const size_t slash = s.find('/');
      const int i = std::atoi(s.substr(0, slash).c_str()), n = slash == std::string::npos ? 0 : std::atoi(s.substr(slash + 1).c_str());
      if (n != opts.shards) input_error("{}: holds shard {}, not one of {} shards", d, s, opts.shards);
      if (shard_dir.count(i)) input_error("{}: shard {} appears twice (also {})", d, s, shard_dir[i]);
      shard_dir[i] = d;
    }
    bool torn = false;
    auto rows_d = read_rows(d, &torn);
    if (torn)  // a kill mid-write: the row it was writing would be dropped without a word
      input_error("{}/rows.jsonl: its last row is torn (a kill mid-write); `--resume {}` completes it first",
                  d, d);
    for (auto& r : rows_d) {
      if (!seen.insert(r.key()).second) {  // the same row in two shards (a resubmitted shard): the first kept
        ++rep.duplicates;
        continue;
      }
      all.push_back(std::move(r));
    }
  }
  if (!spec) input_error("merge: none of the {} shard directories has run yet ({} …)", dirs.size(), dirs.front());
  if (opts.shards > 0) {
    // What each shard owes: its points (index % N == i) × strategies × repeats.
    const std::vector<Point> points = expand(*spec);
    for (int i = 0; i < opts.shards; ++i) {
      size_t owed = 0, have = 0;
      for (auto& p : points) {
        if (p.index % opts.shards != i) continue;
        for (auto& e : spec->strategies)
          for (int r = 0; r < spec->repeats; ++r) {
            ++owed;
            have += seen.count({p.id, e.label, r});
          }
      }
      if (!shard_dir.count(i))
        rep.missing.push_back(fmt::format("shard {} of {}: missing (no result directory)", i, opts.shards));
      else if (have < owed)
        rep.missing.push_back(
            fmt::format("shard {} of {}: incomplete, {} of {} rows missing ({})", i, opts.shards, owed - have, owed, shard_dir[i]));
      else
        continue;
      rep.missing_shards.push_back(i);
    }
    if (!rep.missing.empty()) return rep;
  }
  std::stable_sort(all.begin(), all.end(), [&](const ResultRow& a, const ResultRow& b) {
    return std::make_tuple(a.point_index, label_order[a.label], a.repeat) <
           std::make_tuple(b.point_index, label_order[b.label], b.repeat);
  });
  (void)recorded_inputs(all, "merge");  // shards run on different versions of an input
  // The output directory's writer lock while it is replaced (a run or resume in it meanwhile fails).
  ResultDir::Lock lock;
  if (fs::is_directory(out)) lock.fd = lock_result_dir(normal_dir(out));
  const bool replace = fs::exists(out) && holds_results(out);
  if (replace) {
    if (!opts.force) input_error("{}: the merge output directory is not empty (--force to replace it)", out);
    refuse_unless_result_dir(out);
  }
  // Written whole into a sibling staging directory, then renamed into place: a failure on the way
  // (a full disk, a kill) leaves `out` as it was.
  const fs::path out_path = fs::absolute(out).lexically_normal();
  const std::string stage = (out_path.parent_path() / fmt::format(".{}.merge.{}", out_path.filename().string(), ::getpid())).string();
  struct Staging {
    std::string dir;
    ~Staging() {
      std::error_code e;
      if (!dir.empty()) fs::remove_all(dir, e);
    }
  } staging{stage};
  fs::remove_all(stage, ec);
  fs::create_directories(stage, ec);
  if (ec) input_error("{}: cannot create ({})", stage, ec.message());
  fs::copy_file(first_dir + "/config.yaml", stage + "/config.yaml", fs::copy_options::overwrite_existing, ec);
  if (ec) throw IoError(fmt::format("{}/config.yaml: {}; {} is unchanged", stage, ec.message(), out));
  {
    AtomicFile o(stage + "/" + kRows);
    for (auto& r : all) o.write(json_text(r.json) + "\n");
    try {
      o.commit();
    } catch (const IoError& e) {
      throw IoError(fmt::format("{}; the input directories and {} are unchanged", e.what(), out));
    }
  }
  std::vector<std::string> labels(label_order.size());
  for (auto& [l, i] : label_order) labels[size_t(i)] = l;
  rep.table = write_summary(stage, all, baseline, labels);
  // The old output moves aside first, so that there is always a whole result at one of the names.
  const std::string old_out = replace ? stage + ".old" : "";
  if (replace) {
    fs::rename(out, old_out, ec);
    if (ec) throw IoError(fmt::format("{}: cannot move it aside ({}); it is unchanged", out, ec.message()));
  } else if (fs::exists(out)) {
    fs::remove(out, ec);  // an empty directory
  }
  fs::rename(stage, out, ec);
  if (ec) {
    if (replace) fs::rename(old_out, out, ec);
    throw IoError(fmt::format("{}: cannot rename the merged result into place ({}); {} is unchanged", stage, ec.message(), out));
  }
  staging.dir.clear();
  if (replace) fs::remove_all(old_out, ec);
  rep.rows = all.size();
  return rep;
}

}  // namespace hg
