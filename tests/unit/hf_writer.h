// Writes a Hugging Face model directory (config.json, a byte-level tokenizer.json, single or
// sharded safetensors) from a loaded Model, for tests that need a user-style HF checkpoint.
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/arch/arch.h"
#include "engine/core/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "test_util.h"

namespace hg::test {

inline std::string st_dtype(DType t) { return t == DType::kF32 ? "F32" : t == DType::kBF16 ? "BF16" : "F16"; }

// The header is padded with spaces to a multiple of 8 bytes, as the safetensors library writes it
// (pad = false: not, so that tensors start at odd offsets).
inline void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Weight*>>& ts,
                              bool pad = true) {
  nlohmann::json h = nlohmann::json::object();
  std::string data;
  for (auto& [name, w] : ts) {
    h[name] = {{"dtype", st_dtype(w->dtype)}, {"shape", w->shape}, {"data_offsets", {data.size(), data.size() + w->bytes()}}};
    data.append(static_cast<const char*>(w->buf.data()), w->bytes());
  }
  std::string hs = h.dump();
  if (pad) hs.append((8 - hs.size() % 8) % 8, ' ');
  else if (hs.size() % 2 == 0) hs += ' ';
  const uint64_t n = hs.size();
  write_file(path, std::string(reinterpret_cast<const char*>(&n), 8) + hs + data);
}

inline std::string write_hf(const Model& m, const std::string& name, int n_shards) {
  const Architecture* arch = architectures().by_name(m.hp.arch);
  const std::string dir = temp_path(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const HParams& hp = m.hp;
  nlohmann::json c = {{"architectures", {arch->hf_classes[0]}}, {"hidden_size", hp.d_model},
                      {"num_hidden_layers", hp.n_layers}, {"num_attention_heads", hp.n_heads},
                      {"vocab_size", hp.n_vocab}, {"max_position_embeddings", hp.max_pos},
                      {"tie_word_embeddings", hp.tie_embeddings}, {"bos_token_id", 1}, {"eos_token_id", 2}};
  if (hp.arch == "opt") {
    c["ffn_dim"] = hp.d_ff;
    c["word_embed_proj_dim"] = hp.d_model;
    c["do_layer_norm_before"] = true;
  } else {
    c["intermediate_size"] = hp.d_ff;
    c["num_key_value_heads"] = hp.n_kv_heads;
    c["head_dim"] = hp.head_dim;
    c["rms_norm_eps"] = hp.norm_eps;
    c["rope_theta"] = hp.rope_theta;
    if (!hp.rope_scaling.type.empty())
      c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", hp.rope_scaling.factor},
                           {"low_freq_factor", hp.rope_scaling.low_freq_factor},
                           {"high_freq_factor", hp.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", hp.rope_scaling.original_max_pos}};
  }
  write_file(dir + "/config.json", c.dump(2));
  // A byte-level BPE tokenizer.json: 256 byte tokens plus fillers up to the vocabulary.
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(uint8_t(b))] = b;
  for (int i = 256; i < hp.n_vocab; ++i) vocab["<extra_" + std::to_string(i) + ">"] = i;
  write_file(dir + "/tokenizer.json",
                   nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}}.dump());
  std::vector<std::pair<std::string, const Weight*>> all;
  for (auto s : global_slots(m.traits, hp.tie_embeddings)) all.push_back({arch->hf_global_name(s), &m[s]});
  for (int l = 0; l < hp.n_layers; ++l)
    for (auto s : layer_slots(m.traits)) all.push_back({arch->hf_name(s, l), &m.layers[size_t(l)][s]});
  if (n_shards == 1) {
    write_safetensors(dir + "/model.safetensors", all);
  } else {
    nlohmann::json idx = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
    for (int k = 0; k < n_shards; ++k) {
      std::vector<std::pair<std::string, const Weight*>> part;
      for (size_t i = size_t(k); i < all.size(); i += size_t(n_shards)) part.push_back(all[i]);
      const std::string fn = "model-0000" + std::to_string(k + 1) + "-of-0000" + std::to_string(n_shards) + ".safetensors";
      write_safetensors(dir + "/" + fn, part);
      for (auto& [n, w] : part) idx["weight_map"][n] = fn;
    }
    write_file(dir + "/model.safetensors.index.json", idx.dump());
  }
  return dir;
}

}  // namespace hg::test
