// `hgbench info`: a model's architecture, shapes, weight type, parameter count and tokenizer.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/core/cpu_features.h"
#include "engine/core/model.h"
#include "engine/core/process_memory.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg::cli {

int cmd_info(const std::vector<std::string>& args) {
  CLI::App app{"Prints architecture, shapes, weight type, parameter count and tokenizer of a model.", "info"};
  std::string model, weights;
  app.add_option("-m,--model", model, "GGUF file, Hugging Face directory, llama2.c .bin or synthetic:<preset>")->required();
  app.add_option("--weights", weights, "engine weight type f32, f16 or bf16 (default: the file's)");
  if (int rc = parse_cli(app, "info", args); rc >= 0) return rc;
  Model m = load_model(model, load_options(weights, "info"));
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
  const ProcessMemory mem = process_memory();
  fmt::print("loaded in:      {:.2f} s; process resident {:.1f} MiB (peak {:.1f} MiB)\n", m.load_seconds,
             double(mem.resident_bytes) / (1 << 20), double(mem.peak_resident_bytes) / (1 << 20));
  fmt::print("weights held:   {:.1f} MiB mapped from the file{}, {:.1f} MiB in own buffers (model option load=map|copy)\n",
             double(m.mapped_weight_bytes) / (1 << 20),
             m.unlocked_weight_bytes ? fmt::format(" ({:.1f} MiB not locked: RLIMIT_MEMLOCK)",
                                                   double(m.unlocked_weight_bytes) / (1 << 20))
                                     : std::string(),
             double(m.weight_bytes() - m.mapped_weight_bytes) / (1 << 20));
  fmt::print("CPU kernels:    {}, {} tuning (best on this CPU: {}; HG_CPU_ISA=portable|avx512|avx512_bf16 chooses)\n",
             cpu_isa_name(active_cpu_isa()), cpu_tuning_name(cpu_tuning()), cpu_isa_name(best_cpu_isa()));
  fmt::print("KV bytes/token: {} (F32 cache; K and V, all layers)\n",
             int64_t(2) * hp.n_layers * hp.n_kv_heads * hp.head_dim * 4);
  const Tokenizer& t = *m.tokenizer;
  fmt::print("tokenizer:      {}, {} tokens, bos {}, eos {}, add_bos {}\n", t.kind(), t.n_vocab(), t.bos_id, t.eos_id,
             t.add_bos);
  return 0;
}

}  // namespace hg::cli
