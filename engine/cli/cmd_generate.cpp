// `hgbench generate`: text from a model, with prefill and decode tokens/s; on an accelerator device
// the pipeline from the event log, and with --clock modeled:<platform> the modeled figures. The
// generation loop and every figure come from the Runner (experiments/runner/runner.h).
#include <cstdio>
#include <random>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "baselines/registry.h"
#include "engine/cli/cli.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"
#include "experiments/runner/runner.h"

namespace hg::cli {

int cmd_generate(const std::vector<std::string>& args) {
  const std::string cmd = "generate";
  CLI::App app{"Loads a model and generates text; prints each sequence's text, then prefill and decode tokens/s.",
               cmd};
  std::string model_spec, backend_name, device = "cpu", gpu_memory, clock = "measured", sname = "full", weights,
      device_costs = "off";
  std::vector<std::string> texts, sets;
  int n_new = 32, batch = 1, threads = hardware_threads(), prompt_tokens = 0;
  bool greedy = false, ignore_eos = false, show_ids = false, quiet = false, step_stats = false;
  SamplerOptions so;
  app.add_option("-m,--model", model_spec,
                 "GGUF file, Hugging Face directory, llama2.c .bin (?tokenizer=PATH), or "
                 "synthetic:<preset>[?layers=N&kv_heads=N&dtype=f16|bf16&seed=S] (see `hgbench models`)")
      ->required();
  app.add_option("-p,--prompt", texts, "prompt text (repeat for a batch of different prompts; default: BOS only)");
  auto* pt = app.add_option("--prompt-tokens", prompt_tokens,
                            "instead of text: BOS + N−1 token ids drawn uniformly (seeded by --seed), for "
                            "long-context runs on synthetic models");
  app.add_option("-n,--n-predict", n_new, "tokens to generate per sequence")->capture_default_str();
  app.add_option("-b,--batch", batch, "run B copies of each prompt")->capture_default_str();
  app.add_flag("--greedy", greedy, "argmax decoding (default unless --temp/--top-k/--top-p are given)");
  app.add_option("--temp", so.temperature, "sampling temperature (default 1.0 when sampling)");
  app.add_option("--top-k", so.top_k, "keep the K most likely tokens (0: all)");
  app.add_option("--top-p", so.top_p, "nucleus sampling mass (1.0: all)");
  app.add_option("--seed", so.seed, "sampling seed (default 0); sequence b uses stream b");
  app.add_option("-t,--threads", threads, "CPU threads (default: all hardware threads)");
  app.add_option("--backend", backend_name,
                 "cpu (default), ref (scalar oracle), cuda (device 0; strategy full, F32 KV), null (every kernel "
                 "a no-op: harness overhead only)");
  app.add_option("--device", device,
                 "cpu (default: no accelerator role), emulated (the CPU backend on its own worker thread with a "
                 "capacity-limited gpu tier), cuda (weights, activations and the accelerator's KV in GPU memory, "
                 "F32 KV; every strategy but null), auto (cuda when a device exists, else emulated)");
  app.add_option("--gpu-memory", gpu_memory, "capacity of the accelerator's gpu tier, e.g. 2GiB (default: all it has)");
  app.add_option("--clock", clock,
                 "measured (default) or modeled:<platform> (experiments/platforms/<platform>.yaml or a path): also "
                 "prints modeled prefill/decode tokens/s from the event log (needs an accelerator device)");
  app.add_option("--device-costs", device_costs,
                 "off (default) or a platform (e.g. h200-measured): the emulated accelerator spends its measured "
                 "launch, copy-call and synchronisation costs as real time");
  app.add_option("--strategy", sname, "KV strategy (default full; see `hgbench strategies`)");
  app.add_option("--set", sets, "set parameter P of strategy S: S.P=V (repeatable), e.g. flexgen.overlap=false");
  app.add_flag("--step-stats", step_stats, "print one line per decode step: the strategy's record (K, mode, bytes, …)");
  app.add_option("--weights", weights, "engine weight type f32, f16 or bf16 (default: the file's F16/BF16, else f32)");
  app.add_flag("--ignore-eos", ignore_eos, "keep generating after EOS");
  app.add_flag("--ids", show_ids, "also print the generated token ids");
  app.add_flag("--quiet", quiet, "print only the timing line");
  if (int rc = parse_cli(app, cmd, args); rc >= 0) return rc;

  check_threads(threads, "generate");
  set_num_threads(threads);
  if (batch <= 0) input_error("generate: --batch must be positive");
  if (n_new < 0) input_error("generate: -n must be non-negative");
  GenerateOptions go;
  go.n_new = n_new;
  go.stop_at_eos = !ignore_eos;
  const bool sampling = app.count("--temp") || app.count("--top-k") || app.count("--top-p");
  so.greedy = greedy || !sampling;
  if (so.top_p <= 0 || so.top_p > 1) input_error("generate: --top-p must be in (0, 1]");
  if (so.top_k < 0) input_error("generate: --top-k must be non-negative");
  go.sampler = so;

  const std::optional<PlatformProfile> profile = clock_profile(clock, cmd);
  RuntimeConfig rc;
  rc.device = device;
  rc.device_costs = device_costs_option(device_costs, cmd, device);
  if (!gpu_memory.empty()) rc.tiers.gpu_memory_bytes = parse_bytes(gpu_memory, "--gpu-memory");
  if (rc.device == "cpu" || app.count("--threads")) rc.accel_threads = threads;
  Runtime rt(rc);
  if (profile && rt.device() == DeviceKind::kCpu)
    input_error("generate: --clock {} needs an accelerator device (--device emulated or cuda): the cpu device logs no "
                "stages",
                clock);
  std::unique_ptr<Backend> own_backend;
  Backend* backend = &rt.accel_backend();
  if (!backend_name.empty() || rt.device() == DeviceKind::kCpu) {
    own_backend = make_backend(backend_name.empty() ? "cpu" : backend_name);
    backend = own_backend.get();
  }
  const std::map<std::string, std::string> params = strategy_sets(sets, cmd, {sname})[sname];
  Model model = load_model(model_spec, load_options(weights, cmd));
  auto strategy = make_strategy(sname, StrategyContext{*backend, &rt, &model}, params);
  // The weights live on the accelerator: an emulated gpu tier too small for them is a result.
  if (rt.device() != DeviceKind::kCpu) reserve_weights(rt, model);
  go.runtime = &rt;
  const Tokenizer& tok = *model.tokenizer;

  if (texts.empty()) texts = {""};
  // Each prompt against the model's positions and, with every copy of the batch, against the host
  // memory its generation needs, before the copies are made.
  const auto check_size = [&](int64_t prompt_len) {
    check_positions(model, prompt_len, n_new, cmd);
    require_host_memory_or_input_error(
        generation_host_estimate(model.hp, prompt_len, n_new, int64_t(batch) * int64_t(texts.size()),
                                 go.max_rows, false),
        cmd);
  };
  std::vector<std::vector<int32_t>> prompts;
  if (pt->count()) {
    if (app.count("--prompt")) input_error("generate: give --prompt or --prompt-tokens, not both");
    if (prompt_tokens < 1) input_error("generate: --prompt-tokens must be >= 1");
    check_size(prompt_tokens);
    std::mt19937_64 g(so.seed);
    const std::vector<int32_t> ids = seeded_prompt(model, prompt_tokens, g);
    texts = {fmt::format("<{} random tokens>", prompt_tokens)};
    for (int b = 0; b < batch; ++b) prompts.push_back(ids);
  } else {
    for (auto& t : texts) {
      auto ids = tok.encode_prompt(t);
      if (ids.empty() && tok.bos_id >= 0) ids.push_back(tok.bos_id);
      if (ids.empty()) input_error("generate: prompt '{}' encodes to no tokens and the tokenizer has no BOS", t);
      check_size(int64_t(ids.size()));
      for (int b = 0; b < batch; ++b) prompts.push_back(ids);
    }
  }
  const bool stream = !quiet && prompts.size() == 1 && !step_stats;
  int32_t prev = prompts[0].back();
  if (stream) {
    fmt::print("{}", texts[0]);
    std::fflush(stdout);
  }
  int step_no = 0;
  TransferTotals seen;
  DeviceCounts seen_calls = rt.device_counts();
  const Measurement m = measure_generation(&rt, model, *backend, *strategy, prompts, go, 0, [&](int seq, int32_t id) {
    if (step_stats && seq == 0) {
      // The strategy's record plus the bytes this step moved per link (step 0 is the prefill).
      std::string line = fmt::format("step {}:", step_no++);
      for (auto& [k, v] : strategy->step_stats()) line += fmt::format(" {}={:g}", k, v);
      const DeviceCounts dc = rt.device_counts();
      if (rt.device() != DeviceKind::kCpu) line += " " + device_counts_line(dc - seen_calls);
      seen_calls = dc;
      const TransferTotals now = rt.transfers().totals();
      for (auto src : {Tier::kGpu, Tier::kDram, Tier::kFar})
        for (auto dst : {Tier::kGpu, Tier::kDram, Tier::kFar}) {
          const int64_t d = now.bytes_between(src, dst) - seen.bytes_between(src, dst);
          if (d > 0) line += fmt::format(" {}->{}={}B", tier_name(src), tier_name(dst), d);
        }
      seen = now;
      fmt::print(stderr, "{}\n", line);
    }
    if (!stream) return;
    fmt::print("{}", tok.piece(id, prev));
    std::fflush(stdout);
    prev = id;
  });
  const Figures f = figures(m, profile ? &*profile : nullptr);
  if (stream) fmt::print("\n");
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (!quiet && !stream) fmt::print("[{}] {}{}\n", b, texts[b / size_t(batch)], tok.decode(m.gen.tokens[b]));
    if (show_ids) {
      std::string ids;
      for (auto id : m.gen.tokens[b]) ids += (ids.empty() ? "" : " ") + std::to_string(id);
      fmt::print("ids[{}]: {}\n", b, ids);
    }
  }
  std::fflush(stdout);  // the text first, then the timing line on stderr
  fmt::print(stderr,
             "model {} | device {} | backend {} | strategy {} | weights {} | threads {} | batch {} | clock measured\n"
             "prefill: {} tokens in {:.3f} s ({:.1f} tok/s) | decode: {} tokens in {:.3f} s ({:.2f} tok/s)\n",
             model.source, rt.device_description(), backend->name(), strategy->name(), dtype_name(model.weight_dtype),
             rt.device() == DeviceKind::kCpu ? threads : rt.accel_threads(), prompts.size(), f.prefill_tokens,
             f.prefill_s, f.prefill_s > 0 ? double(f.prefill_tokens) / f.prefill_s : 0.0, f.decode_tokens, f.decode_s,
             f.decode_s > 0 ? double(f.decode_tokens) / f.decode_s : 0.0);
  if (rt.device() != DeviceKind::kCpu && f.pipeline.steps > 0) {
    const PipelineSummary& p = f.pipeline;
    fmt::print(stderr,
               "pipeline over {} decode steps (measured, per step): accelerator {:.2f} ms, CPU {:.2f} ms, transfers "
               "{:.2f} ms | CPU hidden behind the accelerator {:.0f}% | critical path {:.2f} ms vs serial sum "
               "{:.2f} ms ({:.2f})\n",
               p.steps, p.accel_s * 1e3, p.cpu_s * 1e3, p.transfer_s * 1e3, p.hidden_frac * 100, p.critical_s * 1e3,
               p.serial_s * 1e3, p.serial_s > 0 ? p.critical_s / p.serial_s : 0.0);
  }
  if (rt.memory().ledger().usage(Tier::kFar).peak > 0 && !rt.memory().far_note().empty())
    fmt::print(stderr, "note: {}\n", rt.memory().far_note());
  if (profile) {
    const double m_decode = f.m_end_to_end_s - f.m_prefill_s;
    fmt::print(stderr, "MODELED on {} ({}): prefill {:.1f} tok/s | decode {:.2f} tok/s  [modeled, not measured]\n",
               profile->name, profile->source, f.m_prefill_s > 0 ? double(f.prefill_tokens) / f.m_prefill_s : 0.0,
               m_decode > 0 ? double(f.decode_tokens) / m_decode : 0.0);
  }
  return 0;
}

}  // namespace hg::cli
