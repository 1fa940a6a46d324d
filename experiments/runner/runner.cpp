// The measured generation loop, its figures, and the experiment Runner.
#include "experiments/runner/runner.h"

#include <oneapi/dnnl/dnnl.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>

#include "baselines/registry.h"
#include "datasets/needle.h"
#include "datasets/score.h"
#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/process_memory.h"
#include "engine/decoder/generate.h"
#include "engine/decoder/host_estimate.h"
#include "engine/formats/formats.h"
#include "engine/runtime/bandwidth.h"
#include "engine/tokenizer/tokenizer.h"
#include "experiments/runner/result_row.h"

namespace hg {
namespace {

using Json = nlohmann::ordered_json;

// clock: modeled:calibrate measures the machine before each recorded run: each measurement's
// median pass over 0.2 s and 512 MiB buffers (about 5 s in all on 2 cores).
constexpr double kRunCalibrationSeconds = 0.2;
// Tokens of held-out text a strategy that calibrates on a prompt sees in accuracy runs (InfiniGen's
// authors calibrate their skew on 2048).
constexpr int32_t kCalibrationTokens = 2048;
constexpr int64_t kRunCalibrationBytes = int64_t(512) << 20;

// A scheduler's decisions over the steps, as runs of equal values per key (K, mode_pre).
using Trajectory = std::map<std::string, std::vector<std::pair<double, int>>>;
void add_trajectory(Trajectory& t, const std::map<std::string, double>& step) {
  for (const char* key : {"K", "mode_pre"})
    if (auto it = step.find(key); it != step.end()) {
      auto& runs = t[key];
      if (!runs.empty() && runs.back().first == it->second) ++runs.back().second;
      else runs.emplace_back(it->second, 1);
    }
}
// Which chat template a row's prompts went through, and why.
Json chat_template_json(const ChatTemplate& t) {
  Json j = {{"name", t.name}, {"source", t.source}};
  if (!t.system.empty()) j["system"] = t.system;
  return j;
}

// A scoring run's wall time and rates: items, and token rows forwarded (prompt rows prefilled and
// decode rows), the batched scorer's throughput.
Json scoring_figures(double wall, size_t items, const Scorer::Work& w) {
  const auto per_s = [&](double x) { return wall > 0 ? x / wall : 0.0; };
  return {{"time_s", wall},
          {"items_per_s", per_s(double(items))},
          {"scored_tokens", w.rows()},
          {"prefill_tokens", w.prefill_rows},
          {"decode_tokens", w.decode_rows},
          {"forwards", w.forwards},
          {"scored_tokens_per_s", per_s(double(w.rows()))}};
}

Json trajectory_json(const Trajectory& t) {
  Json tr = Json::object();
  for (auto& [k, runs] : t) {
    tr[k] = Json::array();
    for (auto& [v, steps] : runs) tr[k].push_back(Json::array({v, steps}));
  }
  return tr;
}

// A profile's rates in a row (a per-run calibration has no file to point to).
Json profile_json(const PlatformProfile& p) {
  Json by = Json::object();
  for (auto [d, r] : p.gpu_attn_flops_by_dim) by[std::to_string(d)] = r / 1e12;
  return {{"gpu", {{"flops_tflops", p.gpu_flops / 1e12}, {"attn_tflops", p.gpu_attn_flops / 1e12},
                   {"attn_tflops_by_head_dim", by}, {"mem_gbs", p.gpu_mem_gbs}, {"elem_gops", p.gpu_elem_eps / 1e9}}},
          {"cpu",
           {{"flops_gflops", p.cpu_flops / 1e9}, {"dram_gbs", p.dram_gbs}, {"dram_row_ns", p.dram_row_ns}, {"attn_gbs", p.cpu_attn_gbs}}},
          {"far", {{"gbs", p.far_gbs}, {"row_ns", p.far_row_ns}}},
          {"link", {{"h2d_gbs", p.h2d_gbs}, {"d2h_gbs", p.d2h_gbs}}},
          {"fixed", {{"stage_us", p.stage_us}, {"launch_us", p.launch_us}, {"copy_us", p.copy_us}}}};
}

std::string link_name(int s, int d) {
  return fmt::format("{}->{}", tier_name(Tier(s)), tier_name(Tier(d)));
}

std::string run_command(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

std::vector<int32_t> seeded_prompt(const Model& model, int n, std::mt19937_64& rng) {
  std::vector<int32_t> ids = {model.tokenizer->bos_id >= 0 ? model.tokenizer->bos_id : 0};
  while (int(ids.size()) < n) ids.push_back(int32_t(3 + rng() % uint64_t(std::max<int64_t>(1, model.hp.n_vocab - 3))));
  return ids;
}

void reserve_weights(Runtime& rt, const Model& model) {
  if (auto oom = rt.memory().ledger().reserve(Tier::kGpu, model.weight_bytes()))
    throw OutOfMemoryError("model weights: " + oom->message());
}

Measurement measure_generation(Runtime* rt, const Model& model, Backend& backend, KvStrategy& kv,
                               const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opts,
                               int warmup_steps, const std::function<void(int, int32_t)>& on_token) {
  Measurement m;
  if (rt) {
    rt->log().clear();
    rt->transfers().reset_totals();
    rt->memory().ledger().reset_peaks();
  }
  TransferTotals base;  // totals when the measured decode steps begin
  if (rt) rt->reset_device_counts();
  GenerateOptions o = opts;
  o.after_step = [&](int64_t step) {
    if (rt && step == 0) m.prefill_xfer = rt->transfers().totals();
    if (rt && step == warmup_steps) base = rt->transfers().totals();
    if (step > warmup_steps) m.step_stats.push_back(kv.step_stats());
    if (opts.after_step) opts.after_step(step);
  };
  m.gen = generate(model, backend, kv, prompts, o, on_token);
  for (size_t i = size_t(std::min<int64_t>(warmup_steps, int64_t(m.gen.step_s.size()))); i < m.gen.step_s.size(); ++i)
    m.step_s.push_back(m.gen.step_s[i]);
  if (rt) {
    rt->accel().synchronize();
    rt->copy().synchronize();
    rt->copy_out().synchronize();
    rt->cpu().synchronize();
    for (auto& r : rt->log().snapshot())
      if (r.step <= 0 || r.step > warmup_steps) m.log.push_back(std::move(r));
    const TransferTotals all = rt->transfers().totals();
    for (int s = 0; s < kNumTiers; ++s)
      for (int d = 0; d < kNumTiers; ++d) {
        m.decode_xfer.bytes[size_t(s)][size_t(d)] = all.bytes[size_t(s)][size_t(d)] - base.bytes[size_t(s)][size_t(d)];
        m.decode_xfer.count[size_t(s)][size_t(d)] = all.count[size_t(s)][size_t(d)] - base.count[size_t(s)][size_t(d)];
      }
    // Each step's calls, the prefetches it queued included, once every queue is done.
    m.prefill_device = rt->device_counts_of_step(0);
    for (int64_t s = warmup_steps + 1; s <= int64_t(m.gen.step_s.size()); ++s)
      m.step_device.push_back(rt->device_counts_of_step(s));
    for (int t = 0; t < kNumTiers; ++t) m.tiers[size_t(t)] = rt->memory().ledger().usage(Tier(t));
    m.gpu_kv = rt->memory().kv_usage();
  }
  return m;
}

nlohmann::ordered_json device_counts_json(const DeviceCounts& c, double per) {
  nlohmann::ordered_json j;
  for (const auto& f : DeviceCounts::fields()) {
    const int64_t x = c.*f.member;
    j[f.name] = per == 1 ? nlohmann::ordered_json(x) : nlohmann::ordered_json(double(x) / per);
  }
  return j;
}

std::string device_counts_line(const DeviceCounts& c) {
  return fmt::format("launches={} syncs={} waits={} h2d={}/{}B d2h={}/{}B d2d={} host_policy={}", c.launches, c.syncs,
                     c.waits, c.copies_h2d, c.bytes_h2d, c.copies_d2h, c.bytes_d2h, c.copies_d2d, c.host_policy_elems);
}

int64_t prefill_rows_of(const Point& p) {
  return std::min<int64_t>(INT32_MAX, std::max<int64_t>(1, int64_t(p.prompt_tokens) * p.batch));
}

HostEstimate point_host_estimate(const HParams& hp, const Point& p, bool dry) {
  // A needle answer is at most 40 tokens; 64 counted.
  if (p.needle_tokens > 0)
    return generation_host_estimate(hp, p.needle_tokens, 64, 1, p.needle_tokens, false);
  return generation_host_estimate(hp, p.prompt_tokens, p.decode_tokens, p.batch, prefill_rows_of(p), dry);
}

int64_t share_kv_bytes(const Model& model, const Point& p) {
  const auto& hp = model.hp;
  const double whole = 2.0 * 2.0 * double(hp.n_layers) * double(hp.n_kv_heads) * double(hp.head_dim) *
                       double(p.batch) * double(int64_t(p.prompt_tokens) + p.decode_tokens);
  return int64_t(std::llround(p.gpu_kv_share * whole));
}

Figures figures(const Measurement& m, const PlatformProfile* profile) {
  Figures f;
  f.prefill_s = m.gen.prefill_s;
  for (double s : m.step_s) f.decode_s += s;
  f.prefill_tokens = m.gen.prefill_tokens;
  f.decode_steps = int64_t(m.step_s.size());
  f.decode_tokens = m.gen.step_s.empty() ? 0 : m.gen.decode_tokens * f.decode_steps / int64_t(m.gen.step_s.size());
  f.decode_token_s = median(m.step_s);
  if (!m.step_s.empty()) {
    f.decode_token_min_s = *std::min_element(m.step_s.begin(), m.step_s.end());
    f.decode_token_max_s = *std::max_element(m.step_s.begin(), m.step_s.end());
  }
  f.end_to_end_s = f.prefill_s + f.decode_s;
  f.pipeline = pipeline_summary(m.log);
  std::map<int64_t, std::vector<StageRecord>> by_step;
  for (auto& r : m.log)
    if (r.step >= 0) by_step[r.step].push_back(r);
  const double steps = double(std::max<int64_t>(1, f.decode_steps));
  for (auto& [st, recs] : by_step) {
    if (st < 1) continue;
    for (auto& r : recs) {
      f.flops_per_step[size_t(r.kind)] += r.work.flops / steps;
      for (int t = 0; t < kNumTiers; ++t) f.bytes_per_step[size_t(r.kind)][size_t(t)] += double(r.work.bytes[size_t(t)]) / steps;
    }
  }
  for (int s = 0; s < kNumTiers; ++s)
    for (int d = 0; d < kNumTiers; ++d) {
      f.link_bytes_per_step[size_t(s)][size_t(d)] = double(m.decode_xfer.bytes[size_t(s)][size_t(d)]) / steps;
      f.link_bytes_prefill[size_t(s)][size_t(d)] = double(m.prefill_xfer.bytes[size_t(s)][size_t(d)]);
    }
  if (profile) {
    f.modeled = true;
    f.platform = profile->name;
    std::vector<double> dec;
    for (auto& [st, recs] : by_step) {
      const StepTiming t = modeled_timing(recs, *profile);
      if (st == 0) {
        f.m_prefill_s += t.critical_path_s;
        continue;
      }
      dec.push_back(t.critical_path_s);
      f.m_accel_s += t.accel_s / steps;
      f.m_cpu_s += t.cpu_s / steps;
      f.m_transfer_s += t.transfer_s / steps;
      f.m_critical_s += t.critical_path_s / steps;
      f.m_serial_s += t.sum_stages_s / steps;
    }
    f.m_decode_token_s = median(dec);
    const auto replay = [&](const PlatformProfile& q) {
      Figures::Replay out;
      std::vector<double> d;
      for (auto& [st, recs] : by_step) {
        const double cp = modeled_timing(recs, q).critical_path_s;
        if (st == 0)
          out.prefill_s += cp;
        else
          d.push_back(cp);
      }
      out.decode_token_s = median(d);
      std::sort(d.begin(), d.end());  // summed in one order, so the figure repeats to the digit
      out.end_to_end_s = out.prefill_s;
      for (double x : d) out.end_to_end_s += x;
      return out;
    };
    f.m_peak = replay(peak_profile(*profile));
    f.m_achieved = replay(achieved_profile(*profile));
    for (auto& r : m.log) {
      if (r.step < 0) continue;
      auto& ss = f.stage_sums[fmt::format("{}/{}", r.step == 0 ? "prefill" : "decode", r.name)];
      ss.count += 1;
      ss.measured_s += r.end_s - r.start_s;
      ss.modeled_s += modeled_stage_seconds(r, *profile);
    }
    double sum = 0;
    for (double d : dec) sum += d;
    f.m_end_to_end_s = f.m_prefill_s + sum;
  }
  {
    // The measured steps are the last step_s.size() of the generation's.
    const size_t n = m.gen.attended.size(), first = n - std::min(n, m.step_s.size());
    double ctx = 0, rows = 0;
    for (size_t i = first; i < n; ++i) {
      const auto& a = m.gen.attended[i];
      f.attended_accel += double(a.accel), f.attended_cpu += double(a.cpu), ctx += double(a.context);
      rows += 1;
    }
    if (ctx > 0) f.attended_fraction = (f.attended_accel + f.attended_cpu) / ctx;
    const double per_row = rows * double(std::max<size_t>(1, m.gen.tokens.size()));
    if (rows > 0) f.attended_accel /= per_row, f.attended_cpu /= per_row;
  }
  if (!m.step_stats.empty()) {
    f.stats_last = m.step_stats.back();
    std::map<std::string, int> n;
    for (auto& s : m.step_stats)
      for (auto& [k, v] : s) f.stats_mean[k] += v, n[k]++;
    for (auto& [k, v] : f.stats_mean) v /= n[k];
    for (auto& st : m.step_stats) add_trajectory(f.trajectory, st);
  }
  return f;
}

// The model's weights as loaded: their bytes, the load's wall time, and this process's resident
// memory after it (0 in dry runs' phantom weights, which map nothing).
Json weights_record(const Model& m) {
  const ProcessMemory mem = process_memory();
  return {{"bytes", m.weight_bytes()},
          {"load_s", m.load_seconds},
          {"mapped_bytes", m.mapped_weight_bytes},
          {"unlocked_bytes", m.unlocked_weight_bytes},
          {"process_resident_bytes", mem.resident_bytes},
          {"process_peak_resident_bytes", mem.peak_resident_bytes}};
}

// Now, as ISO 8601 UTC to the second.
std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

// A file's identity for provenance: its absolute path, size and an FNV-1a 64 fingerprint of its
// size, first and last MiB (cheap for multi-GB weights; it tells files apart, it is no checksum).
// A directory (a Hugging Face model) folds in each regular file it holds, by name, in name order;
// its size is theirs together.
Json file_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  uint64_t h = 0xcbf29ce484222325ull;
  const auto fold = [&h](const std::string& bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  };
  const auto fold_file = [&](const fs::path& f, uintmax_t size) {
    std::ifstream in(f, std::ios::binary);
    constexpr size_t kMiB = size_t(1) << 20;
    std::string head(std::min<size_t>(kMiB, size), '\0'), tail(std::min<size_t>(kMiB, size), '\0');
    in.read(head.data(), std::streamsize(head.size()));
    in.seekg(std::streamoff(size - tail.size()));
    in.read(tail.data(), std::streamsize(tail.size()));
    fold(std::to_string(size) + head + tail);
  };
  uintmax_t size = 0;
  if (fs::is_directory(abs, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(abs, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const auto n = fs::file_size(f, ec);
      if (ec) continue;
      fold(f.filename().string() + '\0');
      fold_file(f, n);
      size += n;
    }
    if (files.empty()) return {{"path", abs.string()}, {"exists", false}};
  } else {
    size = fs::file_size(abs, ec);
    if (ec) return {{"path", abs.string()}, {"exists", false}};
    fold_file(abs, size);
  }
  return {{"path", abs.string()}, {"bytes", size}, {"fnv1a64_size_head_tail", fmt::format("{:016x}", h)}};
}

// provenance() plus what this run read: the model file (synthetic models by their spec), the
// platform profile, and when the row finished.
Json run_provenance(const Point& p) {
  static std::map<std::string, Json> seen;  // one fingerprint per file and process
  auto fp = [](const std::string& path) {
    auto it = seen.find(path);
    if (it == seen.end()) it = seen.emplace(path, file_fingerprint(path)).first;
    return it->second;
  };
  Json j = provenance();
  Json in;
  in["model"] = p.model.rfind("synthetic:", 0) == 0 ? Json({{"spec", p.model}}) : fp(p.model);
  if (calibrates_each_run(p.platform))
    in["platform_profile"] = {{"calibrated_before_run", true}};  // its rates: figures.modeled.profile
  else if (!p.platform.empty())
    in["platform_profile"] = fp(platform_file(p.platform, std::string(HG_SOURCE_DIR) + "/experiments/platforms"));
  j["inputs"] = in;
  j["finished_utc"] = utc_now();
  return j;
}

Json provenance() {
  static const Json p = [] {
    Json j;
    const std::string src = HG_SOURCE_DIR;
    const std::string commit = run_command("git -C '" + src + "' rev-parse HEAD 2>/dev/null");
    j["commit"] = commit.empty() ? "unknown" : commit;
    j["dirty"] = commit.empty() ? Json() : Json(!run_command("git -C '" + src + "' status --porcelain --untracked-files=no 2>/dev/null").empty());
    j["version"] = HG_VERSION;
    j["build_type"] = HG_BUILD_TYPE;
    j["compiler"] = "g++ " __VERSION__;
    if (utsname u{}; uname(&u) == 0) j["os"] = fmt::format("{} {} {}", u.sysname, u.release, u.machine);
    if (std::ifstream os("/etc/os-release"); os)
      for (std::string line; std::getline(os, line);)
        if (line.rfind("PRETTY_NAME=", 0) == 0) j["distribution"] = line.substr(13, line.size() > 14 ? line.size() - 14 : 0);
    const dnnl_version_t* dv = dnnl_version();
    j["libraries"] = {{"onednn", fmt::format("{}.{}.{}", dv->major, dv->minor, dv->patch)},
                      {"fmt", fmt::format("{}.{}.{}", FMT_VERSION / 10000, FMT_VERSION / 100 % 100, FMT_VERSION % 100)},
                      {"nlohmann_json", fmt::format("{}.{}.{}", NLOHMANN_JSON_VERSION_MAJOR, NLOHMANN_JSON_VERSION_MINOR,
                                                    NLOHMANN_JSON_VERSION_PATCH)}};
    // The command line of this process, as typed (--set overrides included).
    if (std::ifstream cl("/proc/self/cmdline", std::ios::binary); cl) {
      std::string all((std::istreambuf_iterator<char>(cl)), {}), arg;
      Json argv = Json::array();
      for (char c : all)
        if (c == '\0') argv.push_back(arg), arg.clear();
        else arg += c;
      j["command_line"] = argv;
    }
    j["cpu"] = cpu_model();
    j["cpu_kernels"] = std::string(cpu_isa_name(active_cpu_isa()));
    j["cpu_tuning"] = std::string(cpu_tuning_name(cpu_tuning()));
    j["host_threads"] = std::thread::hardware_concurrency();
    const int gpus = cuda_device_count_or_zero();
    j["gpu"] = gpus > 0 ? Json(make_backend("cuda")->device_name()) : Json();
    j["cuda_compiled"] = cuda_compiled();
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) j["host"] = host;
    // Under Slurm: the job, the array job and task, the node and cluster of this run.
    if (const char* job = std::getenv("SLURM_JOB_ID")) {
      Json s;
      s["job_id"] = job;
      for (auto [key, env] : {std::pair{"array_job_id", "SLURM_ARRAY_JOB_ID"}, std::pair{"array_task_id", "SLURM_ARRAY_TASK_ID"},
                              std::pair{"node", "SLURMD_NODENAME"}, std::pair{"cluster", "SLURM_CLUSTER_NAME"},
                              std::pair{"partition", "SLURM_JOB_PARTITION"}})
        if (const char* v = std::getenv(env)) s[key] = v;
      j["slurm"] = s;
    }
    return j;
  }();
  return p;
}

namespace {
// The keys every row starts with: which experiment, point, strategy and repeat, and its status.
Json row_head(const ExperimentSpec& spec, const Point& p, const StrategyEntry& e, int repeat, bool ok) {
  return ResultRow::head(spec.name, p.id, p.index, e.label, e.name, repeat, ok);
}

// The start of an ok accuracy row (multiple-choice and retrieval alike): head, point, parameters.
Json accuracy_row(const ExperimentSpec& spec, const Point& p, const StrategyEntry& e, int repeat,
                  const StrategyParams& effective) {
  Json r = row_head(spec, p, e, repeat, true);
  r["execute"] = spec.execute;
  r["time_basis"] = "measured";
  r["point"] = p.values;
  Json par;
  for (auto& [k, v] : effective.all()) par[k] = v;
  r["params"] = par;
  return r;
}

// An item's per-choice, per-position log-softmax as the reference keeps it.
std::vector<std::vector<RefDist>> compact_dists(const std::vector<std::vector<std::vector<float>>>& lp) {
  std::vector<std::vector<RefDist>> d;
  for (auto& choice : lp) {
    d.emplace_back();
    for (auto& pos : choice) d.back().push_back(compact_dist(pos));
  }
  return d;
}
}  // namespace

namespace {
// The weights live on the accelerator: a gpu tier too small for them is a result.
// A device backend uploads weights on first use: one token through `full` before the clock starts
// puts every weight (and the libraries' state) on the device, so that no strategy's prefill pays
// the model's load (the paper's end-to-end latency excludes it).
void warm_device(Runtime& rt, const Model& model) {
  auto kv = make_strategy("full", StrategyContext{rt.accel_backend(), &rt, &model}, {});
  GenerateOptions go;
  go.runtime = &rt;
  go.n_new = 1;
  go.stop_at_eos = false;
  go.sampler.greedy = true;
  generate(model, rt.accel_backend(), *kv, {{model.tokenizer->bos_id >= 0 ? model.tokenizer->bos_id : 0}}, go);
}

// The entry's parameters with the point's swept `strategy.param` values over them.
std::map<std::string, std::string> point_params(const Point& p, const StrategyEntry& entry) {
  std::map<std::string, std::string> params = entry.params;
  if (auto it = p.strategy_params.find(entry.name); it != p.strategy_params.end())
    for (auto& [k, v] : it->second) params[k] = v;
  return params;
}
}  // namespace

Json failed_row(const ExperimentSpec& spec, const Point& p, const StrategyEntry& e, int repeat,
                const std::string& error_class, const std::string& reason) {
  Json r = row_head(spec, p, e, repeat, false);
  r["error"] = error_class;
  r["reason"] = reason;
  r["execute"] = spec.execute;
  r["point"] = p.values;
  r["provenance"] = run_provenance(p);
  return r;
}

Runner::Runner(const ExperimentSpec& spec) : spec_(spec) {}
Runner::~Runner() = default;

const Model& Runner::model_for(const std::string& spec) {
  const bool dry = spec_.execute == "dry";
  const std::string key = spec + (dry ? "#dry" : "");
  if (!model_ || key != model_key_) {
    model_.reset();
    LoadOptions lo;
    lo.phantom_weights = dry;
    model_ = std::make_unique<Model>(load_model(spec, lo));
    model_key_ = key;
  }
  return *model_;
}

const PlatformProfile& Runner::profile(const std::string& name) {
  auto it = profiles_.find(name);
  if (it == profiles_.end())
    it = profiles_.emplace(name, load_platform(name, std::string(HG_SOURCE_DIR) + "/experiments/platforms")).first;
  return it->second;
}

DeviceCosts Runner::device_costs() {
  return spec_.device_costs == "off" ? DeviceCosts{} : device_costs_of(profile(spec_.device_costs));
}

Json Runner::run_eval_once(const Point& p, const StrategyEntry& entry, int repeat) {
  const EvalSpec& ev = spec_.eval;
  auto t_it = tasks_.find(p.task);
  if (t_it == tasks_.end()) t_it = tasks_.emplace(p.task, load_task(p.task, resolve_data_dir(ev.data_dir))).first;
  const std::vector<Request> reqs = build_requests(t_it->second, p.shots, p.limit, ev.fewshot_seed, ev.lm_eval);
  RuntimeConfig rc;
  rc.device = spec_.device;
  rc.device_costs = device_costs();
  rc.stage_clock = profile(kSteeringPlatform);
  Runtime rt(rc);
  const Model& model = model_for(p.model);
  reserve_weights(rt, model);
  const std::map<std::string, std::string> params = point_params(p, entry);
  const StrategyParams effective(entry.name, strategy_info(entry.name).params, params);
  const StrategyContext sc{rt.accel_backend(), &rt, &model};
  auto kv = make_strategy(entry.name, sc, params);
  const ContextMode mode = parse_context_mode(p.context, spec_.file);
  const bool add_bos = ev.lm_eval.bos == BosRule::kAlways || (ev.lm_eval.bos == BosRule::kTokenizer && model.tokenizer->add_bos);
  Scorer scorer(model, rt.accel_backend(), *kv, &rt, mode, add_bos);
  const ChatTemplate chat = resolve_chat_template(*model.tokenizer, ev.chat_template, p.model);
  scorer.set_chat_template(chat);
  // A strategy that calibrates on a prompt (InfiniGen's skew) sees held-out text of the task, the
  // same whatever items and limit are scored: its few-shot split in file order, as many tokens as
  // its authors calibrate on (2048) or the model's positions allow.
  Json calibration = nullptr;
  if (kv->needs_prompt_attention()) {
    const int32_t n = std::min<int32_t>(kCalibrationTokens, model.hp.max_pos - 1);
    std::vector<int32_t> toks;
    if (add_bos && model.tokenizer->bos_id >= 0) toks.push_back(model.tokenizer->bos_id);
    const std::vector<int32_t> body = model.tokenizer->encode(calibration_text(t_it->second, size_t(n) * 16));
    toks.insert(toks.end(), body.begin(), body.begin() + std::min<int64_t>(int64_t(body.size()), n - int64_t(toks.size())));
    if (toks.empty()) input_error("{}: {} has no few-shot documents to calibrate {} on", p.task, t_it->second.fewshot_file, entry.label);
    const uint64_t h = fnv1a(std::string(reinterpret_cast<const char*>(toks.data()), toks.size() * sizeof(int32_t)));
    calibration = {{"source", fmt::format("{} few-shot split ({}), documents in file order",
                                          p.task, std::filesystem::path(t_it->second.fewshot_file).filename().string())},
                   {"tokens", toks.size()},
                   {"fnv1a64", fmt::format("{:016x}", h)}};
    scorer.set_calibration(std::move(toks));
  }
  // The reference: scored once per key below and reused by every strategy (its time is not in
  // theirs); the reference strategy itself, at its defaults, is the reference when it runs first.
  const bool is_ref = entry.name == ev.reference && params.empty();
  const bool with_ref = ev.reference != "none" && !is_ref;
  const std::string ref_key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", p.model, p.task, p.shots, p.limit,
                                          ev.fewshot_seed, p.context, ev.lm_eval.version, ev.lm_eval.copa_double_space,
                                          add_bos, ev.reference, spec_.device) +
                              (chat.applied() ? "|" + chat.name + "|" + chat.system : "");
  const bool keep_ref = is_ref && ev.reference != "none" && !references_.count(ref_key);
  std::shared_ptr<const ReferenceScores> ref;
  bool ref_reused = true;
  // Kept in the result directory by the run that scored it, so that a resumed run compares with it.
  const std::string ref_file =
      reference_dir.empty() ? "" : fmt::format("{}/{:016x}.bin", reference_dir, fnv1a(ref_key));
  if (with_ref && !ref_file.empty() && !references_.count(ref_key))
    if (auto saved = load_reference(ref_file, ref_key))
      references_.emplace(ref_key, std::make_shared<ReferenceScores>(std::move(*saved)));
  auto save = [&](const ReferenceScores& r) {
    if (ref_file.empty()) return;
    std::filesystem::create_directories(reference_dir);
    save_reference(r, ref_key, ref_file);
  };
  if (with_ref) {
    auto it = references_.find(ref_key);
    if (it == references_.end()) {
      ref_reused = false;
      auto made = std::make_shared<ReferenceScores>();
      Runtime ref_rt(rc);
      reserve_weights(ref_rt, model);
      auto ref_kv = make_strategy(ev.reference, StrategyContext{ref_rt.accel_backend(), &ref_rt, &model}, {});
      Scorer ref_scorer(model, ref_rt.accel_backend(), *ref_kv, &ref_rt, mode, add_bos);
      ref_scorer.set_chat_template(chat);
      const auto r0 = std::chrono::steady_clock::now();
      made->items.resize(reqs.size());
      made->dists.resize(reqs.size());
      ref_scorer.score_all(reqs, true, [&](size_t i, ItemScore& s, ChoiceLogprobs& lp) {
        made->items[i] = std::move(s);
        made->dists[i] = compact_dists(lp);
      });
      made->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
      save(*made);
      it = references_.emplace(ref_key, std::move(made)).first;
    }
    ref = it->second;
  }
  std::shared_ptr<ReferenceScores> kept;
  if (keep_ref) kept = std::make_shared<ReferenceScores>();
  std::unique_ptr<std::ofstream> items;
  std::string items_rel;
  if (!items_dir.empty()) {
    std::filesystem::create_directories(items_dir);
    items_rel = fmt::format("items/{}.{}.r{}.jsonl", p.id, entry.label, repeat);
    items = std::make_unique<std::ofstream>(items_dir + "/" + fmt::format("{}.{}.r{}.jsonl", p.id, entry.label, repeat));
    if (!*items) input_error("{}: cannot write the per-item records", items_dir);
  }
  std::vector<ItemScore> scores(reqs.size());
  std::vector<std::vector<std::vector<RefDist>>> kept_dists;
  if (kept) kept_dists.resize(reqs.size());
  FidelityAccumulator fid;
  std::map<std::string, double> stats_sum;
  // The scheduler's K and mode at every step, as runs of equal values (a timing row's format).
  Trajectory trajectory;
  scorer.on_step([&] { add_trajectory(trajectory, kv->step_stats()); });
  int64_t ctx_tokens = 0;
  int truncated_items = 0, scored = 0;
  const auto t0 = std::chrono::steady_clock::now();
  scorer.on_batch([&](int n) {
    for (auto& [k, v] : kv->step_stats()) stats_sum[k] += v * n;  // the batch's last step, per item
    scored += n;
    if (on_items) on_items(scored, int(reqs.size()));
  });
  scorer.score_all(reqs, with_ref || kept, [&](size_t i, ItemScore& s, ChoiceLogprobs& lp) {
    ctx_tokens += s.context_tokens;
    truncated_items += s.truncated > 0;
    if (with_ref) fid.add(ref->items[i], s, ref->dists[i], lp);
    if (kept) kept_dists[i] = compact_dists(lp);
    scores[i] = std::move(s);
  });
  // Per-item records in request order.
  for (size_t i = 0; i < reqs.size() && items; ++i) {
    Json rec = scores[i].json();
    if (with_ref) {
      rec["ref_pred"] = ref->items[i].pred;
      rec["ref_ll"] = ref->items[i].ll;
    }
    *items << json_text(rec) << "\n";
  }
  if (kept) {
    kept->items = scores;
    kept->dists = std::move(kept_dists);
  }
  if (items && !items->flush()) input_error("{}: write failed", items_dir);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (kept) {
    kept->seconds = wall;
    save(*kept);
    references_.emplace(ref_key, std::move(kept));
  }
  const TaskMetrics m = task_metrics(scores, reqs);
  if (truncated_items > 0) {  // once per model and task: every strategy truncates the same items
    static std::set<std::string> warned;
    if (warned.insert(p.model + "|" + p.task).second)
      fmt::print(stderr, "hgbench: warning: {} of {} {} items left-truncated to the model's {} positions (as lm-eval "
                 "does; rows count them in accuracy.truncated_items)\n", truncated_items, scores.size(), p.task,
                 model.hp.max_pos);
  }

  Json r = accuracy_row(spec_, p, entry, repeat, effective);
  // What steered the strategy's own timing decisions: a profile's modeled stage times.
  r["steering_clock"] = "modeled:" + rc.stage_clock->name;
  Json acc = m.json();
  acc["task"] = p.task;
  acc["shots"] = p.shots;
  acc["context"] = p.context;
  acc["add_bos"] = add_bos;
  acc["lm_eval"] = {{"version", ev.lm_eval.version},
                    {"copa_spacing", ev.lm_eval.copa_double_space ? "double" : "single"},
                    {"bos", bos_rule_name(ev.lm_eval.bos)}};
  acc["truncated_items"] = truncated_items;
  acc["max_length"] = model.hp.max_pos;
  acc["fewshot_seed"] = ev.fewshot_seed;
  acc["mean_context_tokens"] = scores.empty() ? 0.0 : double(ctx_tokens) / double(scores.size());
  acc["chat_template"] = chat_template_json(chat);
  if (!calibration.is_null()) acc["calibration"] = calibration;
  const double attended = scorer.attended_fraction();
  acc["attended_fraction"] = std::isfinite(attended) ? Json(attended) : Json(nullptr);
  // A budget that compresses nothing these items reach: the row equals full attention by design.
  if (strategy_info(entry.name).budgeted && attended >= 0.999) {
    static std::set<std::string> warned_budget;
    if (warned_budget.insert(entry.label + "|" + p.task + "|" + p.id).second)
      fmt::print(stderr, "hgbench: warning: {} attended {:.1f}% of the context on {}'s scored steps: its budget does not "
                 "compress these prompts (accuracy.attended_fraction)\n", entry.label, 100 * attended, p.task);
  }
  r["accuracy"] = acc;
  if (with_ref) {
    Json f = fid.result().json();
    f["reference"] = ev.reference;
    // Scored once for this key (by this row or an earlier one); not part of this row's time.
    f["reference_scored_s"] = ref->seconds;
    f["reference_reused"] = ref_reused;
    if (!ref_file.empty()) f["reference_file"] = "references/" + std::filesystem::path(ref_file).filename().string();
    f["kl_over"] = model.hp.n_vocab <= kRefFullVocab ? "vocabulary"
                                                      : fmt::format("reference top {} + rest lumped", kRefTopK);
    r["fidelity"] = f;
    // Accuracy against the reference's on the same items, paired.
    std::vector<int> mine(scores.size()), theirs(scores.size());
    for (size_t i = 0; i < scores.size(); ++i)
      mine[i] = scores[i].pred == scores[i].gold, theirs[i] = ref->items[i].pred == ref->items[i].gold;
    Json pc = paired_compare(mine, theirs).json();
    pc["reference"] = ev.reference;
    r["paired"] = pc;
  } else {
    r["fidelity"] = nullptr;
  }
  if (!items_rel.empty()) r["items_file"] = items_rel;
  // The strategy's scoring wall time (the reference's is not in it).
  r["figures"] = scoring_figures(wall, scores.size(), scorer.work());
  Json st = Json::object();
  for (auto& [k, v] : stats_sum) st[k] = scores.empty() ? 0.0 : v / double(scores.size());
  r["strategy_stats"] = {{"mean_last_step", st}};
  if (!trajectory.empty()) r["strategy_stats"]["trajectory"] = trajectory_json(trajectory);
  r["runtime"] = {{"device", rt.device_description()}};
  r["weights"] = weights_record(model);
  r["provenance"] = run_provenance(p);
  return r;
}

// Long-context retrieval: each item's prompt is prefilled and the answer decoded greedily through
// the strategy; the row's acc is the mean match (RULER's string_match_all), its fidelity the share
// of items whose output equals the reference's token for token.
Json Runner::run_needle_once(const Point& p, const StrategyEntry& entry, int repeat) {
  const EvalSpec& ev = spec_.eval;
  const Model& model = model_for(p.model);
  const Tokenizer& tok = *model.tokenizer;
  const int n = p.limit > 0 ? p.limit : kNeedleItemsDefault;
  require_host_memory(point_host_estimate(model.hp, p, false),
                      "this point");  // before the haystacks are built
  std::vector<NeedleItem> items;
  std::vector<std::vector<int32_t>> prompts, questions;  // questions: fed as decode steps (query-agnostic)
  const bool agnostic = ev.protocol == "query_agnostic";
  const ChatTemplate chat = resolve_chat_template(tok, ev.chat_template, p.model);
  const Haystack* essay = nullptr;
  if (needle_task_needs_essay(p.task)) {
    if (!essay_) essay_ = load_haystack(resolve_data_dir(ev.data_dir), ev.haystack);
    essay = &*essay_;
  }
  const QaCorpus* qa = nullptr;
  if (needle_task_is_qa(p.task)) {
    auto it = qa_.find(p.task);
    if (it == qa_.end()) it = qa_.emplace(p.task, load_qa_corpus(p.task, p.task == "qa_1" ? ev.squad : ev.hotpotqa)).first;
    qa = &it->second;
  }
  for (int i = 0; i < n; ++i) {
    items.push_back(make_needle_item(p.task, tok, p.needle_tokens, std::max(0, p.depth), ev.fewshot_seed, i, essay, qa));
    const NeedleItem& it = items.back();
    if (chat.applied() && agnostic) {  // the context in the user's turn; its question, the turn's end and
                                       // the assistant's header fed as decode steps
      ChatPrompt cp = encode_chat(tok, chat, it.context());
      cp.head.insert(cp.head.end(), cp.user.begin(), cp.user.end());
      prompts.push_back(std::move(cp.head));
      std::vector<int32_t> q = tok.encode(it.question);
      q.insert(q.end(), cp.tail.begin(), cp.tail.end());
      const std::vector<int32_t> after = tok.encode(cp.tail_text);
      q.insert(q.end(), after.begin(), after.end());
      questions.push_back(std::move(q));
    } else {
      prompts.push_back(encode_chat_prompt(tok, chat, agnostic ? it.context() : it.prompt));
      questions.push_back(agnostic ? tok.encode(it.question) : std::vector<int32_t>{});
    }
    // Beyond the positions a model was trained at its outputs mean nothing (learned positions have
    // no row for them at all).
    const size_t prompt_tokens = prompts.back().size() + questions.back().size();
    if (int(prompt_tokens) + it.max_new > model.hp.max_pos)
      input_error("{}: {} prompt tokens and {} to generate exceed {}'s {} positions", p.task, prompt_tokens, it.max_new,
                  p.model, model.hp.max_pos);
  }
  RuntimeConfig rc;
  rc.device = spec_.device;
  rc.device_costs = device_costs();
  rc.stage_clock = profile(kSteeringPlatform);
  // Greedy outputs of `name` (with `params`) on every item, on a fresh runtime.
  auto outputs_of = [&](const std::string& name, const std::map<std::string, std::string>& params, double* seconds,
                        std::map<std::string, double>* stats, Scorer::Work* work) {
    Runtime rt(rc);
    reserve_weights(rt, model);
    auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &model}, params);
    GenerateOptions go;
    go.runtime = &rt;
    go.sampler.greedy = true;
    go.stop_at_eos = true;
    std::vector<std::vector<int32_t>> out;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < items.size(); ++i) {
      go.n_new = items[i].max_new;
      go.forced.clear();
      if (agnostic) go.forced.push_back(questions[i]);
      out.push_back(generate(model, rt.accel_backend(), *kv, {prompts[i]}, go).tokens.at(0));
      if (work) {  // the prompt prefilled; the forced tokens and every generated one but the last decoded
        const int64_t decoded = int64_t(questions[i].size()) + std::max<int64_t>(0, int64_t(out.back().size()) - 1);
        work->prefill_rows += int64_t(prompts[i].size());
        work->decode_rows += decoded;
        work->forwards += 1 + decoded;
      }
      if (stats)
        for (auto& [k, v] : kv->step_stats()) (*stats)[k] += v / double(items.size());
      if (on_items) on_items(int(i + 1), int(items.size()));
    }
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  const std::map<std::string, std::string> params = point_params(p, entry);
  const StrategyParams effective(entry.name, strategy_info(entry.name).params, params);
  double wall = 0;
  std::map<std::string, double> stats;
  Scorer::Work work;
  const std::vector<std::vector<int32_t>> got = outputs_of(entry.name, params, &wall, &stats, &work);
  const bool is_ref = entry.name == ev.reference && params.empty();
  const std::string ref_key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}", p.model, p.task, p.needle_tokens, p.depth, n,
                                          ev.fewshot_seed, ev.reference, spec_.device, ev.protocol) +
                              (chat.applied() ? "|" + chat.name + "|" + chat.system : "");
  if (is_ref) needle_refs_.emplace(ref_key, got);
  const bool with_ref = ev.reference != "none" && !is_ref;
  bool ref_reused = true;
  double ref_s = 0;
  if (with_ref && !needle_refs_.count(ref_key)) {
    ref_reused = false;
    needle_refs_.emplace(ref_key, outputs_of(ev.reference, {}, &ref_s, nullptr, nullptr));
  }
  std::vector<double> match;
  int agree = 0;
  std::ofstream items_out;
  std::string items_rel;
  if (!items_dir.empty()) {
    std::filesystem::create_directories(items_dir);
    items_rel = fmt::format("items/{}.{}.r{}.jsonl", p.id, entry.label, repeat);
    items_out.open(items_dir + "/" + fmt::format("{}.{}.r{}.jsonl", p.id, entry.label, repeat));
    if (!items_out) input_error("{}: cannot write the per-item records", items_dir);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string text = tok.decode(got[i]);
    match.push_back(needle_match(items[i], text));
    Json rec = {{"index", int(i)}, {"tokens", items[i].tokens}, {"depth", items[i].depth},
                {"answers", items[i].answers}, {"output", text}, {"match", match.back()}};
    if (with_ref) {
      const auto& ref = needle_refs_.at(ref_key)[i];
      agree += ref == got[i];
      rec["ref_output"] = tok.decode(ref);
    }
    if (items_out.is_open()) items_out << json_text(rec) << "\n";
  }
  if (items_out.is_open() && !items_out.flush()) input_error("{}: write failed", items_dir);
  double mean = 0, tokens = 0;
  for (double m : match) mean += m / double(match.size());
  for (auto& it : items) tokens += double(it.tokens) / double(items.size());

  Json r = accuracy_row(spec_, p, entry, repeat, effective);
  // What steered the strategy's own timing decisions: a profile's modeled stage times.
  r["steering_clock"] = "modeled:" + rc.stage_clock->name;
  Json acc = {{"n", n}, {"acc", mean}, {"acc_stderr", mean_stderr(match)},
              {"metric", qa ? "string_match_part" : "string_match_all"},
              {"task", p.task}, {"needle_tokens", p.needle_tokens}, {"depth", p.depth},
              {"mean_context_tokens", tokens}, {"fewshot_seed", ev.fewshot_seed}, {"protocol", ev.protocol},
              {"chat_template", chat_template_json(chat)}};
  if (p.depth < 0) acc.erase("depth");  // a task without a needle
  if (essay) acc["haystack"] = essay->source;
  if (qa) acc["documents"] = qa->source;
  r["accuracy"] = acc;
  if (with_ref) {
    r["fidelity"] = {{"items", n},
                     {"agreement", double(agree) / double(n)},
                     {"agreement_is", "greedy output identical to the reference's"},
                     {"reference", ev.reference},
                     {"reference_scored_s", ref_s},
                     {"reference_reused", ref_reused}};
  } else {
    r["fidelity"] = nullptr;
  }
  if (!items_rel.empty()) r["items_file"] = items_rel;
  r["figures"] = scoring_figures(wall, size_t(n), work);
  Json st = Json::object();
  for (auto& [k, v] : stats) st[k] = v;
  r["strategy_stats"] = {{"mean_last_step", st}};
  r["weights"] = weights_record(model);
  r["provenance"] = run_provenance(p);
  return r;
}

namespace {
// Why a budgeted strategy's attended fraction is not its `budget` (more than 0.02 of the context
// off); "" when it is, or when the strategy has no budget.
std::string budget_note(const StrategyParams& params, const Figures& f) {
  const double b = params.all().count("budget") ? params.get_float("budget") : 0, a = f.attended_fraction;
  if (!(b > 0 && b < 1 && a > 0) || std::abs(a - b) <= 0.02) return "";
  const std::string head =
      fmt::format("attends {:.3f}, {} its budget {:g}: ", a, a < b ? "under" : "over", b);
  if (a < b) return head + "fewer tokens were selectable than the budget allows";
  const double seen = f.attended_accel + f.attended_cpu;
  const double accel = seen > 0 ? a * f.attended_accel / seen : 0;  // resident on the accelerator
  const double rest = a - accel;                                    // selected among the others
  if (accel < b - 0.02)
    return head + "its floors (a minimum K, full layers, a recent window) keep more than the budget";
  const std::string resident = fmt::format(
      "its accelerator-resident tokens ({:.3f} of the context: a ring, sinks or whole layers) are attended "
      "in full",
      accel);
  if (rest <= b * (1 - accel) + 0.02) return head + resident + ", and the budget selects among the rest";
  return head + resident +
         fmt::format(
             ", and it selects {:.3f} of the context among the rest, above the budget's share: a floor or "
             "its "
             "scheduler (a minimum K; K grown while the CPU stage has time) keeps more",
             rest);
}
}  // namespace

Json Runner::run_once(const Point& p, const StrategyEntry& entry, int repeat, bool record) {
  if (spec_.eval.enabled && is_needle_task(p.task)) return record ? run_needle_once(p, entry, repeat) : Json();
  if (spec_.eval.enabled) return record ? run_eval_once(p, entry, repeat) : Json();
  const bool dry = spec_.execute == "dry";
  std::optional<PlatformProfile> prof;
  if (calibrates_each_run(p.platform)) {
    // Measured now, beside the run it models (a warm-up that records nothing needs none unless dry).
    if (record || dry) {
      prof = calibrate(CalibrateOptions{kRunCalibrationSeconds, kRunCalibrationBytes}, nullptr);
      prof->name = kCalibratePlatform;
      // The calibration measures the bare emulated device; the run also spends device_costs on
      // every launch, copy call and synchronisation, so the profile that replays it carries them.
      add_fixed_costs(*prof, device_costs());
    }
  } else if (!p.platform.empty()) {
    prof = profile(p.platform);
  }
  RuntimeConfig rc;
  rc.device = spec_.device;
  rc.dry = dry;
  rc.device_costs = device_costs();
  constexpr double kGiB = double(int64_t(1) << 30);
  if (dry) {
    rc.stage_clock = prof;
    rc.tiers.gpu_memory_bytes = int64_t(prof->gpu_mem_gib * kGiB);
    rc.tiers.dram_bytes = int64_t(prof->dram_gib * kGiB);
    rc.tiers.far_bytes = int64_t(prof->far_gib * kGiB);
  }
  if (p.gpu_memory_bytes > 0) rc.tiers.gpu_memory_bytes = p.gpu_memory_bytes;
  Runtime rt(rc);
  const Model& model = model_for(p.model);
  // Before anything the point's size decides is allocated: too large for this machine is an
  // out_of_memory row, not the kernel's OOM killer.
  require_host_memory(point_host_estimate(model.hp, p, dry), "this point");
  // Every strategy's KV on the accelerator, by construction.
  // (An entry's own share replaces the point's: the "it fits" regime beside the others.)
  if (entry.gpu_kv_share > 0) {
    Point q = p;
    q.gpu_kv_share = entry.gpu_kv_share;
    rt.memory().set_kv_budget(share_kv_bytes(model, q));
  } else {
    rt.memory().set_kv_budget(p.gpu_kv_share > 0 ? share_kv_bytes(model, p) : p.gpu_kv_bytes);
  }
  reserve_weights(rt, model);
  std::map<std::string, std::string> params = point_params(p, entry);
  const StrategyInfo& info = strategy_info(entry.name);
  const bool has_placement =
      std::any_of(info.params.begin(), info.params.end(), [](const ParamSpec& s) { return s.name == "placement"; });
  if (!p.placement.empty() && has_placement) params["placement"] = p.placement;
  const StrategyParams effective(entry.name, info.params, params);
  auto kv = make_strategy(entry.name, StrategyContext{rt.accel_backend(), &rt, &model}, params);

  std::mt19937_64 g(spec_.seed);
  const std::vector<std::vector<int32_t>> prompts(size_t(p.batch), seeded_prompt(model, p.prompt_tokens, g));
  GenerateOptions go;
  go.runtime = &rt;
  go.n_new = p.decode_tokens;
  go.stop_at_eos = false;
  go.sampler.greedy = true;
  // The whole prompt in one forward, each layer over all of its rows (as FlexGen and Hugging Face
  // prefill): every strategy writes each prompt token's KV once and no offloading strategy reads
  // earlier chunks' KV back over the link.
  go.max_rows = int(prefill_rows_of(p));
  if (!dry && !rt.accel_backend().host_memory()) warm_device(rt, model);
  const Measurement m = measure_generation(&rt, model, rt.accel_backend(), *kv, prompts, go);
  if (!record) return {};
  const Figures f = figures(m, prof && (dry || spec_.clock != "measured") ? &*prof : nullptr);

  Json r = row_head(spec_, p, entry, repeat, true);
  r["execute"] = spec_.execute;
  r["time_basis"] = f.modeled ? (dry ? "modeled (dry)" : "modeled") : "measured";
  r["point"] = p.values;
  Json par;
  for (auto& [k, v] : effective.all()) par[k] = v;
  r["params"] = par;
  if (entry.gpu_kv_share > 0) r["entry_gpu_kv_share"] = entry.gpu_kv_share;  // in place of the point's
  if (!p.placement.empty() && !has_placement) r["placement_note"] = entry.name + " has no placement parameter";
  Json fig;
  // time_s: the compared figure, end-to-end latency (prefill + every decode step).
  fig["time_metric"] = "end_to_end";
  fig["time_s"] = f.time_s();
  fig["prefill_s"] = f.prefill_time_s();
  fig["decode_s"] = f.decode_time_s();
  fig["decode_token_s"] = f.token_s();
  fig["attended"] = {{"accel_tokens", f.attended_accel},
                     {"cpu_tokens", f.attended_cpu},
                     {"fraction", f.attended_fraction}};
  if (const std::string why = budget_note(effective, f); !why.empty()) fig["attended"]["budget_note"] = why;
  fig["kv_dtype"] = std::string(dtype_name(kv->kv_dtype()));
  fig["prefill_tokens"] = f.prefill_tokens;
  fig["decode_tokens"] = f.decode_tokens;
  fig["decode_steps"] = f.decode_steps;
  Json meas;
  meas["prefill_s"] = f.prefill_s;
  meas["decode_s"] = f.decode_s;
  meas["decode_token_s_median"] = f.decode_token_s;
  meas["decode_token_s_min"] = f.decode_token_min_s;
  meas["decode_token_s_max"] = f.decode_token_max_s;
  meas["end_to_end_s"] = f.end_to_end_s;
  meas["pipeline"] = {{"accel_s", f.pipeline.accel_s},       {"cpu_s", f.pipeline.cpu_s},
                      {"transfer_s", f.pipeline.transfer_s}, {"cpu_hidden_frac", f.pipeline.hidden_frac},
                      {"critical_s", f.pipeline.critical_s}, {"serial_s", f.pipeline.serial_s}};
  fig["measured"] = meas;
  if (f.modeled) {
    Json md;
    md["platform"] = f.platform;
    md["prefill_s"] = f.m_prefill_s;
    md["decode_token_s_median"] = f.m_decode_token_s;
    md["end_to_end_s"] = f.m_end_to_end_s;
    if (calibrates_each_run(f.platform)) md["profile"] = profile_json(*prof);
    const auto replay_json = [&](const Figures::Replay& x) {
      return Json{{"prefill_s", x.prefill_s},
                  {"decode_token_s_median", x.decode_token_s},
                  {"end_to_end_s", x.end_to_end_s},
                  {"decode_tokens_per_s",
                   x.decode_token_s > 0 ? double(f.decode_tokens) /
                                              double(std::max<int64_t>(1, f.decode_steps)) / x.decode_token_s
                                        : 0.0}};
    };
    md["band"] = {{"peak", replay_json(f.m_peak)},
                  {"achieved", replay_json(f.m_achieved)},
                  {"achieved_source", prof->achieved.source}};
    md["pipeline"] = {{"accel_s", f.m_accel_s},       {"cpu_s", f.m_cpu_s},           {"transfer_s", f.m_transfer_s},
                      {"critical_s", f.m_critical_s}, {"serial_s", f.m_serial_s}};
    fig["modeled"] = md;
    // A real run replayed on a profile: the modeled clock checked against this run's measurement.
    if (!dry && f.end_to_end_s > 0) {
      fig["modeled_over_measured"] = {{"end_to_end", f.m_end_to_end_s / f.end_to_end_s},
                                      {"decode_token", f.decode_token_s > 0 ? f.m_decode_token_s / f.decode_token_s : NAN}};
      Json by;
      for (auto& [name, ss] : f.stage_sums)
        by[name] = {{"count", ss.count}, {"measured_s", ss.measured_s}, {"modeled_s", ss.modeled_s}};
      fig["clock_by_stage"] = by;
    }
  }
  r["figures"] = fig;
  Json work;
  for (int k = 0; k < 3; ++k) {
    Json kj;
    kj["flops"] = f.flops_per_step[size_t(k)];
    for (int t = 0; t < kNumTiers; ++t) kj[std::string(tier_name(Tier(t))) + "_bytes"] = f.bytes_per_step[size_t(k)][size_t(t)];
    work[std::string(stage_kind_name(StageKind(k)))] = kj;
  }
  r["work_per_step"] = work;
  Json links, links_pf;
  for (int s = 0; s < kNumTiers; ++s)
    for (int d = 0; d < kNumTiers; ++d) {
      if (f.link_bytes_per_step[size_t(s)][size_t(d)] > 0) links[link_name(s, d)] = f.link_bytes_per_step[size_t(s)][size_t(d)];
      if (f.link_bytes_prefill[size_t(s)][size_t(d)] > 0) links_pf[link_name(s, d)] = f.link_bytes_prefill[size_t(s)][size_t(d)];
    }
  r["link_bytes_per_step"] = links.is_null() ? Json::object() : links;
  r["link_bytes_prefill"] = links_pf.is_null() ? Json::object() : links_pf;
  Json tiers;
  for (int t = 0; t < kNumTiers; ++t)
    tiers[std::string(tier_name(Tier(t)))] = {{"peak_bytes", m.tiers[size_t(t)].peak},
                                              {"capacity_bytes", m.tiers[size_t(t)].capacity}};
  tiers["gpu"]["kv_peak_bytes"] = m.gpu_kv.peak;
  tiers["gpu"]["kv_budget_bytes"] = m.gpu_kv.capacity;
  r["tiers"] = tiers;
  // The accelerator's calls: the prompt's, and the mean of a measured decode step's.
  DeviceCounts steps;
  for (const auto& c : m.step_device) steps += c;
  r["device_calls"] = {{"prefill", device_counts_json(m.prefill_device)},
                       {"decode_per_step", device_counts_json(steps, double(std::max<size_t>(1, m.step_device.size())))},
                       {"fixed_costs_us",
                        {{"launch", rt.device_costs().launch_us},
                         {"copy", rt.device_costs().copy_us},
                         {"sync", rt.device_costs().sync_us}}}};
  r["strategy_stats"] = {{"last", f.stats_last}, {"mean", f.stats_mean}};
  if (!f.trajectory.empty()) r["strategy_stats"]["trajectory"] = trajectory_json(f.trajectory);
  // What the strategy ran with where it differs from, or is derived from, its parameters.
  Json rve = Json::object();
  for (auto& [k, v] : kv->effective_params()) rve[k] = v;
  r["requested_vs_effective"] = rve;
  Json dev;
  dev["device"] = rt.device_description();
  dev["far_note"] = rt.memory().far_note();
  r["runtime"] = dev;
  r["weights"] = weights_record(model);
  r["provenance"] = run_provenance(p);
  return r;
}

void Runner::run(const Point& p, const StrategyEntry& entry, const std::vector<int>& skip,
                 const std::function<void(Json)>& on_row) {
  auto attempt = [&](int repeat, bool record) -> std::optional<Json> {
    try {
      return run_once(p, entry, repeat, record);
    } catch (const OutOfMemoryError& e) {
      return failed_row(spec_, p, entry, repeat, "out_of_memory", e.what());
    } catch (const UnsupportedError& e) {
      return failed_row(spec_, p, entry, repeat, "unsupported", e.what());
    } catch (const InputError& e) {
      return failed_row(spec_, p, entry, repeat, "bad_input", e.what());
    } catch (const std::exception& e) {
      return failed_row(spec_, p, entry, repeat, "internal", e.what());
    }
  };
  bool all_done = true;
  for (int r = 0; r < spec_.repeats; ++r) all_done = all_done && std::count(skip.begin(), skip.end(), r);
  if (all_done) return;
  for (int w = 0; w < spec_.warmup; ++w) {
    auto row = attempt(-1, false);
    if (row && !row->is_null() && (*row)["status"] == "failed") {  // the warm-up's failure is the point's
      for (int r = 0; r < spec_.repeats; ++r) {
        if (std::count(skip.begin(), skip.end(), r)) continue;
        (*row)["repeat"] = r;
        on_row(*row);
      }
      return;
    }
  }
  for (int r = 0; r < spec_.repeats; ++r) {
    if (std::count(skip.begin(), skip.end(), r)) continue;
    on_row(*attempt(r, true));
  }
}

}  // namespace hg
