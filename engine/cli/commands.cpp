// hgbench generate / info / strategies / models.
#include "engine/cli/commands.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <filesystem>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "baselines/full/full.h"
#include "baselines/null/null.h"
#include "baselines/registry.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/formats/gguf_writer.h"
#include "engine/runtime/bandwidth.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg::cli {
namespace {

// Minimal strict option parser: --name value, --flag; unknown options are errors.
struct Options {
  std::map<std::string, std::vector<std::string>> values;
  std::map<std::string, bool> flags;
};

struct OptSpec {
  std::vector<std::string> names;  // first is canonical
  bool takes_value;
  bool repeatable = false;
};

Options parse(const std::string& cmd, const std::vector<std::string>& args, const std::vector<OptSpec>& specs) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const OptSpec* hit = nullptr;
    for (auto& s : specs)
      for (auto& n : s.names)
        if (n == args[i]) hit = &s;
    if (!hit) input_error("{}: unknown argument '{}' (see hgbench {} --help)", cmd, args[i], cmd);
    const std::string& key = hit->names[0];
    if (!hit->takes_value) {
      o.flags[key] = true;
      continue;
    }
    if (i + 1 >= args.size()) input_error("{}: {} needs a value", cmd, args[i]);
    if (!hit->repeatable && o.values.count(key)) input_error("{}: {} given twice", cmd, args[i]);
    o.values[key].push_back(args[++i]);
  }
  return o;
}

template <typename T>
T number(const Options& o, const std::string& cmd, const std::string& key, T dflt) {
  auto it = o.values.find(key);
  if (it == o.values.end()) return dflt;
  const std::string& s = it->second[0];
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) input_error("{}: {} '{}' is not a valid number", cmd, key, s);
  return v;
}

std::string str(const Options& o, const std::string& key, const std::string& dflt) {
  auto it = o.values.find(key);
  return it == o.values.end() ? dflt : it->second[0];
}

// "123", "64MiB", "2GiB", "1.5GB" → bytes.
int64_t parse_bytes(const std::string& s, const std::string& what) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (...) {
    input_error("{} '{}' is not a size (e.g. 2GiB, 512MiB, 1e9)", what, s);
  }
  const std::string unit = s.substr(end);
  double mul = 1;
  if (unit == "" || unit == "B") mul = 1;
  else if (unit == "KiB") mul = 1024.0;
  else if (unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else input_error("{} '{}': unknown unit '{}' (expected B, KiB, MiB, GiB, KB, MB, GB)", what, s, unit);
  if (!(v > 0)) input_error("{} '{}' must be positive", what, s);
  return int64_t(v * mul);
}

LoadOptions load_options(const Options& o, const std::string& cmd) {
  LoadOptions lo;
  if (o.values.count("--weights")) {
    DType t;
    if (!parse_dtype(str(o, "--weights", ""), &t))
      input_error("{}: --weights '{}' (expected f32, f16 or bf16)", cmd, str(o, "--weights", ""));
    lo.weight_dtype = t;
  }
  return lo;
}

constexpr const char* kGenerateHelp = R"(usage: hgbench generate --model M [--prompt TEXT]... [-n N] [options]

Loads a model and generates text; prints each sequence's text, then prefill and decode tokens/s.

  --model M        GGUF file, Hugging Face directory, llama2.c .bin (?tokenizer=PATH), or
                   synthetic:<preset>[?layers=N&dtype=f16|bf16&seed=S] (see `hgbench models`)
  --prompt TEXT    prompt text (repeat for a batch of different prompts; default: BOS only)
  --prompt-tokens N  instead of text: BOS + N−1 token ids drawn uniformly (seeded by --seed), for
                   long-context runs on synthetic models
  -n N             tokens to generate per sequence (default 32)
  --batch B        run B copies of each prompt (default 1)
  --greedy         argmax decoding (default unless --temp/--top-k/--top-p are given)
  --temp T         sampling temperature (default 1.0 when sampling)
  --top-k K        keep the K most likely tokens (0: all)
  --top-p P        nucleus sampling mass (1.0: all)
  --seed S         sampling seed (default 0); sequence b uses stream b
  --threads T      CPU threads (default: all hardware threads)
  --backend NAME   cpu (default), ref (scalar oracle), cuda (device 0; strategy full, F32 KV),
                   null (every kernel a no-op: harness overhead only)
  --device NAME    cpu (default: no accelerator role), emulated (host-emulated accelerator: the
                   CPU backend on its own worker thread with a capacity-limited gpu tier), cuda
                   (weights, activations and the accelerator's KV in GPU memory, F32 KV; the
                   strategies full, flexgen, moe_lightning and hybridgen), auto (cuda when a
                   device exists, else emulated)
  --gpu-memory B   capacity of the accelerator's gpu tier, e.g. 2GiB (default: all it has)
  --clock C        measured (default) or modeled:<platform> (experiments/platforms/<platform>.yaml
                   or a path): also prints modeled prefill/decode tokens/s from the event log
                   (needs an accelerator device: emulated or cuda)
  --strategy NAME  KV strategy (default full; see `hgbench strategies`)
  --set S.P=V      set parameter P of strategy S (repeatable), e.g. --set flexgen.overlap=false
  --step-stats     print one line per decode step: the strategy's record (K, mode, bytes, …)
  --weights TYPE   engine weight type f32, f16 or bf16 (default: the file's F16/BF16, else f32)
  --ignore-eos     keep generating after EOS
  --ids            also print the generated token ids
  --quiet          print only the timing line
)";

constexpr const char* kInfoHelp = R"(usage: hgbench info --model M [--weights f32|f16|bf16]

Prints architecture, shapes, weight type, parameter count and tokenizer of a model.
)";

}  // namespace

// `CMD --help` / `CMD -h`: prints the command's help text.
bool asked_for_help(const std::vector<std::string>& args, const char* help) {
  if (args.empty() || (args[0] != "--help" && args[0] != "-h")) return false;
  fmt::print("{}", help);
  return true;
}

void print_usage() {
  fmt::print(R"(hgbench — long-context LLM decoding under KV-cache pressure

usage: hgbench FILE.yaml [--set K=V]… [--list] [--resume DIR] [--shard I/N]   (run an experiment)
       hgbench <command> [options]     (hgbench <command> --help for details)

commands:
  FILE.yaml    run an experiment file (experiments/*.yaml): rows.jsonl, summary.csv, table
  validate     check an experiment file without running it
  merge        join shard result directories into one result set
  generate     generate text with a model and report prefill/decode tokens/s
  info         print a model's architecture, shapes, dtype, parameters and tokenizer
  models       list model formats and synthetic presets
  strategies   list KV strategies
  calibrate    measure this machine and write the `this-machine` platform profile
  bench        decode tok/s at given context lengths and prefill tok/s, against the bandwidth limit
  export       write a model (e.g. synthetic:llama-3.2-1b?dtype=f16) as a GGUF file llama.cpp loads
)");
}

// --set STRATEGY.PARAM=VALUE options, per strategy; each must name one of `strategies`.
std::map<std::string, std::map<std::string, std::string>> strategy_sets(const Options& o, const std::string& cmd,
                                                                        const std::vector<std::string>& strategies) {
  std::map<std::string, std::map<std::string, std::string>> sets;
  if (!o.values.count("--set")) return sets;
  for (auto& kv : o.values.at("--set")) {
    const size_t dot = kv.find('.'), eq = kv.find('=');
    if (dot == std::string::npos || eq == std::string::npos || eq < dot)
      input_error("{}: --set '{}' must be STRATEGY.PARAM=VALUE", cmd, kv);
    const std::string sn = kv.substr(0, dot);
    if (std::find(strategies.begin(), strategies.end(), sn) == strategies.end())
      input_error("{}: --set '{}' names strategy '{}', which --strategy does not name", cmd, kv, sn);
    sets[sn][kv.substr(dot + 1, eq - dot - 1)] = kv.substr(eq + 1);
  }
  return sets;
}

int cmd_generate(const std::vector<std::string>& args) {
  const std::string cmd = "generate";
  if (asked_for_help(args, kGenerateHelp)) return 0;
  const Options o = parse(cmd, args,
                          {{{"--model", "-m"}, true}, {{"--prompt", "-p"}, true, true}, {{"-n", "--n-predict"}, true},
                           {{"--batch", "-b"}, true}, {{"--greedy"}, false}, {{"--temp"}, true}, {{"--top-k"}, true},
                           {{"--top-p"}, true}, {{"--seed"}, true}, {{"--threads", "-t"}, true},
                           {{"--backend"}, true}, {{"--strategy"}, true}, {{"--weights"}, true},
                           {{"--ignore-eos"}, false}, {{"--ids"}, false}, {{"--quiet"}, false},
                           {{"--device"}, true}, {{"--gpu-memory"}, true}, {{"--clock"}, true},
                           {{"--set"}, true, true}, {{"--step-stats"}, false}, {{"--prompt-tokens"}, true}});
  if (!o.values.count("--model")) input_error("generate: --model is required (see hgbench generate --help)");
  const int threads = number<int>(o, cmd, "--threads", hardware_threads());
  if (threads <= 0) input_error("generate: --threads must be positive");
  set_num_threads(threads);
  const int batch = number<int>(o, cmd, "--batch", 1);
  if (batch <= 0) input_error("generate: --batch must be positive");
  GenerateOptions go;
  go.n_new = number<int>(o, cmd, "-n", 32);
  if (go.n_new < 0) input_error("generate: -n must be non-negative");
  go.stop_at_eos = !o.flags.count("--ignore-eos");
  const bool sampling = o.values.count("--temp") || o.values.count("--top-k") || o.values.count("--top-p");
  go.sampler.greedy = o.flags.count("--greedy") || !sampling;
  go.sampler.temperature = number<float>(o, cmd, "--temp", 1.0f);
  go.sampler.top_k = number<int>(o, cmd, "--top-k", 0);
  go.sampler.top_p = number<float>(o, cmd, "--top-p", 1.0f);
  go.sampler.seed = number<uint64_t>(o, cmd, "--seed", 0);
  if (go.sampler.top_p <= 0 || go.sampler.top_p > 1) input_error("generate: --top-p must be in (0, 1]");
  if (go.sampler.top_k < 0) input_error("generate: --top-k must be non-negative");

  const std::string clock = str(o, "--clock", "measured");
  std::optional<PlatformProfile> profile;
  if (clock.rfind("modeled:", 0) == 0) {
    profile = load_platform(clock.substr(8), std::string(HG_SOURCE_DIR) + "/experiments/platforms");
  } else if (clock != "measured") {
    input_error("generate: --clock '{}' (expected measured or modeled:<platform>)", clock);
  }
  RuntimeConfig rc;
  rc.device = str(o, "--device", "cpu");
  if (o.values.count("--gpu-memory")) rc.tiers.gpu_memory_bytes = parse_bytes(str(o, "--gpu-memory", ""), "--gpu-memory");
  if (rc.device == "cpu" || o.values.count("--threads")) rc.accel_threads = threads;
  Runtime rt(rc);
  if (profile && rt.device() == DeviceKind::kCpu)
    input_error("generate: --clock {} needs an accelerator device (--device emulated or cuda): the cpu device logs no "
                "stages", clock);
  std::unique_ptr<Backend> own_backend;
  Backend* backend = &rt.accel_backend();
  if (o.values.count("--backend") || rt.device() == DeviceKind::kCpu) {
    own_backend = make_backend(str(o, "--backend", "cpu"));
    backend = own_backend.get();
  }
  const std::string sname = str(o, "--strategy", "full");
  const std::map<std::string, std::string> sets = strategy_sets(o, cmd, {sname})[sname];
  Model model = load_model(str(o, "--model", ""), load_options(o, cmd));
  auto strategy = make_strategy(sname, StrategyContext{*backend, &rt, &model}, sets);
  // The weights live on the accelerator: an emulated gpu tier too small for them is a result.
  if (rt.device() != DeviceKind::kCpu) {
    if (auto oom = rt.memory().ledger().reserve(Tier::kGpu, model.weight_bytes()))
      throw OutOfMemoryError("model weights: " + oom->message());
  }
  go.runtime = &rt;
  const Tokenizer& tok = *model.tokenizer;

  std::vector<std::string> texts = o.values.count("--prompt") ? o.values.at("--prompt") : std::vector<std::string>{""};
  std::vector<std::vector<int32_t>> prompts;
  if (o.values.count("--prompt-tokens")) {
    if (o.values.count("--prompt")) input_error("generate: give --prompt or --prompt-tokens, not both");
    const int n = number<int>(o, cmd, "--prompt-tokens", 0);
    if (n < 1) input_error("generate: --prompt-tokens must be >= 1");
    std::mt19937_64 g(go.sampler.seed);
    std::vector<int32_t> ids = {tok.bos_id >= 0 ? tok.bos_id : 0};
    for (int i = 1; i < n; ++i) ids.push_back(int32_t(3 + g() % uint64_t(model.hp.n_vocab - 3)));
    texts = {fmt::format("<{} random tokens>", n)};
    for (int b = 0; b < batch; ++b) prompts.push_back(ids);
  }
  for (auto& t : texts) {
    if (o.values.count("--prompt-tokens")) break;
    auto ids = tok.encode_prompt(t);
    if (ids.empty() && tok.bos_id >= 0) ids.push_back(tok.bos_id);
    if (ids.empty()) input_error("generate: prompt '{}' encodes to no tokens and the tokenizer has no BOS", t);
    for (int b = 0; b < batch; ++b) prompts.push_back(ids);
  }
  const bool quiet = o.flags.count("--quiet");
  const bool stream = !quiet && prompts.size() == 1 && !o.flags.count("--step-stats");
  int32_t prev = prompts[0].back();
  if (stream) {
    fmt::print("{}", texts[0]);
    std::fflush(stdout);
  }
  const bool step_stats = o.flags.count("--step-stats");
  int step_no = 0;
  TransferTotals seen;
  GenerateResult r = generate(model, *backend, *strategy, prompts, go, [&](int seq, int32_t id) {
    if (step_stats && seq == 0) {
      // The strategy's record plus the bytes this step moved per link (step 0 is the prefill).
      std::string line = fmt::format("step {}:", step_no++);
      for (auto& [k, v] : strategy->step_stats()) line += fmt::format(" {}={:g}", k, v);
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
  if (stream) fmt::print("\n");
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (!quiet && !stream) fmt::print("[{}] {}{}\n", b, texts[b / size_t(batch)], tok.decode(r.tokens[b]));
    if (o.flags.count("--ids")) {
      std::string ids;
      for (auto id : r.tokens[b]) ids += (ids.empty() ? "" : " ") + std::to_string(id);
      fmt::print("ids[{}]: {}\n", b, ids);
    }
  }
  std::fflush(stdout);  // the text first, then the timing line on stderr
  const double pf = r.prefill_s > 0 ? double(r.prefill_tokens) / r.prefill_s : 0;
  const double dc = r.decode_s > 0 ? double(r.decode_tokens) / r.decode_s : 0;
  fmt::print(stderr,
             "model {} | device {} | backend {} | strategy {} | weights {} | threads {} | batch {} | clock measured\n"
             "prefill: {} tokens in {:.3f} s ({:.1f} tok/s) | decode: {} tokens in {:.3f} s ({:.2f} tok/s)\n",
             model.source, rt.device_description(), backend->name(), strategy->name(), dtype_name(model.weight_dtype),
             rt.device() == DeviceKind::kCpu ? threads : rt.accel_threads(),
             prompts.size(), r.prefill_tokens, r.prefill_s, pf, r.decode_tokens, r.decode_s, dc);
  if (rt.device() != DeviceKind::kCpu) {
    // How well the strategy's stages overlapped, from the event log (measured).
    const PipelineSummary p = pipeline_summary(rt.log().snapshot());
    if (p.steps > 0)
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
    // Replay each step's stages on the profile; step 0 is the prefill.
    std::map<int64_t, std::vector<StageRecord>> by_step;
    for (auto& rec : rt.log().snapshot()) by_step[rec.step].push_back(rec);
    double m_prefill = 0, m_decode = 0;
    for (auto& [st, recs] : by_step) (st == 0 ? m_prefill : m_decode) += modeled_timing(recs, *profile).critical_path_s;
    fmt::print(stderr, "MODELED on {} ({}): prefill {:.1f} tok/s | decode {:.2f} tok/s  [modeled, not measured]\n",
               profile->name, profile->source, m_prefill > 0 ? double(r.prefill_tokens) / m_prefill : 0.0,
               m_decode > 0 ? double(r.decode_tokens) / m_decode : 0.0);
  }
  return 0;
}

int cmd_info(const std::vector<std::string>& args) {
  const std::string cmd = "info";
  if (asked_for_help(args, kInfoHelp)) return 0;
  const Options o = parse(cmd, args, {{{"--model", "-m"}, true}, {{"--weights"}, true}});
  if (!o.values.count("--model")) input_error("info: --model is required (see hgbench info --help)");
  Model m = load_model(str(o, "--model", ""), load_options(o, cmd));
  const HParams& hp = m.hp;
  fmt::print("model:          {}\n", m.source);
  fmt::print("format:         {}\n", m.format);
  fmt::print("architecture:   {}\n", hp.arch);
  fmt::print("layers (L):     {}\n", hp.n_layers);
  fmt::print("hidden:         {}\n", hp.d_model);
  fmt::print("heads (H):      {}\n", hp.n_heads);
  fmt::print("KV heads (H_kv):{}\n", hp.n_kv_heads);
  fmt::print("head dim (D):   {}\n", hp.head_dim);
  fmt::print("FFN:            {}\n", hp.d_ff);
  fmt::print("vocab (V):      {}\n", hp.n_vocab);
  fmt::print("context:        {}\n", hp.max_pos);
  fmt::print("norm:           {} (eps {:g})\n", m.traits.norm == NormKind::kRms ? "RMSNorm" : "LayerNorm", hp.norm_eps);
  if (m.traits.pos == PosKind::kRope)
    fmt::print("positions:      RoPE theta {:g}, {}{}{}\n", hp.rope_theta,
               hp.rope_style == RopeStyle::kHalf ? "rotate-half" : "interleaved",
               hp.rope_scaling.type.empty() ? "" : ", scaling " + hp.rope_scaling.type,
               m.rope_freq_factors.empty() ? "" : ", rope_freqs from file");
  else
    fmt::print("positions:      learned (offset {})\n", hp.pos_offset);
  fmt::print("ffn:            {}\n", m.traits.ffn == FfnKind::kSwiGlu ? "SwiGLU" : "ReLU");
  fmt::print("biases:         qkv {} / out {} / ffn {}\n", m.traits.qkv_bias, m.traits.o_bias, m.traits.ffn_bias);
  fmt::print("tied embedding: {}\n", hp.tie_embeddings);
  fmt::print("weights:        {} in the file, {} in the engine\n", m.source_dtype, dtype_name(m.weight_dtype));
  fmt::print("parameters:     {} ({:.3f} B)\n", m.n_params(), double(m.n_params()) / 1e9);
  fmt::print("weight bytes:   {} ({:.1f} MiB)\n", m.weight_bytes(), double(m.weight_bytes()) / (1 << 20));
  fmt::print("KV bytes/token: {} (F32 cache; K and V, all layers)\n",
             int64_t(2) * hp.n_layers * hp.n_kv_heads * hp.head_dim * 4);
  const Tokenizer& t = *m.tokenizer;
  fmt::print("tokenizer:      {}, {} tokens, bos {}, eos {}, add_bos {}\n", t.kind(), t.n_vocab(), t.bos_id, t.eos_id,
             t.add_bos);
  return 0;
}

constexpr const char* kBenchHelp =
    R"(usage: hgbench bench --model M [--context 128,4096,16384] [--threads 1,2] [--steps N]
                     [--kv f32|f16|bf16] [--prefill 512] [--weights f32|f16|bf16] [--backend cpu|cuda]
       hgbench bench --model M --strategy S1,S2,… [--device emulated|cuda|auto] [--set S.P=V]…
                     [--context …] [--steps N] [--clock modeled:<platform>]

Decode tokens/s at each context length (the KV cache, F16 by default, is filled with seeded random
rows: its values do not change the cost), prefill tokens/s for one prompt, and the ratio to the
bandwidth limit (weight bytes + KV bytes per token). Each decode step is paired with a read pass
right after it (same threads, a 512 MiB buffer read in turn); the ratio is the median over steps
of the step's bytes/s over its pass's GB/s, with the range beside it. The pass reads eight
prefetched streams per thread, the best read of the machine; `1-stream` is the same ratio against
a second pass of one plain stream per thread (a weaker reference;
host only). Then the harness overhead:
the same decode loop with the null backend and the null strategy, as a share of the first
context's step. The `full` strategy. With --backend cuda (F32 KV) the weights, activations and KV
are in GPU memory and the paired pass is a copy within GPU memory (read + write bytes), so the
limit is the HBM floor. Measured, never modeled.

With --strategy S1,S2,… (e.g. flexgen,moe_lightning,hybridgen) it measures those KV strategies
instead, on the runtime's accelerator (--device emulated|cuda|auto, default auto; --set S.P=V as
for generate; F32 KV): per strategy and context, decode tok/s after two warm-up steps, the bytes
each step moved over the link (host→device and device→host) and their rate, and the pipeline
from the event log (accelerator, CPU and transfer busy time per step, how much of the CPU stage
ran while the accelerator was busy, the critical path against the serial sum). HybridGen's last
step record (K, selection mode, tokens per side) follows its row. --clock modeled:<platform> also
replays the timed steps' stages on experiments/platforms/<platform>.yaml (labelled MODELED).
The cache is filled through each strategy's own append() with seeded rows, as a prompt would be;
a strategy whose decode depends on the prompt's attention (InfiniGen's calibration) is filled by a
real prefill of seeded token ids instead, which takes longer at long contexts. Eviction policies
filled through append() start decode with zero scores (the prompt's are not computed): the same
work per step, a different choice of tokens.
)";

std::vector<int> int_list(const std::string& s, const std::string& what) {
  std::vector<int> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t c = s.find(',', pos);
    const std::string x = s.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    int n = 0;
    auto [p, ec] = std::from_chars(x.data(), x.data() + x.size(), n);
    if (ec != std::errc() || p != x.data() + x.size() || n <= 0) input_error("bench: {} '{}' is not a list of positive integers", what, s);
    v.push_back(n);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return v;
}

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

// Seconds of each of `steps` greedy decode steps of batch 1 at positions pos0 + 1 … pos0 + steps,
// after one warm-up step at pos0 (primitive creation, first touch). after_step (untimed) runs
// after each timed step: the paired reference pass.
std::vector<double> decode_step_seconds(Decoder& dec, int pos0, int steps, const std::function<void()>& after_step = {}) {
  std::vector<float> logits(size_t(dec.model().hp.n_vocab));
  int32_t tok = 5;
  const int32_t zero = 0;
  auto step = [&](int pos) {
    const TokenRow r{0, pos};
    dec.forward(std::span<const int32_t>(&tok, 1), std::span<const TokenRow>(&r, 1), std::span<const int32_t>(&zero, 1),
                logits.data());
    tok = argmax(logits);
  };
  step(pos0);
  std::vector<double> secs;
  for (int i = 1; i <= steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step(pos0 + i);
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (after_step) after_step();
  }
  return secs;
}

// The kernel's transparent-huge-page mode (the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled), or "unknown".
std::string thp_mode() {
  std::string line;
  std::getline(std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"), line);
  const auto a = line.find('['), b = line.find(']');
  return a != std::string::npos && b > a ? line.substr(a + 1, b - a - 1) : "unknown";
}

// Seeded K/V rows for filling a cache in `bench`: 512 rows [512, H_kv, D] of K and of V in the
// backend's memory (append() takes rows there); fill() appends them at positions [0, n) of every
// layer, position-major (as prefill chunks arrive). Their values do not change the cost.
struct SeededRows {
  SeededRows(Backend& be, const HParams& hp, std::mt19937_64& rng)
      : layers(hp.n_layers), k(be, size_t(512) * hp.n_kv_heads * hp.head_dim), v(be, k.size()) {
    std::vector<float> h(k.size());
    std::uniform_real_distribution<float> u(-1, 1);
    for (BackendArray<float>* a : {&k, &v}) {
      for (auto& x : h) x = u(rng);
      be.upload(a->data(), h.data(), h.size() * 4);
    }
  }
  void fill(KvStrategy& kv, int n) const {
    for (int p0 = 0; p0 < n; p0 += 512) {
      std::vector<TokenRow> rows;
      for (int p = p0; p < std::min(n, p0 + 512); ++p) rows.push_back({0, p});
      for (int l = 0; l < layers; ++l) kv.append(l, rows, k.data(), v.data());
    }
  }
  int layers;
  BackendArray<float> k, v;
};

// `bench --strategy`: decode steps of each KV strategy on the runtime's accelerator after the
// cache is filled with seeded rows through the strategy's own append() (so each keeps its tokens
// where it keeps them: dram, far, the accelerator's ring), as a prompt of n tokens would.
int bench_strategies(const Options& o, const Model& model, const std::vector<int>& contexts, int steps) {
  const std::string cmd = "bench";
  const HParams& hp = model.hp;
  std::vector<std::string> names;
  for (size_t pos = 0;;) {
    const std::string list = str(o, "--strategy", "");
    const size_t c = list.find(',', pos);
    names.push_back(list.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  auto sets = strategy_sets(o, cmd, names);
  for (auto& n : names) strategy_info(n);  // unknown names fail before any work
  std::optional<PlatformProfile> profile;
  if (const std::string clock = str(o, "--clock", "measured"); clock.rfind("modeled:", 0) == 0)
    profile = load_platform(clock.substr(8), std::string(HG_SOURCE_DIR) + "/experiments/platforms");
  else if (clock != "measured")
    input_error("bench: --clock '{}' (expected measured or modeled:<platform>)", clock);
  RuntimeConfig rc;
  rc.device = str(o, "--device", "auto");
  if (rc.device == "cpu")
    input_error("bench: --strategy needs an accelerator device (--device emulated, cuda or auto)");
  Runtime rt(rc);
  Backend& be = rt.accel_backend();
  fmt::print("model {} | weights {} | KV cache f32 ({:.0f} B per cached token) | device {} | measured\n",
             model.source, dtype_name(model.weight_dtype),
             2.0 * hp.n_layers * hp.n_kv_heads * hp.head_dim * 4, rt.device_description());
  fmt::print("{:<14} {:>8} {:>9} {:>9} {:>11} {:>10} {:>10} {:>9} {:>8} {:>8} {:>8} {:>7} {:>9}\n",
             "strategy", "context", "tok/s", "step ms", "range ms", "h2d MB", "d2h MB", "link GB/s",
             "accel ms", "cpu ms", "xfer ms", "hidden", "crit/sum");
  std::mt19937_64 rng(1);
  const SeededRows seeded(be, hp, rng);
  std::vector<float> logits(size_t(hp.n_vocab));
  for (const auto& name : names) {
    for (int n : contexts) {
      auto kv = make_strategy(name, StrategyContext{be, &rt, &model}, sets[name]);
      Decoder dec(model, be, *kv, 512);
      const int32_t cap = n + steps + 3, pl = n;
      int32_t tok = 5;
      const int32_t zero = 0;
      rt.log().set_step(-1);
      // A strategy whose decode depends on the prompt's attention gets a real prefill of seeded
      // token ids (O(n²) attention: slower to set up, the same decode steps after it).
      const bool prefill = kv->needs_prompt_attention();
      rt.accel()
          .submit("fill", {}, {},
                  [&] {
                    kv->begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1),
                              std::span<const int32_t>(&pl, 1));
                    if (prefill) {
                      std::vector<int32_t> ids(static_cast<size_t>(n));
                      std::vector<TokenRow> rows(static_cast<size_t>(n));
                      for (int p = 0; p < n; ++p) {
                        ids[size_t(p)] = int32_t(3 + rng() % uint64_t(std::max(1, int(hp.n_vocab) - 3)));
                        rows[size_t(p)] = {0, p};
                      }
                      dec.forward(ids, rows, {}, nullptr);
                    } else {
                      seeded.fill(*kv, n);
                    }
                    kv->end_step();
                    be.synchronize();
                  })
          .wait();
      auto step = [&](int pos) {
        const TokenRow r{0, pos};
        rt.accel()
            .submit("decode", forward_work(model, std::span<const TokenRow>(&r, 1)), {},
                    [&] {
                      dec.forward(std::span<const int32_t>(&tok, 1), std::span<const TokenRow>(&r, 1),
                                  std::span<const int32_t>(&zero, 1), logits.data());
                    })
            .wait();
        tok = argmax(logits);
      };
      step(n), step(n + 1);  // warm-up: first touch, kernel choice, the scheduler's first moves
      rt.log().clear();
      const TransferTotals before = rt.transfers().totals();
      std::vector<double> secs;
      for (int i = 0; i < steps; ++i) {
        rt.log().set_step(i + 1);
        const auto t0 = std::chrono::steady_clock::now();
        step(n + 2 + i);
        secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      const TransferTotals after = rt.transfers().totals();
      auto moved = [&](bool to_gpu) {
        int64_t b = 0;
        for (Tier t : {Tier::kDram, Tier::kFar})
          b += to_gpu ? after.bytes_between(t, Tier::kGpu) - before.bytes_between(t, Tier::kGpu)
                      : after.bytes_between(Tier::kGpu, t) - before.bytes_between(Tier::kGpu, t);
        return double(b) / steps;
      };
      const double med = median(secs), h2d = moved(true), d2h = moved(false);
      const PipelineSummary ps = pipeline_summary(rt.log().snapshot());
      fmt::print(
          "{:<14} {:>8} {:>9.2f} {:>9.2f} {:>5.1f}-{:<5.1f} {:>10.2f} {:>10.2f} {:>9.1f} {:>8.2f} {:>8.2f} "
          "{:>8.2f} "
          "{:>6.0f}% {:>9.2f}\n",
          name, n, 1.0 / med, med * 1e3, *std::min_element(secs.begin(), secs.end()) * 1e3,
          *std::max_element(secs.begin(), secs.end()) * 1e3, h2d / 1e6, d2h / 1e6, (h2d + d2h) / med / 1e9,
          ps.accel_s * 1e3, ps.cpu_s * 1e3, ps.transfer_s * 1e3, ps.hidden_frac * 100,
          ps.serial_s > 0 ? ps.critical_s / ps.serial_s : 0.0);
      if (profile) {
        // The same steps' stages replayed on the platform profile (their work, their dependencies).
        std::map<int64_t, std::vector<StageRecord>> by_step;
        for (auto& rec : rt.log().snapshot()) by_step[rec.step].push_back(rec);
        double modeled = 0;
        for (auto& [st, recs] : by_step) modeled += modeled_timing(recs, *profile).critical_path_s;
        fmt::print("    MODELED on {}: {:.2f} tok/s ({:.2f} ms per step)  [modeled, not measured]\n", profile->name,
                   steps / modeled, modeled / steps * 1e3);
      }
      if (prefill)
        fmt::print("    filled by a prefill of {} tokens ({}'s decode depends on the prompt's attention)\n", n,
                   name);
      const auto st = kv->step_stats();
      if (!st.empty()) {
        std::string line = "    last step:";
        for (auto& [key, val] : st) line += fmt::format(" {}={:g}", key, val);
        fmt::print("{}\n", line);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

int cmd_bench(const std::vector<std::string>& args) {
  const std::string cmd = "bench";
  if (asked_for_help(args, kBenchHelp)) return 0;
  const Options o = parse(cmd, args,
                          {{{"--model", "-m"}, true},
                           {{"--context"}, true},
                           {{"--threads"}, true},
                           {{"--steps"}, true},
                           {{"--kv"}, true},
                           {{"--prefill"}, true},
                           {{"--weights"}, true},
                           {{"--backend"}, true},
                           {{"--strategy"}, true},
                           {{"--device"}, true},
                           {{"--set"}, true, true}, {{"--clock"}, true}});
  if (!o.values.count("--model")) input_error("bench: --model is required (see hgbench bench --help)");
  const auto contexts = int_list(str(o, "--context", "128,4096,16384"), "--context");
  const auto threads = int_list(str(o, "--threads", "1,2"), "--threads");
  const int steps = number<int>(o, cmd, "--steps", 16);
  const int prefill = number<int>(o, cmd, "--prefill", 512);
  if (steps < 1 || prefill < 1) input_error("bench: --steps and --prefill must be positive");
  DType kv = DType::kF32;
  if (!parse_dtype(str(o, "--kv", "f16"), &kv)) input_error("bench: --kv '{}' (expected f32, f16 or bf16)", str(o, "--kv", ""));
  if (o.values.count("--strategy")) {
    for (const char* opt : {"--backend", "--threads", "--prefill"})
      if (o.values.count(opt))
        input_error("bench: {} is not used with --strategy (the runtime's accelerator runs)", opt);
    if (str(o, "--kv", "f32") != "f32")
      input_error("bench: --strategy runs F32 KV caches (give --kv f32 or leave it out)");
    Model model = load_model(str(o, "--model", ""), load_options(o, cmd));
    return bench_strategies(o, model, contexts, steps);
  }
  if (o.values.count("--device") || o.values.count("--set") || o.values.count("--clock"))
    input_error("bench: --device, --set and --clock go with --strategy (without it: --backend)");
  Model model = load_model(str(o, "--model", ""), load_options(o, cmd));
  const HParams& hp = model.hp;
  auto be = make_backend(str(o, "--backend", "cpu"));
  const bool device = !be->host_memory();
  if (device && kv != DType::kF32) input_error("bench: --backend {} reads F32 KV caches (give --kv f32)", be->name());
  // Weights read per decode token: every matrix once; an untied embedding only as one row.
  const int64_t embd = hp.tie_embeddings ? 0 : int64_t(model[GlobalSlot::kTokEmbd].bytes());
  const double weight_bytes = double(model.weight_bytes() - embd);
  const double kv_per_token = 2.0 * hp.n_layers * hp.n_kv_heads * hp.head_dim * double(dtype_size(kv));
  fmt::print("model {} | weights {} ({:.1f} MB read per token) | KV cache {} ({:.0f} B per cached token) | measured\n",
             model.source, dtype_name(model.weight_dtype), weight_bytes / 1e6, dtype_name(kv), kv_per_token);
  fmt::print("host memory: 2 MiB pages {} (transparent huge pages: {})\n",
             huge_pages_advised() ? "advised" : "not advised (HG_NO_HUGE_PAGES)", thp_mode());
  fmt::print("{:>8} {:>7} {:>12} {:>10} {:>14} {:>12} {:>7} {:>11} {:>9}\n", "context", "threads", "decode tok/s",
             "read GB/s", "MB per token", "limit tok/s", "ratio", "ratio range", "1-stream");
  std::mt19937_64 rng(1);
  StepReference reference(*be);
  for (int t : threads) {
    set_num_threads(t);
    double first_step_s = 0;
    int first_context = 0;
    for (int n : contexts) {
      FullStrategy kvs(*be, nullptr, kv);
      Decoder dec(model, *be, kvs, 512);
      const int32_t cap = n + steps + 1, pl = n;
      kvs.begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
      // Fill positions [0, n) of every layer with seeded rows.
      SeededRows(*be, hp, rng).fill(kvs, n);
      // Each step is paired with a reference pass right after it: the ratio is the median over
      // steps of (bytes / step time) / that pass's bandwidth, so the step and its reference see
      // the same moment of a shared machine. Bytes grow by one KV row per step.
      const double bytes = weight_bytes + kv_per_token * (n + steps / 2.0);
      std::vector<double> ref, ref1;
      const auto secs = decode_step_seconds(dec, n, steps, [&] {
        ref.push_back(reference.pass_gbs(int64_t(bytes)));
        ref1.push_back(reference.pass_gbs(int64_t(bytes), ReadPass::kOneStream));
      });
      PairedRatio pr, pr1;
      for (size_t i = 0; i < secs.size(); ++i) {
        pr.add(bytes / secs[i] / 1e9, ref[i]);
        if (ref1[i] > 0) pr1.add(bytes / secs[i] / 1e9, ref1[i]);
      }
      const auto ratios = pr.ratios();
      const double tps = 1.0 / median(secs), bw = pr.ref_gbs();
      if (first_step_s == 0) first_step_s = 1.0 / tps, first_context = n;
      const double limit = bw * 1e9 / bytes;
      fmt::print("{:>8} {:>7} {:>12.2f} {:>10.1f} {:>14.1f} {:>12.2f} {:>7.2f} {:>5.2f}-{:<5.2f} {:>9}\n", n, t, tps,
                 bw, bytes / 1e6, limit, pr.ratio(), *std::min_element(ratios.begin(), ratios.end()),
                 *std::max_element(ratios.begin(), ratios.end()),
                 pr1.size() ? fmt::format("{:.2f}", pr1.ratio()) : std::string("-"));
    }
    {
      // Harness overhead: the same decode loop with every kernel a no-op (null backend) and no KV
      // (null strategy): what remains is the engine's own per-step work.
      auto nb = make_null_backend();
      NullStrategy ns;
      Decoder dec(model, *nb, ns, 512);
      const int32_t cap = 1 << 20, pl = 0;
      ns.begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
      const double s = median(decode_step_seconds(dec, 0, std::max(64, steps * 8)));
      fmt::print("harness overhead: {:.1f} us per decode step (null backend, null strategy) = {:.2f}% of the measured "
                 "step at context {}\n",
                 s * 1e6, 100.0 * s / first_step_s, first_context);
    }
    // Prefill: one prompt of `prefill` tokens, as a server would run a request: the decoder and
    // its KV store are reused from a warm-up request of the same size (as llama-bench reuses its
    // context), so the figure is the forward pass, not first-touch page faults.
    FullStrategy kvs(*be, nullptr, kv);
    Decoder dec(model, *be, kvs, 512);
    std::vector<int32_t> prompt(static_cast<size_t>(prefill));
    for (auto& x : prompt) x = int32_t(3 + rng() % uint64_t(hp.n_vocab - 3));
    std::vector<TokenRow> prow;
    for (int p = 0; p < prefill; ++p) prow.push_back({0, p});
    const int32_t pcap = prefill + 1, plen = prefill, last = prefill - 1;
    std::vector<float> plogits(size_t(hp.n_vocab));
    std::vector<double> pf_s;
    for (int rep = 0; rep < 4; ++rep) {  // a warm-up, then the median of three
      kvs.begin(dec.kv_shape(), std::span<const int32_t>(&pcap, 1), std::span<const int32_t>(&plen, 1));
      const auto t0 = std::chrono::steady_clock::now();
      dec.forward(prompt, prow, std::span<const int32_t>(&last, 1), plogits.data());
      if (rep > 0) pf_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(pf_s.begin(), pf_s.end());
    fmt::print("prefill {} tokens, {} thread{}: {:.1f} tok/s (median of 3; {:.1f}-{:.1f})\n", prefill, t, t == 1 ? "" : "s",
               prefill / pf_s[1], prefill / pf_s[2], prefill / pf_s[0]);
  }
  return 0;
}

constexpr const char* kExportHelp = R"(usage: hgbench export --model M --out FILE.gguf [--weights f32|f16|bf16]

Writes a Llama-architecture model as GGUF v3, for running the same bytes in hgbench and in
llama.cpp (e.g. `llama-bench -m FILE.gguf`). Matrices keep the model's weight type (or --weights);
q/k rows are permuted to llama.cpp's interleaved RoPE and Llama-3 scaling becomes rope_freqs.weight.
The vocabulary is generated (<unk>, <s>, </s>, 256 byte pieces, placeholders), so text is
meaningless: this is for speed comparisons with random (`synthetic:`) weights.
)";

int cmd_export(const std::vector<std::string>& args) {
  const std::string cmd = "export";
  if (asked_for_help(args, kExportHelp)) return 0;
  const Options o = parse(cmd, args, {{{"--model", "-m"}, true}, {{"--out", "-o"}, true}, {{"--weights"}, true}});
  if (!o.values.count("--model") || !o.values.count("--out"))
    input_error("export: --model and --out are required (see hgbench export --help)");
  const Model model = load_model(str(o, "--model", ""), load_options(o, cmd));
  const std::string out = str(o, "--out", "");
  write_gguf(model, out);
  fmt::print("wrote {} ({} weights, {} layers, {:.1f} MB)\n", out, dtype_name(model.weight_dtype), model.hp.n_layers,
             double(std::filesystem::file_size(out)) / 1e6);
  return 0;
}

constexpr const char* kCalibrateHelp = R"(usage: hgbench calibrate [--out PATH] [--seconds S]

Measures this machine (dram and far read bandwidth, the extra cost of a random 512 B row over a
stream on each, dram→far copy bandwidth, SGEMM FLOP/s; GPU rates when a device exists) and
writes the platform profile `this-machine` used by
`clock: modeled:this-machine` (default PATH: experiments/platforms/this-machine.yaml).
)";

int cmd_calibrate(const std::vector<std::string>& args) {
  const std::string cmd = "calibrate";
  if (asked_for_help(args, kCalibrateHelp)) return 0;
  const Options o = parse(cmd, args, {{{"--out"}, true}, {{"--seconds"}, true}});
  CalibrateOptions co;
  co.seconds_per_measure = number<double>(o, cmd, "--seconds", 0.5);
  if (!(co.seconds_per_measure > 0)) input_error("calibrate: --seconds must be positive");
  const std::string out = str(o, "--out", std::string(HG_SOURCE_DIR) + "/experiments/platforms/this-machine.yaml");
  std::string notes;
  PlatformProfile p = calibrate(co, &notes);
  save_platform(p, out, "Written by `hgbench calibrate` (measured on this machine): " + notes);
  fmt::print("{}\nwrote {}\n", notes, out);
  return 0;
}

int cmd_strategies(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] != "--help" && args[0] != "-h") input_error("strategies: takes no arguments");
  for (auto& s : strategies()) {
    fmt::print("{:<16} {}\n", s.name, s.doc);
    for (auto& p : s.params) {
      std::string type = param_type_name(p.type);
      if (p.type == ParamSpec::Type::kEnum) {
        type = "";
        for (auto& c : p.choices) type += (type.empty() ? "" : "|") + c;
      }
      fmt::print("    {:<20} {:<22} default {:<8} {}{}\n", p.name, type, p.dflt, p.doc,
                 p.unit.empty() ? "" : " [" + p.unit + "]");
    }
  }
  return 0;
}

int cmd_models(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] != "--help" && args[0] != "-h") input_error("models: takes no arguments");
  fmt::print("formats:\n");
  for (auto& f : model_formats().all()) fmt::print("  {:<10} {}\n", f.name, f.doc);
  fmt::print("synthetic presets (synthetic:<name>):\n");
  for (auto& p : synthetic_presets())
    fmt::print("  {:<14} {:<6} L={:<3} d={:<5} H={:<3} H_kv={:<3} D={:<4} ff={:<6} V={}\n", p.name, p.arch,
               p.hp.n_layers, p.hp.d_model, p.hp.n_heads, p.hp.n_kv_heads, p.hp.head_dim, p.hp.d_ff, p.hp.n_vocab);
  return 0;
}

}  // namespace hg::cli
