// Qwen2 / Qwen2.5: Llama's block plus q/k/v biases; rotate-half RoPE in both HF and GGUF files.
#include "engine/arch/arch.h"
#include "engine/core/error.h"

namespace hg {

std::string llama_hf_name(Slot s, int layer);
std::string llama_hf_global_name(GlobalSlot s);
void llama_parse_hf_config(const nlohmann::json& cfg, const std::string& where, HParams* hp);

namespace {

void qwen2_parse_config(const nlohmann::json& cfg, const std::string& where, HParams* hp) {
  nlohmann::json c = cfg;
  c.erase("attention_bias");  // Qwen2 configs do not carry it; the biases are implied
  llama_parse_hf_config(c, where, hp);
  if (json_bool_or(cfg, "use_sliding_window", false, where))
    input_error("{}: use_sliding_window true is not supported", where);
}

void qwen2_parse_gguf(const ModelMetadata& f, HParams* hp) {
  parse_gguf_llama_family(f, hp);
  hp->rope_style = RopeStyle::kHalf;  // llama.cpp runs qwen2 in NEOX (rotate-half) mode
}

}  // namespace

Architecture qwen2_architecture() {
  Architecture a;
  a.name = "qwen2";
  a.hf_classes = {"Qwen2ForCausalLM"};
  a.traits = ArchTraits{.norm = NormKind::kRms, .pos = PosKind::kRope, .ffn = FfnKind::kSwiGlu, .qkv_bias = true};
  a.default_add_bos = false;
  a.parse_hf_config = qwen2_parse_config;
  a.hf_name = llama_hf_name;
  a.hf_global_name = llama_hf_global_name;
  a.parse_gguf = qwen2_parse_gguf;
  return a;
}

}  // namespace hg
