// Llama (1/2/3.x): RMSNorm, RoPE (Llama-3 rope_scaling), GQA, SwiGLU, no biases.
#include "engine/arch/arch.h"
#include "engine/core/error.h"

namespace hg {
namespace {

void parse_config(const nlohmann::json& cfg, const std::string& where, HParams* hp) {
  hp->d_model = json_int(cfg, "hidden_size", where);
  hp->n_layers = json_int(cfg, "num_hidden_layers", where);
  hp->n_heads = json_int(cfg, "num_attention_heads", where);
  hp->n_kv_heads = json_int_or(cfg, "num_key_value_heads", hp->n_heads, where);
  hp->d_ff = json_int(cfg, "intermediate_size", where);
  hp->n_vocab = json_int(cfg, "vocab_size", where);
  hp->max_pos = json_int_or(cfg, "max_position_embeddings", 2048, where);
  if (hp->n_heads <= 0) input_error("{}: field 'num_attention_heads' must be positive", where);
  hp->head_dim = json_int_or(cfg, "head_dim", hp->d_model / hp->n_heads, where);
  hp->norm_eps = float(json_num_or(cfg, "rms_norm_eps", 1e-6, where));
  hp->rope_theta = rope_theta_checked(json_num_or(cfg, "rope_theta", 10000.0, where), where, "field 'rope_theta'");
  hp->tie_embeddings = json_bool_or(cfg, "tie_word_embeddings", false, where);
  if (json_bool_or(cfg, "attention_bias", false, where) || json_bool_or(cfg, "mlp_bias", false, where))
    input_error("{}: attention_bias/mlp_bias true is not supported for llama", where);
  const std::string act = json_string_or(cfg, "hidden_act", "silu", where);
  if (act != "silu") input_error("{}: field 'hidden_act' is '{}', expected silu", where, act);
  parse_rope_scaling(cfg, where, &hp->rope_scaling);
  hp->rope_style = RopeStyle::kHalf;
}

std::string hf_name(Slot s, int layer) {
  const std::string b = "model.layers." + std::to_string(layer) + ".";
  switch (s) {
    case Slot::kAttnNorm: return b + "input_layernorm.weight";
    case Slot::kWq: return b + "self_attn.q_proj.weight";
    case Slot::kBq: return b + "self_attn.q_proj.bias";
    case Slot::kWk: return b + "self_attn.k_proj.weight";
    case Slot::kBk: return b + "self_attn.k_proj.bias";
    case Slot::kWv: return b + "self_attn.v_proj.weight";
    case Slot::kBv: return b + "self_attn.v_proj.bias";
    case Slot::kWo: return b + "self_attn.o_proj.weight";
    case Slot::kFfnNorm: return b + "post_attention_layernorm.weight";
    case Slot::kWGate: return b + "mlp.gate_proj.weight";
    case Slot::kWUp: return b + "mlp.up_proj.weight";
    case Slot::kWDown: return b + "mlp.down_proj.weight";
    default: return "";
  }
}

std::string hf_global_name(GlobalSlot s) {
  switch (s) {
    case GlobalSlot::kTokEmbd: return "model.embed_tokens.weight";
    case GlobalSlot::kOutNorm: return "model.norm.weight";
    case GlobalSlot::kOutput: return "lm_head.weight";
    default: return "";
  }
}

void parse_gguf(const ModelMetadata& f, HParams* hp) {
  parse_gguf_llama_family(f, hp);
  hp->rope_style = RopeStyle::kInterleaved;  // llama.cpp's converter undoes HF's q/k permutation
}

}  // namespace

// Shared with qwen2.cpp, which is llama plus q/k/v biases.
std::string llama_hf_name(Slot s, int layer) { return hf_name(s, layer); }
std::string llama_hf_global_name(GlobalSlot s) { return hf_global_name(s); }
void llama_parse_hf_config(const nlohmann::json& cfg, const std::string& where, HParams* hp) {
  parse_config(cfg, where, hp);
}

Architecture llama_architecture() {
  Architecture a;
  a.name = "llama";
  a.hf_classes = {"LlamaForCausalLM"};
  a.traits = ArchTraits{.norm = NormKind::kRms, .pos = PosKind::kRope, .ffn = FfnKind::kSwiGlu};
  a.parse_hf_config = parse_config;
  a.hf_name = hf_name;
  a.hf_global_name = hf_global_name;
  a.parse_gguf = parse_gguf;
  return a;
}

}  // namespace hg
