// GGUF model loader: architecture and hyperparameters from key-values, weights by llama.cpp's
// tensor names, the embedded tokenizer (`llama` SPM or `gpt2` byte-level BPE).
#include <filesystem>
#include <fstream>

#include "engine/arch/arch.h"
#include "engine/core/error.h"
#include "engine/formats/formats.h"
#include "engine/formats/gguf.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

bool gguf_probe(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  std::vector<std::string> tokens = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<int32_t> types;
  if (f.has("tokenizer.ggml.token_type"))
    for (double t : f.get_number_array("tokenizer.ggml.token_type")) types.push_back(int32_t(t));
  if (!types.empty() && types.size() != tokens.size())
    input_error("{}: tokenizer.ggml.token_type has {} entries for {} tokens", f.path(), types.size(), tokens.size());
  std::unique_ptr<Tokenizer> t;
  if (model == "llama") {
    std::vector<float> scores;
    if (f.has("tokenizer.ggml.scores"))
      for (double s : f.get_number_array("tokenizer.ggml.scores")) scores.push_back(float(s));
    if (!scores.empty() && scores.size() != tokens.size())
      input_error("{}: tokenizer.ggml.scores has {} entries for {} tokens", f.path(), scores.size(), tokens.size());
    const bool prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", true);
    t = make_spm_bpe_tokenizer(std::move(tokens), std::move(scores), std::move(types), prefix);
    t->add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", true);
  } else if (model == "gpt2") {
    ByteBpeSpec spec;
    spec.pre = pre_split_from_name(f.get_string_or("tokenizer.ggml.pre", "default"), f.path() + " tokenizer.ggml.pre");
    spec.ignore_merges = spec.pre == PreSplit::kLlama3;
    spec.merges = f.get_string_array("tokenizer.ggml.merges");
    spec.special.resize(tokens.size(), false);
    spec.user_defined.resize(tokens.size(), false);
    for (size_t i = 0; i < types.size(); ++i) {
      spec.special[i] = types[i] == 3;       // control
      spec.user_defined[i] = types[i] == 4;  // user-defined: matched verbatim in text
    }
    spec.tokens = std::move(tokens);
    t = make_byte_bpe_tokenizer(std::move(spec), f.path());
    t->add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  } else {
    input_error("{}: tokenizer.ggml.model '{}' is not supported (expected llama or gpt2)", f.path(), model);
  }
  t->bos_id = f.has("tokenizer.ggml.bos_token_id") ? int(f.get_uint("tokenizer.ggml.bos_token_id")) : -1;
  t->eos_id = f.has("tokenizer.ggml.eos_token_id") ? int(f.get_uint("tokenizer.ggml.eos_token_id")) : -1;
  t->chat_template = f.get_string_or("tokenizer.chat_template", "");
  return t;
}

Model gguf_load(const ModelSpec& spec, const LoadOptions& opts) {
  check_spec_options(spec, {"load"});
  const WeightLoad how = weight_load_option(spec);
  GgufFile f(spec.path);
  const std::string arch_name = f.get_string("general.architecture");
  const Architecture* arch = architectures().by_name(arch_name);
  if (!arch) input_error("{}: unknown architecture '{}' (expected one of: {})", spec.path, arch_name, architectures().names());
  if (!arch->parse_gguf) input_error("{}: architecture '{}' has no GGUF layout in llama.cpp", spec.path, arch_name);
  Model m;
  m.hp.arch = arch->name;
  m.traits = arch->traits;
  arch->parse_gguf(f, &m.hp);
  const auto* embd = f.find_tensor(gguf_tensor_name(GlobalSlot::kTokEmbd));
  if (!embd) input_error("{}: missing tensor {}", spec.path, gguf_tensor_name(GlobalSlot::kTokEmbd));
  if (embd->ne.size() != 2) input_error("{}: token_embd.weight must be 2-D", spec.path);
  m.hp.n_vocab = int(embd->ne[1]);
  m.hp.tie_embeddings = f.find_tensor(gguf_tensor_name(GlobalSlot::kOutput)) == nullptr;
  validate_hparams(m.hp, spec.path);

  // Engine weight type follows the first projection matrix's storage type.
  DType src = DType::kF32;
  std::string src_name = GgufFile::type_name(embd->type);
  if (const auto* wq = f.find_tensor(gguf_tensor_name(Slot::kWq, 0))) {
    src_name = GgufFile::type_name(wq->type);
    if (wq->type == GgufFile::kTBF16) src = DType::kBF16;
    if (wq->type == GgufFile::kTF16) src = DType::kF16;
  }
  m.weight_dtype = default_weight_dtype(src, opts);
  m.source_dtype = src_name;

  auto load_tensor = [&](const std::string& name, bool matrix) -> Weight {
    const auto* t = f.find_tensor(name);
    if (!t) input_error("{}: missing tensor {}", spec.path, name);
    return f.load(*t, matrix ? m.weight_dtype : DType::kF32, how);
  };
  for (auto s : global_slots(m.traits, m.hp.tie_embeddings)) m[s] = load_tensor(gguf_tensor_name(s), slot_is_matrix(s));
  m.layers.resize(size_t(m.hp.n_layers));
  for (int i = 0; i < m.hp.n_layers; ++i)
    for (auto s : layer_slots(m.traits)) m.layers[size_t(i)][s] = load_tensor(gguf_tensor_name(s, i), slot_is_matrix(s));
  if (const auto* rf = f.find_tensor("rope_freqs.weight")) {
    Weight w = f.load(*rf, DType::kF32);
    if (w.numel() != m.hp.head_dim / 2)
      input_error("{}: rope_freqs.weight has {} entries, expected head_dim/2 = {}", spec.path, w.numel(), m.hp.head_dim / 2);
    m.rope_freq_factors.assign(w.f32(), w.f32() + w.numel());
  }
  m.tokenizer = gguf_tokenizer(f);
  if (m.tokenizer->n_vocab() > m.hp.n_vocab)
    input_error("{}: tokenizer has {} tokens but the embedding has {} rows", spec.path, m.tokenizer->n_vocab(), m.hp.n_vocab);
  m.source = spec.path;
  return m;
}

}  // namespace

ModelFormat gguf_format() {
  return {"gguf", "GGUF v2/v3 file (llama, qwen2; F32/F16/BF16/Q8_0 tensors; embedded tokenizer)", gguf_probe,
          gguf_load};
}

// Reads only the tokenizer of a GGUF file (llama.cpp vocab-only files have no weights).
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  GgufFile f(path);
  return gguf_tokenizer(f);
}

}  // namespace hg
