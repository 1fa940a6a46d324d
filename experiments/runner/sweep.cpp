#include "experiments/runner/sweep.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "datasets/needle.h"
#include "datasets/tasks.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/formats/formats.h"
#include "experiments/runner/recorder.h"
#include "experiments/runner/runner.h"

namespace hg {
namespace {

// Ctrl-C once: finish the current run, then write the summary; twice: stop now, still writing the
// summary of the rows so far (run_sweep's watcher).
volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) {
  static const char first[] =
      "\nhgbench: Ctrl-C: finishing the current run, then the summary; Ctrl-C again to stop now\n";
  static const char second[] = "\nhgbench: stopping now; writing the summary of the rows so far\n";
  g_interrupted = g_interrupted ? 2 : 1;
  if (g_interrupted == 1) (void)!write(STDERR_FILENO, first, sizeof first - 1);
  else (void)!write(STDERR_FILENO, second, sizeof second - 1);
}

// A run's cost for the ETA: the tokens it processes (prompt + decode per sequence, times the
// batch and the repeats); an accuracy point counts its items.
double run_units(const Point& p, const ExperimentSpec& s) {
  if (!p.task.empty()) return double(std::max(1, p.limit));
  return double(std::max(1, p.prompt_tokens + p.decode_tokens)) * std::max(1, p.batch) * std::max(1, s.repeats);
}

std::string hms(double s) {
  const int t = int(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

std::vector<std::string> labels_of(const ExperimentSpec& s) {
  std::vector<std::string> l;
  for (auto& e : s.strategies) l.push_back(e.label);
  return l;
}

// "I/N" → (I, N) with 0 <= I < N.
std::pair<int, int> parse_shard(const std::string& s) {
  const size_t slash = s.find('/');
  try {
    if (slash != std::string::npos) {
      const int i = std::stoi(s.substr(0, slash)), n = std::stoi(s.substr(slash + 1));
      if (n >= 1 && i >= 0 && i < n) return {i, n};
    }
  } catch (...) {
  }
  input_error("--shard '{}': expected I/N with 0 <= I < N (e.g. 0/4)", s);
}

}  // namespace

std::string describe(const Point& p) {
  std::string s = p.model;
  if (s.rfind("synthetic:", 0) == 0) s = s.substr(10);
  if (!p.task.empty()) s += " task=" + p.task;
  for (const SweepAxis& ax : sweep_axes()) {
    if (!ax.record || !p.values.contains(ax.name)) continue;
    const auto& v = p.values[ax.name];
    if (v.is_null() || (v.is_number() && v.get<double>() == 0 && ax.name != "decode_tokens")) continue;
    s += " " + ax.name + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  for (auto& [st, kv] : p.strategy_params)
    for (auto& [k, v] : kv) s += fmt::format(" {}.{}={}", st, k, v);
  return s;
}

void check_inputs(const ExperimentSpec& spec) {
  for (const std::string& m : spec.models) {
    try {
      check_model_spec(m);
    } catch (const InputError& e) {
      input_error("{}: models: {}", spec.file, e.what());
    }
  }
  if (!spec.eval.enabled) return;
  const std::string data = resolve_data_dir(spec.eval.data_dir);
  for (const std::string& t : spec.eval.tasks) {
    try {
      // Generated tasks read no files, but for the essay haystack and the QA tasks' documents.
      if (needle_task_needs_essay(t)) (void)load_haystack(data, spec.eval.haystack);
      else if (needle_task_is_qa(t)) (void)load_qa_corpus(t, t == "qa_1" ? spec.eval.squad : spec.eval.hotpotqa);
      if (is_needle_task(t)) continue;
      (void)load_task(t, data);
    } catch (const InputError& e) {
      input_error("{}: eval.tasks: {}", spec.file, e.what());
    }
  }
}

int run_sweep(ExperimentSpec spec, const SweepOptions& o) {
  check_inputs(spec);
  const bool have_gpu = cuda_device_count_or_zero() > 0;
  const std::string how = resolve_execute(spec, have_gpu);
  // Asked for the GPU and none is here: say so before any row, not in every row of the result.
  if (!o.list && spec.execute == "real" && spec.device == "cuda" && !have_gpu)
    input_error("{}: device: cuda, but no CUDA device is visible on this machine (device: emulated runs on the host)",
                spec.file);
  const std::vector<Point> points = expand(spec);
  const auto [shard_i, shard_n] = o.shard.empty() ? std::pair{0, 1} : parse_shard(o.shard);
  std::vector<const Point*> mine;
  for (auto& p : points)
    if (p.index % shard_n == shard_i) mine.push_back(&p);
  const bool modeled = spec.clock != "measured";
  const std::string mode = spec.execute == "dry"  ? "dry execution, MODELED on a platform profile (nothing measured)"
                           : modeled              ? "real execution, measured, also MODELED on a platform profile"
                                                  : "real execution, measured";
  fmt::print("hgbench: {} — {} ({} points × {} strategies × {} repeats{})\n", spec.name, mode, mine.size(),
             spec.strategies.size(), spec.repeats, o.shard.empty() ? "" : ", shard " + o.shard);
  if (!how.empty()) fmt::print("hgbench: {}\n", how);
  std::fflush(stdout);
  if (o.list) {
    for (const Point* p : mine) fmt::print("{:>4} {}  {}\n", p->index, p->id, describe(*p));
    return 0;
  }
  std::string dir = !o.resume.empty() ? o.resume : !o.output.empty() ? o.output : spec.output;
  ResultDir out(dir, spec, !o.resume.empty(), o.force, o.shard);
  if (out.resumed_rows()) {
    fmt::print("hgbench: resuming {}: {} rows already recorded\n", dir, out.resumed_rows());
    // The inputs those rows were run on (model files, platform profiles) must be the ones here now.
    for (const auto& [path, was] : recorded_inputs(read_rows(out.path()), out.path())) {
      const nlohmann::ordered_json now = file_fingerprint(path);
      const std::string is = now.contains("fnv1a64_size_head_tail")
                                 ? fmt::format("{} {}", now["bytes"].get<int64_t>(),
                                               now["fnv1a64_size_head_tail"].get<std::string>())
                                 : std::string("missing");
      if (is == was) continue;
      if (!o.force)
        input_error(
            "{}: changed since the rows in {} were recorded (size and fingerprint {}, now {}); resume into a "
            "new directory, or add --force to mix them",
            path, out.path(), was, is);
      fmt::print(
          stderr,
          "hgbench: warning: {} changed since the rows in {} were recorded (--force: resuming anyway)\n",
          path, out.path());
    }
  }

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);  // Slurm's time limit; a closed terminal: as Ctrl-C
  sigaction(SIGHUP, &sa, nullptr);
  g_interrupted = 0;
  // The second Ctrl-C: the rows so far (each appended whole; a torn last line is skipped) summarised,
  // then exit 130 without waiting for the run in progress.
  std::atomic<bool> finished{false};
  std::thread watcher([&] {
    while (!finished.load()) {
      if (g_interrupted == 2) {
        try {
          const auto rows = read_rows(dir);
          write_summary(dir, rows, spec.baseline, labels_of(spec));
          fmt::print(stderr, "hgbench: stopped; {} rows in {} (summary.csv, table.txt); continue with hgbench --resume {}\n",
                     rows.size(), dir, dir);
        } catch (const std::exception& e) {
          fmt::print(stderr, "hgbench: stopped; the summary could not be written: {}\n", e.what());
        }
        std::_Exit(130);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  struct JoinWatcher {
    std::atomic<bool>& f;
    std::thread& t;
    ~JoinWatcher() {
      f = true;
      t.join();
    }
  } join_watcher{finished, watcher};

  Runner runner(spec);
  runner.items_dir = dir + "/items";
  runner.reference_dir = dir + "/references";
  const bool tty = isatty(STDERR_FILENO);
  // On a terminal the progress line is one line: cut to its width (a wrapped line would not be
  // overwritten by the next).
  auto fit = [tty](const std::string& text) {
    struct winsize ws {};
    if (!tty || ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col < 20) return text;
    if (text.size() < ws.ws_col) return text;
    size_t cut = size_t(ws.ws_col) - 2;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
    return text.substr(0, cut) + "…";
  };
  std::string line;
  auto item_start = std::chrono::steady_clock::now();
  runner.on_items = [&](int i, int n) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - item_start).count();
    const std::string eta = hms(el / i * (n - i));
    if (tty) fmt::print(stderr, "\r\033[K{}", fit(fmt::format("{} | items {}/{}, ETA {}", line, i, n, eta)));
    else if (i == n || i % std::max(1, n / 4) == 0) fmt::print(stderr, "  items {}/{} ({} elapsed, ETA {})\n", i, n, hms(el), eta);
  };
  const size_t total = mine.size() * spec.strategies.size();
  size_t done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  // ETA: what is left, each run's tokens at its strategy's seconds per token so far (all
  // strategies' rate before a strategy's first run).
  std::map<std::string, std::pair<double, double>> spent;  // label → (seconds, units) of fresh runs
  auto eta_text = [&]() -> std::string {
    double all_s = 0, all_u = 0;
    for (auto& [l, su] : spent) all_s += su.first, all_u += su.second;
    if (all_u <= 0) return "?";
    double left = 0;
    size_t k = 0;
    for (const Point* p : mine)
      for (auto& e : spec.strategies)
        if (k++ >= done) {
          const auto it = spent.find(e.label);
          const double rate = it != spent.end() && it->second.second > 0 ? it->second.first / it->second.second
                                                                           : all_s / all_u;
          left += rate * run_units(*p, spec);
        }
    return hms(left);
  };
  for (const Point* p : mine) {
    for (auto& e : spec.strategies) {
      if (g_interrupted) break;
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string eta = eta_text();
      line = fmt::format("[{}/{}] {} {} | {} elapsed, ETA {}", done + 1, total, e.label, describe(*p), hms(el), eta);
      item_start = std::chrono::steady_clock::now();
      const std::vector<int> skip = out.done(p->id, e.label);
      const bool fresh = int(skip.size()) < spec.repeats;
      // A run the resumed directory holds already is not printed again.
      if (fresh) {
        if (tty) fmt::print(stderr, "\r\033[K{}", fit(line));
        else fmt::print(stderr, "{}\n", line);
      }
      runner.run(*p, e, skip, [&](nlohmann::ordered_json row) {
        if (row.value("status", "") != "ok") {
          if (tty) fmt::print(stderr, "\n");
          fmt::print(stderr, "  point {} {} failed: {}\n", p->id, e.label, row.value("reason", ""));
        }
        out.append(row);
      });
      ++done;
      if (fresh) {
        auto& su = spent[e.label];
        su.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - item_start).count();
        su.second += run_units(*p, spec);
      }
    }
    if (g_interrupted) break;
  }
  if (tty) fmt::print(stderr, "\n");
  const auto rows = read_rows(dir);
  size_t failed_rows = 0;
  for (auto& r : rows) failed_rows += !r.ok;
  const std::string table = write_summary(dir, rows, spec.baseline, labels_of(spec));
  fmt::print("{}", table);
  fmt::print("results: {} ({} rows{}; summary.csv, table.txt; plots: scripts/plot {})\n", dir, rows.size(),
             failed_rows ? fmt::format(", {} failed", failed_rows) : "", dir);
  if (g_interrupted) {
    fmt::print(stderr, "hgbench: interrupted after {} of {} runs; continue with hgbench --resume {}\n", done, total, dir);
    return 130;
  }
  return failed_rows ? 1 : 0;
}

}  // namespace hg
