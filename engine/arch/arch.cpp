// Architecture registry and the helpers the architecture files share.
#include "engine/arch/arch.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>

#include "engine/core/error.h"

namespace hg {

const Architecture* ArchRegistry::by_name(std::string_view name) const {
  for (auto& a : archs_)
    if (a.name == name) return &a;
  return nullptr;
}

const Architecture* ArchRegistry::by_hf_class(std::string_view cls) const {
  for (auto& a : archs_)
    for (auto& c : a.hf_classes)
      if (c == cls) return &a;
  return nullptr;
}

std::string ArchRegistry::names() const {
  std::string s;
  for (auto& a : archs_) s += (s.empty() ? "" : ", ") + a.name;
  return s;
}

const ArchRegistry& architectures() {
  static const ArchRegistry reg = [] {
    ArchRegistry r;
    r.add(llama_architecture());
    r.add(qwen2_architecture());
    r.add(opt_architecture());
    return r;
  }();
  return reg;
}

std::string gguf_tensor_name(Slot s, int layer) {
  const std::string b = "blk." + std::to_string(layer) + ".";
  switch (s) {
    case Slot::kAttnNorm: return b + "attn_norm.weight";
    case Slot::kWq: return b + "attn_q.weight";
    case Slot::kBq: return b + "attn_q.bias";
    case Slot::kWk: return b + "attn_k.weight";
    case Slot::kBk: return b + "attn_k.bias";
    case Slot::kWv: return b + "attn_v.weight";
    case Slot::kBv: return b + "attn_v.bias";
    case Slot::kWo: return b + "attn_output.weight";
    case Slot::kFfnNorm: return b + "ffn_norm.weight";
    case Slot::kWGate: return b + "ffn_gate.weight";
    case Slot::kWUp: return b + "ffn_up.weight";
    case Slot::kWDown: return b + "ffn_down.weight";
    default: return "";
  }
}

std::string gguf_tensor_name(GlobalSlot s) {
  switch (s) {
    case GlobalSlot::kTokEmbd: return "token_embd.weight";
    case GlobalSlot::kOutNorm: return "output_norm.weight";
    case GlobalSlot::kOutput: return "output.weight";
    default: return "";
  }
}

// A GGUF count as an int, or InputError naming the key (no narrowing: 2^32 + 5 is not 5).
static int gguf_count(const ModelMetadata& f, const std::string& key, std::optional<uint64_t> dflt = std::nullopt) {
  const uint64_t v = dflt ? f.get_uint_or(key, *dflt) : f.get_uint(key);
  if (v > uint64_t(INT32_MAX)) input_error("{}: {} = {} does not fit a 32-bit count", f.path(), key, v);
  return int(v);
}

void parse_gguf_llama_family(const ModelMetadata& f, HParams* hp) {
  const std::string a = hp->arch + ".";
  hp->d_model = gguf_count(f, a + "embedding_length");
  hp->n_layers = gguf_count(f, a + "block_count");
  hp->n_heads = gguf_count(f, a + "attention.head_count");
  hp->n_kv_heads = gguf_count(f, a + "attention.head_count_kv", uint64_t(hp->n_heads));
  hp->d_ff = gguf_count(f, a + "feed_forward_length");
  hp->max_pos = gguf_count(f, a + "context_length", 2048);
  hp->norm_eps = float(f.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  hp->rope_theta = rope_theta_checked(f.get_float_or(a + "rope.freq_base", 10000.0), f.path(), a + "rope.freq_base");
  if (hp->n_heads <= 0) input_error("{}: {}attention.head_count must be positive", f.path(), a);
  hp->head_dim = gguf_count(f, a + "attention.key_length", uint64_t(hp->d_model / hp->n_heads));
  const auto rope_dims = f.get_uint_or(a + "rope.dimension_count", uint64_t(hp->head_dim));
  if (rope_dims != uint64_t(hp->head_dim))
    input_error("{}: partial RoPE ({}rope.dimension_count={} < head dim {}) is not supported", f.path(),
                a, rope_dims, hp->head_dim);
  if (f.has(a + "rope.scaling.type")) {
    const std::string t = f.get_string(a + "rope.scaling.type");
    if (t != "none")
      input_error("{}: {}rope.scaling.type '{}' is not supported (expected none; llama3 scaling comes "
                  "as rope_freqs.weight)", f.path(), a, t);
  }
}

double rope_theta_checked(double theta, const std::string& where, const std::string& field) {
  if (!(theta > 0) || !std::isfinite(theta)) input_error("{}: {} must be positive and finite, got {}", where, field, theta);
  return theta;
}

// An integer JSON value as an int, or InputError naming the field (no narrowing).
static int checked_int(const nlohmann::json& v, const char* field, const std::string& where) {
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                                           : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
  if (!fits) input_error("{}: field '{}' = {} does not fit a 32-bit integer", where, field, v.dump());
  return int(v.get<int64_t>());
}

int json_int(const nlohmann::json& j, const char* field, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end()) input_error("{}: missing field '{}'", where, field);
  if (!it->is_number_integer()) input_error("{}: field '{}' must be an integer", where, field);
  return checked_int(*it, field, where);
}

int json_int_or(const nlohmann::json& j, const char* field, int dflt, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number_integer()) input_error("{}: field '{}' must be an integer", where, field);
  return checked_int(*it, field, where);
}

double json_num_or(const nlohmann::json& j, const char* field, double dflt, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number()) input_error("{}: field '{}' must be a number", where, field);
  return it->get<double>();
}

bool json_bool_or(const nlohmann::json& j, const char* field, bool dflt, const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) input_error("{}: field '{}' must be true or false", where, field);
  return it->get<bool>();
}

std::string json_string_or(const nlohmann::json& j, const char* field, const std::string& dflt,
                           const std::string& where) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_string()) input_error("{}: field '{}' must be a string", where, field);
  return it->get<std::string>();
}

void parse_rope_scaling(const nlohmann::json& cfg, const std::string& where, RopeScaling* rs) {
  auto it = cfg.find("rope_scaling");
  if (it == cfg.end() || it->is_null()) return;
  if (!it->is_object()) input_error("{}: field 'rope_scaling' must be an object or null", where);
  const std::string w = where + " rope_scaling";
  std::string type;
  if (it->contains("rope_type") && (*it)["rope_type"].is_string()) type = (*it)["rope_type"];
  else if (it->contains("type") && (*it)["type"].is_string()) type = (*it)["type"];
  if (type == "default") return;
  if (type != "llama3")
    input_error("{}: rope_type '{}' is not supported (expected llama3 or default)", w, type);
  rs->type = type;
  rs->factor = json_num_or(*it, "factor", 8.0, w);
  rs->low_freq_factor = json_num_or(*it, "low_freq_factor", 1.0, w);
  rs->high_freq_factor = json_num_or(*it, "high_freq_factor", 4.0, w);
  rs->original_max_pos = json_int_or(*it, "original_max_position_embeddings", 8192, w);
  // The bounds transformers' llama3 validation asks for; outside them the RoPE table divides by zero.
  if (!(rs->factor > 0) || !(rs->low_freq_factor > 0) || !(rs->high_freq_factor > rs->low_freq_factor) ||
      rs->original_max_pos <= 0)
    input_error("{}: expected factor > 0, 0 < low_freq_factor < high_freq_factor and "
                "original_max_position_embeddings > 0", w);
}

}  // namespace hg
