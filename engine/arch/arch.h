// Architectures: each file (llama.cpp, qwen2.cpp, opt.cpp) describes one family — its traits, how
// to read its Hugging Face config.json, and its tensor names in HF and GGUF files. Registered
// explicitly in register_architectures(); loaders look them up by name or HF class.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/model.h"
#include "engine/core/model_metadata.h"

namespace hg {

struct Architecture {
  std::string name;                     // "llama", "qwen2", "opt"
  std::vector<std::string> hf_classes;  // config.json "architectures"
  ArchTraits traits;
  bool default_add_bos = true;  // tokenizer adds BOS when the files do not say (Qwen2: no)
  // Reads config.json (already parsed) into hp; throws InputError naming `where` and the field.
  void (*parse_hf_config)(const nlohmann::json& cfg, const std::string& where, HParams* hp) = nullptr;
  std::string (*hf_name)(Slot s, int layer) = nullptr;
  std::string (*hf_global_name)(GlobalSlot s) = nullptr;
  // GGUF support (nullptr when llama.cpp has no such architecture).
  void (*parse_gguf)(const ModelMetadata& f, HParams* hp) = nullptr;
};

class ArchRegistry {
 public:
  void add(Architecture a) { archs_.push_back(std::move(a)); }
  const Architecture* by_name(std::string_view name) const;
  const Architecture* by_hf_class(std::string_view cls) const;
  std::string names() const;  // comma-separated, for error messages
  const std::vector<Architecture>& all() const { return archs_; }

 private:
  std::vector<Architecture> archs_;
};

// The registry with every architecture (built once).
const ArchRegistry& architectures();

// One registration function per architecture file.
Architecture llama_architecture();
Architecture qwen2_architecture();
Architecture opt_architecture();

// GGUF tensor names shared by llama.cpp's llama-family architectures (blk.N.attn_q.weight …).
std::string gguf_tensor_name(Slot s, int layer);
std::string gguf_tensor_name(GlobalSlot s);
// Reads the "<arch>.*" hyperparameters llama-family GGUF files carry.
void parse_gguf_llama_family(const ModelMetadata& f, HParams* hp);

// Strict config.json accessors: a missing or mistyped field is an InputError naming file and field.
int json_int(const nlohmann::json& j, const char* field, const std::string& where);
int json_int_or(const nlohmann::json& j, const char* field, int dflt, const std::string& where);
double json_num_or(const nlohmann::json& j, const char* field, double dflt, const std::string& where);
// A RoPE architecture's theta, read from `field` of `where`: InputError unless positive and finite.
double rope_theta_checked(double theta, const std::string& where, const std::string& field);
bool json_bool_or(const nlohmann::json& j, const char* field, bool dflt, const std::string& where);
std::string json_string_or(const nlohmann::json& j, const char* field, const std::string& dflt, const std::string& where);
// Llama-3 style rope_scaling object (null or absent → none).
void parse_rope_scaling(const nlohmann::json& cfg, const std::string& where, RopeScaling* rs);

}  // namespace hg
