// Hugging Face directory loader: config.json → architecture and hyperparameters; weights from
// model.safetensors or the shards of model.safetensors.index.json; tokenizer from tokenizer.model
// (SentencePiece), tokenizer.json (byte-level BPE) or vocab.json + merges.txt (GPT-2 files).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/arch/arch.h"
#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/formats/formats.h"
#include "engine/formats/safetensors.h"
#include "engine/tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace hg {
namespace {

bool hf_probe(const std::string& path) {
  std::error_code ec;
  // config.json of any type (a link loop, a directory): the loader then says what is wrong with it.
  return fs::is_directory(path, ec) && file_present((fs::path(path) / "config.json").string());
}

// A config.json or index is kilobytes; a tokenizer.json of a 256K vocabulary is tens of megabytes.
constexpr int64_t kMaxJsonBytes = int64_t(256) << 20;

nlohmann::json read_json(const fs::path& p) {
  const std::string text = read_regular_file(p.string(), kMaxJsonBytes);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    input_error("{}: invalid JSON: {}", p.string(), e.what());
  }
}

int first_id(const nlohmann::json& cfg, const char* field) {
  auto it = cfg.find(field);
  if (it == cfg.end() || it->is_null()) return -1;
  if (it->is_number_integer()) return it->get<int>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int>();
  return -1;
}

// The tokenizer files of an HF directory: tokenizer.model (SentencePiece), tokenizer.json
// (byte-level BPE) or vocab.json + merges.txt (GPT-2).
std::unique_ptr<Tokenizer> tokenizer_files(const fs::path& dir, const std::string& where) {
  if (fs::exists(dir / "tokenizer.model")) return load_sentencepiece_model((dir / "tokenizer.model").string());
  if (fs::exists(dir / "tokenizer.json")) return load_hf_tokenizer_json((dir / "tokenizer.json").string());
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"))
    return load_gpt2_files((dir / "vocab.json").string(), (dir / "merges.txt").string(), PreSplit::kGpt2);
  input_error("{}: no tokenizer (expected tokenizer.model, tokenizer.json, or vocab.json + merges.txt)", where);
}

// tokenizer_config.json's add_bos_token and chat_template (a string, or a list of named templates of
// which "default" or else the first), when the directory has one.
void apply_tokenizer_config(const fs::path& dir, Tokenizer* tok) {
  if (!fs::exists(dir / "tokenizer_config.json")) return;
  const auto tc = read_json(dir / "tokenizer_config.json");
  if (!tc.is_object()) return;
  if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean()) tok->add_bos = tc["add_bos_token"].get<bool>();
  const auto ct = tc.find("chat_template");
  if (ct == tc.end()) return;
  if (ct->is_string()) tok->chat_template = ct->get<std::string>();
  if (!ct->is_array()) return;
  for (const auto& e : *ct) {
    if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
    if (tok->chat_template.empty() || e.value("name", "") == "default") tok->chat_template = e["template"].get<std::string>();
  }
}

Model hf_load(const ModelSpec& spec, const LoadOptions& opts) {
  check_spec_options(spec, {"load"});
  const WeightLoad how = weight_load_option(spec);
  const fs::path dir(spec.path);
  if (!fs::is_directory(dir)) input_error("{}: not a directory", spec.path);
  const fs::path cfg_path = dir / "config.json";
  const std::string where = cfg_path.string();
  const nlohmann::json cfg = read_json(cfg_path);
  if (!cfg.is_object()) input_error("{}: expected a JSON object", where);
  auto archs = cfg.find("architectures");
  if (archs == cfg.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    input_error("{}: missing field 'architectures' (e.g. [\"LlamaForCausalLM\"])", where);
  const std::string cls = (*archs)[0].get<std::string>();
  const Architecture* arch = architectures().by_hf_class(cls);
  if (!arch) {
    std::string known;
    for (auto& a : architectures().all())
      for (auto& c : a.hf_classes) known += (known.empty() ? "" : ", ") + c;
    input_error("{}: unknown architecture '{}' (expected one of: {})", where, cls, known);
  }
  Model m;
  m.hp.arch = arch->name;
  m.traits = arch->traits;
  // A field of an unexpected JSON type that a parser reads without its own check is the file's error too.
  try {
    arch->parse_hf_config(cfg, where, &m.hp);
  } catch (const nlohmann::json::exception& e) {
    input_error("{}: a field has an unexpected type ({})", where, e.what());
  }
  m.hp.bos_id = first_id(cfg, "bos_token_id");
  m.hp.eos_id = first_id(cfg, "eos_token_id");
  validate_hparams(m.hp, where);

  // A dry run of a directory with no weights (config.json alone): the shapes are all a modeled run
  // reads, so every weight is a phantom of its shape, at config.json's torch_dtype.
  if (opts.phantom_weights && !fs::exists(dir / "model.safetensors") && !fs::exists(dir / "model.safetensors.index.json")) {
    DType src = DType::kF32;
    if (auto t = cfg.find("torch_dtype"); t != cfg.end() && t->is_string())
      src = *t == "bfloat16" ? DType::kBF16 : *t == "float16" ? DType::kF16 : DType::kF32;
    m.weight_dtype = default_weight_dtype(src, opts);
    m.source_dtype = std::string(dtype_name(src));
    for (auto s : global_slots(m.traits, m.hp.tie_embeddings))
      m[s] = make_weight(slot_is_matrix(s) ? m.weight_dtype : DType::kF32, slot_shape(s, m.hp), true);
    m.layers.resize(size_t(m.hp.n_layers));
    for (auto& l : m.layers)
      for (auto s : layer_slots(m.traits)) l[s] = make_weight(slot_is_matrix(s) ? m.weight_dtype : DType::kF32, slot_shape(s, m.hp), true);
    const bool has_tokenizer = fs::exists(dir / "tokenizer.model") || fs::exists(dir / "tokenizer.json") ||
                               (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"));
    m.tokenizer = has_tokenizer ? tokenizer_files(dir, spec.path) : make_byte_tokenizer(m.hp.n_vocab);
    m.source = spec.path;
    return m;
  }
  // Weights: single file or sharded index.
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, SafetensorsFile*> where_is;
  if (fs::exists(dir / "model.safetensors")) {
    files.push_back(std::make_unique<SafetensorsFile>((dir / "model.safetensors").string()));
    for (auto& [n, e] : files.back()->entries()) where_is[n] = files.back().get();
  } else if (fs::exists(dir / "model.safetensors.index.json")) {
    const auto idx_path = dir / "model.safetensors.index.json";
    const auto idx = read_json(idx_path);
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      input_error("{}: missing field 'weight_map'", idx_path.string());
    std::map<std::string, SafetensorsFile*> by_file;
    for (auto& [name, file] : idx["weight_map"].items()) {
      if (!file.is_string()) input_error("{}: weight_map['{}'] must be a file name", idx_path.string(), name);
      const std::string fn = file.get<std::string>();
      if (fn.find('/') != std::string::npos) input_error("{}: shard '{}' must be a plain file name", idx_path.string(), fn);
      if (!by_file.count(fn)) {
        files.push_back(std::make_unique<SafetensorsFile>((dir / fn).string()));
        by_file[fn] = files.back().get();
      }
      where_is[name] = by_file[fn];
    }
  } else {
    input_error("{}: no model.safetensors or model.safetensors.index.json", spec.path);
  }
  const std::string lm_head = arch->hf_global_name(GlobalSlot::kOutput);
  if (!where_is.count(lm_head)) {
    if (!m.hp.tie_embeddings)
      input_error("{}: no tensor {} and tie_word_embeddings is false", spec.path, lm_head);
  } else {
    m.hp.tie_embeddings = false;  // an explicit head wins
  }
  const std::string wq0 = arch->hf_name(Slot::kWq, 0);
  DType src = DType::kF32;
  if (where_is.count(wq0)) src = where_is[wq0]->find(wq0)->dtype;
  m.weight_dtype = default_weight_dtype(src, opts);
  m.source_dtype = std::string(dtype_name(src));
  auto load_tensor = [&](const std::string& name, bool matrix) -> Weight {
    auto it = where_is.find(name);
    if (it == where_is.end()) input_error("{}: missing tensor {}", spec.path, name);
    const auto* e = it->second->find(name);
    if (!e) input_error("{}: tensor {} is not in {}", spec.path, name, it->second->path());
    return it->second->load(*e, matrix ? m.weight_dtype : DType::kF32, how);
  };
  for (auto s : global_slots(m.traits, m.hp.tie_embeddings))
    m[s] = load_tensor(arch->hf_global_name(s), slot_is_matrix(s));
  m.layers.resize(size_t(m.hp.n_layers));
  for (int i = 0; i < m.hp.n_layers; ++i)
    for (auto s : layer_slots(m.traits))
      m.layers[size_t(i)][s] = load_tensor(arch->hf_name(s, i), slot_is_matrix(s));

  std::unique_ptr<Tokenizer> tok = tokenizer_files(dir, spec.path);
  if (m.hp.bos_id >= 0) tok->bos_id = m.hp.bos_id;
  if (m.hp.eos_id >= 0) tok->eos_id = m.hp.eos_id;
  tok->add_bos = arch->default_add_bos;
  apply_tokenizer_config(dir, tok.get());
  m.tokenizer = std::move(tok);
  m.source = spec.path;
  return m;
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) input_error("{}: not a directory", dir);
  auto tok = tokenizer_files(dir, dir);
  apply_tokenizer_config(dir, tok.get());
  check_tokenizer(*tok, dir);
  return tok;
}

ModelFormat hf_format() {
  return {"hf", "Hugging Face directory: config.json + (sharded) safetensors; Llama, Qwen2, OPT", hf_probe,
          hf_load};
}

}  // namespace hg
