// OPT: pre-LayerNorm, learned positions (row = position + 2), ReLU FFN, biases everywhere, tied
// LM head. OPT-350m's projected embeddings (word_embed_proj_dim != hidden_size) are rejected.
#include "engine/arch/arch.h"
#include "engine/core/error.h"

namespace hg {
namespace {

void opt_parse_config(const nlohmann::json& cfg, const std::string& where, HParams* hp) {
  hp->d_model = json_int(cfg, "hidden_size", where);
  hp->n_layers = json_int(cfg, "num_hidden_layers", where);
  hp->n_heads = json_int(cfg, "num_attention_heads", where);
  hp->n_kv_heads = hp->n_heads;
  hp->d_ff = json_int(cfg, "ffn_dim", where);
  hp->n_vocab = json_int(cfg, "vocab_size", where);
  hp->max_pos = json_int(cfg, "max_position_embeddings", where);
  if (hp->n_heads <= 0) input_error("{}: field 'num_attention_heads' must be positive", where);
  hp->head_dim = hp->d_model / hp->n_heads;
  hp->norm_eps = 1e-5f;
  hp->pos_offset = 2;
  hp->tie_embeddings = json_bool_or(cfg, "tie_word_embeddings", true, where);
  const int proj = json_int_or(cfg, "word_embed_proj_dim", hp->d_model, where);
  if (proj != hp->d_model)
    input_error("{}: word_embed_proj_dim {} != hidden_size {} (projected embeddings, as in OPT-350m, "
                "are not supported)", where, proj, hp->d_model);
  if (!json_bool_or(cfg, "do_layer_norm_before", true, where))
    input_error("{}: do_layer_norm_before false (post-LayerNorm OPT) is not supported", where);
  const std::string act = json_string_or(cfg, "activation_function", "relu", where);
  if (act != "relu") input_error("{}: field 'activation_function' is '{}', expected relu", where, act);
  if (!json_bool_or(cfg, "enable_bias", true, where))
    input_error("{}: enable_bias false is not supported", where);
}

std::string opt_hf_name(Slot s, int layer) {
  const std::string b = "model.decoder.layers." + std::to_string(layer) + ".";
  switch (s) {
    case Slot::kAttnNorm: return b + "self_attn_layer_norm.weight";
    case Slot::kAttnNormB: return b + "self_attn_layer_norm.bias";
    case Slot::kWq: return b + "self_attn.q_proj.weight";
    case Slot::kBq: return b + "self_attn.q_proj.bias";
    case Slot::kWk: return b + "self_attn.k_proj.weight";
    case Slot::kBk: return b + "self_attn.k_proj.bias";
    case Slot::kWv: return b + "self_attn.v_proj.weight";
    case Slot::kBv: return b + "self_attn.v_proj.bias";
    case Slot::kWo: return b + "self_attn.out_proj.weight";
    case Slot::kBo: return b + "self_attn.out_proj.bias";
    case Slot::kFfnNorm: return b + "final_layer_norm.weight";
    case Slot::kFfnNormB: return b + "final_layer_norm.bias";
    case Slot::kWUp: return b + "fc1.weight";
    case Slot::kBUp: return b + "fc1.bias";
    case Slot::kWDown: return b + "fc2.weight";
    case Slot::kBDown: return b + "fc2.bias";
    default: return "";
  }
}

std::string opt_hf_global_name(GlobalSlot s) {
  switch (s) {
    case GlobalSlot::kTokEmbd: return "model.decoder.embed_tokens.weight";
    case GlobalSlot::kPosEmbd: return "model.decoder.embed_positions.weight";
    case GlobalSlot::kOutNorm: return "model.decoder.final_layer_norm.weight";
    case GlobalSlot::kOutNormB: return "model.decoder.final_layer_norm.bias";
    case GlobalSlot::kOutput: return "lm_head.weight";
    default: return "";
  }
}

}  // namespace

Architecture opt_architecture() {
  Architecture a;
  a.name = "opt";
  a.hf_classes = {"OPTForCausalLM"};
  a.traits = ArchTraits{.norm = NormKind::kLayer, .pos = PosKind::kLearned, .ffn = FfnKind::kRelu, .qkv_bias = true,
                        .o_bias = true, .ffn_bias = true, .norm_bias = true};
  a.parse_hf_config = opt_parse_config;
  a.hf_name = opt_hf_name;
  a.hf_global_name = opt_hf_global_name;
  return a;
}

}  // namespace hg
