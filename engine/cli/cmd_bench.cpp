// `hgbench bench`: decode tokens/s at given context lengths against the bandwidth limit, prefill
// tokens/s and the harness's own overhead; with --strategy, the KV strategies on the accelerator.
// Every run goes through the Runner's generation loop (experiments/runner/runner.h); the cache is
// filled with seeded rows through the strategy's own append() (its values do not change a step's
// cost), or by a real prefill for a strategy whose decode depends on the prompt's attention.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "baselines/registry.h"
#include "engine/backend/backend.h"
#include "engine/cli/cli.h"
#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/formats/formats.h"
#include "engine/runtime/bandwidth.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"
#include "experiments/runner/runner.h"

namespace hg::cli {
namespace {

constexpr const char* kBenchDoc =
    R"(Decode tokens/s at each context length (the KV cache, F16 by default, is filled with seeded random
rows: its values do not change the cost), prefill tokens/s for one prompt, and the ratio to the
bandwidth limit (weight bytes + KV bytes per token). Each decode step is paired with a read pass
right after it (same threads, a 512 MiB buffer read in turn); the ratio is the median over steps
of the step's bytes/s over its pass's GB/s, with the range beside it. The pass reads eight
prefetched streams per thread, the best read of the machine; `1-stream` is the same ratio against
a second pass of one plain stream per thread (a weaker reference; host only). Then the harness
overhead: the same decode loop with the null backend and the null strategy, as a share of the
first context's step. The `full` strategy. With --backend cuda (F32 KV) the weights, activations
and KV are in GPU memory and the paired pass is a copy within GPU memory (read + write bytes), so
the limit is the HBM floor. Measured, never modeled.

With --strategy S1,S2,… (e.g. flexgen,moe_lightning,hybridgen) it measures those KV strategies
instead, on the runtime's accelerator (--device emulated|cuda|auto, default auto; --set S.P=V as
for generate; F32 KV): per strategy and context, decode tok/s after two warm-up steps, the bytes
each step moved over the link (host→device and device→host) and their rate, and the pipeline
from the event log (accelerator, CPU and transfer busy time per step, how much of the CPU stage
ran while the accelerator was busy, the critical path against the serial sum). The strategy's
last step record (K, selection mode, tokens per side) follows its row. --clock modeled:<platform>
also replays the timed steps' stages on experiments/platforms/<platform>.yaml (labelled MODELED).
A strategy whose decode depends on the prompt's attention (InfiniGen's calibration) is filled by
a real prefill of seeded token ids, which takes longer at long contexts. Eviction policies filled
through append() start decode with zero scores: the same work per step, another choice of tokens.)";

// The reference pass paired with each decode step: on the host, one read pass of a 512 MiB
// buffer read in turn (ReadProbe); on a device backend, one copy within its memory timed to its
// completion (a 4-byte download waits), counting bytes read and written: the HBM floor.
class StepReference {
 public:
  explicit StepReference(Backend& be) : be_(be), device_(!be.host_memory()) {
    if (device_) a_ = BackendArray<char>(be, kDeviceBytes), b_ = BackendArray<char>(be, kDeviceBytes);
    else probe_.emplace(int64_t(512) << 20);
    pass_gbs(int64_t(256) << 20);  // warm-up (first touch, first copy)
  }
  // GB/s of one pass over min(bytes, the buffer); 0 for a one-stream pass on a device (none).
  double pass_gbs(int64_t bytes, ReadPass how = ReadPass::kEightStreams) {
    if (!device_) return probe_->pass_gbs(bytes, how);
    if (how == ReadPass::kOneStream) return 0;
    const size_t n = size_t(std::clamp<int64_t>(bytes, 1 << 20, int64_t(kDeviceBytes)));
    float sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
    be_.copy(b_.data(), a_.data(), n);
    be_.download(&sink, b_.data(), 4);
    return 2.0 * double(n) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  }

 private:
  static constexpr size_t kDeviceBytes = size_t(1) << 30;
  Backend& be_;
  bool device_;
  BackendArray<char> a_, b_;
  std::optional<ReadProbe> probe_;
};

// The kernel's transparent-huge-page mode (the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled), or "unknown".
std::string thp_mode() {
  std::string line;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), line);
  const auto a = line.find('['), b = line.find(']');
  return a != std::string::npos && b > a ? line.substr(a + 1, b - a - 1) : "unknown";
}

// Every context (its warm-up and timed steps) and the prefill within this machine's memory and, for
// learned positions (a table with no row beyond it), within the model's positions, before any is
// run. Rotary models are timed past their trained length as a cost measurement (llama-bench does
// the same); positions stay within int32.
void check_sizes(const Model& model, const std::vector<int>& contexts, int steps, int prefill,
                 const std::string& cmd) {
  const auto check = [&](int64_t n, int64_t more) {
    if (model.traits.pos == PosKind::kLearned || n + more > INT32_MAX) check_positions(model, n, more, cmd);
    require_host_memory_or_input_error(generation_host_estimate(model.hp, n, more, 1, n, false), cmd);
  };
  for (int n : contexts) check(n, int64_t(steps) + 3);
  if (prefill > 0) check(prefill, 0);
}

// Decode of `steps` timed steps at context n (one warm-up step first) through the Runner's loop,
// the cache filled with seeded rows; after_step(s) runs after each timed step, untimed.
Measurement decode_at(const Model& model, Backend& be, KvStrategy& kv, int n, int steps, std::mt19937_64& rng,
                      const std::function<void()>& after_timed_step = {}) {
  GenerateOptions go;
  go.n_new = steps + 1;
  go.stop_at_eos = false;
  go.fill = PromptFill::kSeeded;
  go.fill_seed = rng();
  if (after_timed_step) go.after_step = [&](int64_t s) { if (s >= 2) after_timed_step(); };
  return measure_generation(nullptr, model, be, kv, {seeded_prompt(model, n + 1, rng)}, go, 1);
}

int bench_strategies(const Model& model, const std::vector<std::string>& names,
                     std::map<std::string, std::map<std::string, std::string>>& sets, const std::vector<int>& contexts,
                     int steps, const std::string& device, const std::optional<PlatformProfile>& profile,
                     const DeviceCosts& costs) {
  const HParams& hp = model.hp;
  RuntimeConfig rc;
  rc.device = device;
  rc.device_costs = costs;
  if (rc.device == "cpu") input_error("bench: --strategy needs an accelerator device (--device emulated, cuda or auto)");
  Runtime rt(rc);
  Backend& be = rt.accel_backend();
  fmt::print("model {} | weights {} | KV cache f32 ({:.0f} B per cached token) | device {} | measured\n", model.source,
             dtype_name(model.weight_dtype), 2.0 * hp.n_layers * hp.n_kv_heads * hp.head_dim * 4,
             rt.device_description());
  fmt::print("{:<14} {:>8} {:>9} {:>9} {:>11} {:>10} {:>10} {:>9} {:>8} {:>8} {:>8} {:>7} {:>9}\n", "strategy",
             "context", "tok/s", "step ms", "range ms", "h2d MB", "d2h MB", "link GB/s", "accel ms", "cpu ms",
             "xfer ms", "hidden", "crit/sum");
  std::mt19937_64 rng(1);
  constexpr int kWarmup = 2;  // first touch, kernel choice, the scheduler's first moves
  for (const auto& name : names) {
    for (int n : contexts) {
      auto kv = make_strategy(name, StrategyContext{be, &rt, &model}, sets[name]);
      // A strategy whose decode depends on the prompt's attention gets a real prefill of seeded
      // token ids (O(n²) attention: slower to set up, the same decode steps after it).
      const bool prefill = kv->needs_prompt_attention();
      GenerateOptions go;
      go.runtime = &rt;
      go.stop_at_eos = false;
      go.fill = prefill ? PromptFill::kPrefill : PromptFill::kSeeded;
      go.fill_seed = rng();
      // Decode starts at position n either way: after a prefill of n tokens (whose logits give the
      // first token), or at the last of n + 1 seeded positions.
      go.n_new = steps + kWarmup + (prefill ? 1 : 0);
      const Measurement m =
          measure_generation(&rt, model, be, *kv, {seeded_prompt(model, prefill ? n : n + 1, rng)}, go, kWarmup);
      const Figures f = figures(m, profile ? &*profile : nullptr);
      double h2d = 0, d2h = 0;
      for (Tier t : {Tier::kDram, Tier::kFar}) {
        h2d += f.link_bytes_per_step[size_t(t)][size_t(Tier::kGpu)];
        d2h += f.link_bytes_per_step[size_t(Tier::kGpu)][size_t(t)];
      }
      const double med = f.decode_token_s;
      const PipelineSummary& ps = f.pipeline;
      fmt::print(
          "{:<14} {:>8} {:>9.2f} {:>9.2f} {:>5.1f}-{:<5.1f} {:>10.2f} {:>10.2f} {:>9.1f} {:>8.2f} {:>8.2f} {:>8.2f} "
          "{:>6.0f}% {:>9.2f}\n",
          name, n, 1.0 / med, med * 1e3, f.decode_token_min_s * 1e3, f.decode_token_max_s * 1e3, h2d / 1e6,
          d2h / 1e6, (h2d + d2h) / med / 1e9, ps.accel_s * 1e3, ps.cpu_s * 1e3, ps.transfer_s * 1e3,
          ps.hidden_frac * 100, ps.serial_s > 0 ? ps.critical_s / ps.serial_s : 0.0);
      if (profile) {
        const double modeled = f.m_end_to_end_s - f.m_prefill_s;
        fmt::print("    MODELED on {}: {:.2f} tok/s ({:.2f} ms per step)  [modeled, not measured]\n", profile->name,
                   double(f.decode_steps) / modeled, modeled / double(f.decode_steps) * 1e3);
      }
      if (prefill)
        fmt::print("    filled by a prefill of {} tokens ({}'s decode depends on the prompt's attention)\n", n, name);
      if (!m.step_device.empty()) {
        DeviceCounts sum;
        for (const auto& c : m.step_device) sum += c;
        const double k = double(m.step_device.size());
        fmt::print("    per step: {:.1f} launches, {:.1f} syncs, {:.1f} waits, {:.1f} h2d calls ({:.3f} MB), {:.1f} d2h "
                   "calls ({:.3f} MB), {:.1f} host policy elements{}\n",
                   double(sum.launches) / k, double(sum.syncs) / k, double(sum.waits) / k, double(sum.copies_h2d) / k,
                   double(sum.bytes_h2d) / k / 1e6, double(sum.copies_d2h) / k, double(sum.bytes_d2h) / k / 1e6,
                   double(sum.host_policy_elems) / k,
                   costs.any() ? fmt::format(" (fixed costs spent: launch {} µs, copy {} µs, sync {} µs)",
                                             costs.launch_us, costs.copy_us, costs.sync_us)
                               : std::string());
      }
      if (!f.stats_last.empty()) {
        std::string line = "    last step:";
        for (auto& [key, val] : f.stats_last) line += fmt::format(" {}={:g}", key, val);
        fmt::print("{}\n", line);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& args) {
  const std::string cmd = "bench";
  CLI::App app{std::string("Decode tok/s at context lengths and prefill tok/s, against the bandwidth limit.\n\n") +
                   kBenchDoc,
               cmd};
  std::string model_spec, context = "128,4096,16384", thread_list = "1,2", kv_name = "f16", weights, backend_name,
                          strategy_list, device = "auto", clock = "measured", device_costs = "off";
  std::vector<std::string> sets;
  int steps = 16, prefill = 512;
  app.add_option("-m,--model", model_spec, "the model (see `hgbench models`)")->required();
  app.add_option("--context", context, "context lengths, comma-separated")->capture_default_str();
  app.add_option("--threads", thread_list, "thread counts, comma-separated (not with --strategy)")->capture_default_str();
  app.add_option("--steps", steps, "timed decode steps per context")->capture_default_str();
  app.add_option("--kv", kv_name, "KV cache type f32, f16 or bf16 (--strategy: f32)")->capture_default_str();
  app.add_option("--prefill", prefill, "prompt tokens of the prefill measurement (not with --strategy)")
      ->capture_default_str();
  app.add_option("--weights", weights, "engine weight type f32, f16 or bf16 (default: the file's)");
  app.add_option("--backend", backend_name, "cpu (default) or cuda (not with --strategy)");
  app.add_option("--strategy", strategy_list, "measure these KV strategies instead, comma-separated");
  app.add_option("--device", device, "with --strategy: emulated, cuda or auto")->capture_default_str();
  app.add_option("--set", sets, "with --strategy: parameter P of strategy S, S.P=V (repeatable)");
  app.add_option("--clock", clock, "with --strategy: measured, or modeled:<platform> to replay the steps on a profile");
  app.add_option("--device-costs", device_costs,
                 "with --strategy and --device emulated: off (default) or a platform (e.g. h200-measured) whose "
                 "measured launch, copy-call and synchronisation costs the emulated accelerator spends");
  if (int rc = parse_cli(app, cmd, args); rc >= 0) return rc;

  const auto contexts = int_list(context, "--context", cmd);
  if (steps < 1 || prefill < 1) input_error("bench: --steps and --prefill must be positive");
  DType kv = DType::kF32;
  if (!parse_dtype(kv_name, &kv)) input_error("bench: --kv '{}' (expected f32, f16 or bf16)", kv_name);
  if (!strategy_list.empty()) {
    for (const char* opt : {"--backend", "--threads", "--prefill"})
      if (app.count(opt)) input_error("bench: {} is not used with --strategy (the runtime's accelerator runs)", opt);
    if (app.count("--kv") && kv_name != "f32")
      input_error("bench: --strategy runs F32 KV caches (give --kv f32 or leave it out)");
    std::vector<std::string> names;
    for (size_t pos = 0;;) {
      const size_t c = strategy_list.find(',', pos);
      names.push_back(strategy_list.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
      if (c == std::string::npos) break;
      pos = c + 1;
    }
    auto per_strategy = strategy_sets(sets, cmd, names);
    for (auto& n : names) strategy_info(n);  // unknown names fail before any work
    const auto profile = clock_profile(clock, cmd);
    Model model = load_model(model_spec, load_options(weights, cmd));
    check_sizes(model, contexts, steps, 0, cmd);
    const DeviceCosts costs = device_costs_option(device_costs, cmd, device);
    return bench_strategies(model, names, per_strategy, contexts, steps, device, profile, costs);
  }
  if (app.count("--device") || app.count("--set") || app.count("--clock") || app.count("--device-costs"))
    input_error("bench: --device, --set, --clock and --device-costs go with --strategy (without it: --backend)");
  const auto threads = int_list(thread_list, "--threads", cmd);
  for (int t : threads) check_threads(t, cmd);
  Model model = load_model(model_spec, load_options(weights, cmd));
  check_sizes(model, contexts, steps, prefill, cmd);
  const HParams& hp = model.hp;
  auto be = make_backend(backend_name.empty() ? "cpu" : backend_name);
  if (!be->host_memory() && kv != DType::kF32)
    input_error("bench: --backend {} reads F32 KV caches (give --kv f32)", be->name());
  // Weights read per decode token: every matrix once; an untied embedding only as one row.
  const int64_t embd = hp.tie_embeddings ? 0 : int64_t(model[GlobalSlot::kTokEmbd].bytes());
  const double weight_bytes = double(model.weight_bytes() - embd);
  const double kv_per_token = 2.0 * hp.n_layers * hp.n_kv_heads * hp.head_dim * double(dtype_size(kv));
  fmt::print("model {} | weights {} ({:.1f} MB read per token) | KV cache {} ({:.0f} B per cached token) | measured\n",
             model.source, dtype_name(model.weight_dtype), weight_bytes / 1e6, dtype_name(kv), kv_per_token);
  fmt::print("host memory: 2 MiB pages {} (transparent huge pages: {}) | CPU kernels: {}, {} tuning\n",
             huge_pages_advised() ? "advised" : "not advised (HG_NO_HUGE_PAGES)", thp_mode(),
             cpu_isa_name(active_cpu_isa()), cpu_tuning_name(cpu_tuning()));
  fmt::print("{:>8} {:>7} {:>12} {:>10} {:>14} {:>12} {:>7} {:>11} {:>9}\n", "context", "threads", "decode tok/s",
             "read GB/s", "MB per token", "limit tok/s", "ratio", "ratio range", "1-stream");
  std::mt19937_64 rng(1);
  StepReference reference(*be);
  const std::map<std::string, std::string> full_kv = {{"kv_dtype", std::string(dtype_name(kv))}};
  for (int t : threads) {
    set_num_threads(t);
    double first_step_s = 0;
    int first_context = 0;
    for (int n : contexts) {
      auto kvs = make_strategy("full", StrategyContext{*be, nullptr, &model}, full_kv);
      // Each step is paired with a reference pass right after it: the ratio is the median over
      // steps of (bytes / step time) / that pass's bandwidth, so the step and its reference see
      // the same moment of a shared machine. Bytes grow by one KV row per step.
      const double bytes = weight_bytes + kv_per_token * (n + steps / 2.0);
      std::vector<double> ref, ref1;
      const Measurement m = decode_at(model, *be, *kvs, n, steps, rng, [&] {
        ref.push_back(reference.pass_gbs(int64_t(bytes)));
        ref1.push_back(reference.pass_gbs(int64_t(bytes), ReadPass::kOneStream));
      });
      const Figures f = figures(m, nullptr);
      PairedRatio pr, pr1;
      for (size_t i = 0; i < m.step_s.size(); ++i) {
        pr.add(bytes / m.step_s[i] / 1e9, ref[i]);
        if (ref1[i] > 0) pr1.add(bytes / m.step_s[i] / 1e9, ref1[i]);
      }
      const auto ratios = pr.ratios();
      const double tps = 1.0 / f.decode_token_s, bw = pr.ref_gbs();
      if (first_step_s == 0) first_step_s = f.decode_token_s, first_context = n;
      fmt::print("{:>8} {:>7} {:>12.2f} {:>10.1f} {:>14.1f} {:>12.2f} {:>7.2f} {:>5.2f}-{:<5.2f} {:>9}\n", n, t, tps, bw,
                 bytes / 1e6, bw * 1e9 / bytes, pr.ratio(), *std::min_element(ratios.begin(), ratios.end()),
                 *std::max_element(ratios.begin(), ratios.end()),
                 pr1.size() ? fmt::format("{:.2f}", pr1.ratio()) : std::string("-"));
    }
    {
      // Harness overhead: the same decode loop with every kernel a no-op (null backend) and no KV
      // (null strategy): what remains is the engine's own per-step work.
      auto nb = make_backend("null");
      auto ns = make_strategy("null", StrategyContext{*nb, nullptr, &model});
      const Measurement m = decode_at(model, *nb, *ns, 1, std::max(64, steps * 8), rng);
      const double s = figures(m, nullptr).decode_token_s;
      fmt::print("harness overhead: {:.1f} us per decode step (null backend, null strategy) = {:.2f}% of the measured "
                 "step at context {}\n",
                 s * 1e6, 100.0 * s / first_step_s, first_context);
    }
    // Prefill: one prompt of `prefill` tokens, as a server would run a request: the decoder and
    // its KV store are reused from a warm-up request of the same size (as llama-bench reuses its
    // context), so the figure is the forward pass, not first-touch page faults.
    auto kvs = make_strategy("full", StrategyContext{*be, nullptr, &model}, full_kv);
    Decoder dec(model, *be, *kvs);
    const std::vector<std::vector<int32_t>> prompt = {seeded_prompt(model, prefill, rng)};
    GenerateOptions go;
    go.n_new = 0;
    go.decoder = &dec;
    std::vector<double> pf_s;
    for (int rep = 0; rep < 4; ++rep) {
      const Measurement m = measure_generation(nullptr, model, *be, *kvs, prompt, go);
      if (rep > 0) pf_s.push_back(m.gen.prefill_s);
    }
    std::sort(pf_s.begin(), pf_s.end());
    fmt::print("prefill {} tokens, {} thread{}: {:.1f} tok/s (median of 3; {:.1f}-{:.1f})\n", prefill, t,
               t == 1 ? "" : "s", prefill / pf_s[1], prefill / pf_s[2], prefill / pf_s[0]);
  }
  return 0;
}

}  // namespace hg::cli
