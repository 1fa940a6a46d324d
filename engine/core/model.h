// The in-memory model description every format loader produces: hyperparameters, architecture
// traits, weights (immutable after load) and the tokenizer. Dimension names: L layers, H query
// heads, H_kv KV heads, D head dim, d_model hidden size, d_ff FFN size, V vocabulary.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace hg {

class Tokenizer;

enum class NormKind : uint8_t { kRms, kLayer };
enum class PosKind : uint8_t { kRope, kLearned };
enum class FfnKind : uint8_t { kSwiGlu, kRelu };
// kInterleaved rotates pairs (2i, 2i+1) (Meta/GGUF llama, llama2.c); kHalf rotates (i, i+D/2)
// (Hugging Face rotate_half, GGUF qwen2).
enum class RopeStyle : uint8_t { kInterleaved, kHalf };

// What the decoder needs to know about an architecture; it never looks at the name.
struct ArchTraits {
  NormKind norm = NormKind::kRms;
  PosKind pos = PosKind::kRope;
  FfnKind ffn = FfnKind::kSwiGlu;
  bool qkv_bias = false;
  bool o_bias = false;
  bool ffn_bias = false;
  bool norm_bias = false;
};

struct RopeScaling {
  std::string type;  // "" (none) or "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_pos = 8192;
};

struct HParams {
  std::string arch;
  int n_vocab = 0;
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int d_ff = 0;
  int max_pos = 0;     // context the model was trained for
  int pos_offset = 0;  // learned-position row offset (OPT: 2)
  float norm_eps = 1e-5f;
  double rope_theta = 10000.0;
  RopeStyle rope_style = RopeStyle::kHalf;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;
  int bos_id = -1;
  int eos_id = -1;
};

// Tensor slots; which ones an architecture uses follows from its traits.
enum class Slot : uint8_t {
  kAttnNorm, kAttnNormB, kWq, kBq, kWk, kBk, kWv, kBv, kWo, kBo,
  kFfnNorm, kFfnNormB, kWGate, kWUp, kBUp, kWDown, kBDown, kCount
};
enum class GlobalSlot : uint8_t { kTokEmbd, kPosEmbd, kOutNorm, kOutNormB, kOutput, kCount };

std::string_view slot_name(Slot s);
std::string_view slot_name(GlobalSlot s);
// Which slots the traits require, and each slot's expected shape.
std::vector<Slot> layer_slots(const ArchTraits& t);
std::vector<GlobalSlot> global_slots(const ArchTraits& t, bool tie_embeddings);
std::vector<int64_t> slot_shape(Slot s, const HParams& hp);
std::vector<int64_t> slot_shape(GlobalSlot s, const HParams& hp);
// Matrices take the engine's weight type; norms and biases are always F32.
bool slot_is_matrix(Slot s);
bool slot_is_matrix(GlobalSlot s);

struct LayerWeights {
  std::array<Weight, size_t(Slot::kCount)> t;
  Weight& operator[](Slot s) { return t[size_t(s)]; }
  const Weight& operator[](Slot s) const { return t[size_t(s)]; }
};

struct Model {
  HParams hp;
  ArchTraits traits;
  std::array<Weight, size_t(GlobalSlot::kCount)> global;
  std::vector<LayerWeights> layers;
  std::vector<float> rope_freq_factors;  // optional per-frequency divisors (GGUF rope_freqs)
  std::shared_ptr<Tokenizer> tokenizer;
  DType weight_dtype = DType::kF32;  // engine type of the matrices
  std::string source;                // path or synthetic spec
  std::string format;                // gguf, hf, llama2c, synthetic
  std::string source_dtype;          // what the file held (e.g. "f32", "q8_0", "bf16")
  double load_seconds = 0;           // load_model's wall time (reading, converting, validating)
  int64_t mapped_weight_bytes = 0;   // weights that are views of the file's mapping (WeightLoad::kMap)
  int64_t unlocked_weight_bytes = 0; // of those, the ones mlock refused (RLIMIT_MEMLOCK): evictable

  Weight& operator[](GlobalSlot s) { return global[size_t(s)]; }
  const Weight& operator[](GlobalSlot s) const { return global[size_t(s)]; }
  const Weight& output() const;  // the LM head (the embedding when tied)
  int64_t n_params() const;      // counts a tied matrix once
  int64_t weight_bytes() const;
  // Calls f(w) for every weight (global and per layer).
  template <typename F>
  void for_each_weight(F&& f) const {
    for (auto& w : global) f(w);
    for (auto& l : layers)
      for (auto& w : l.t) f(w);
  }
};

// Checks presence and shape of every slot the traits require; throws InputError naming `where`.
void validate_model(const Model& m, const std::string& where);
// Sanity checks on hyperparameters (positive sizes, divisibility).
// Checks every count positive and within the supported maxima below, the head layout, and the norm
// epsilon and RoPE theta positive and finite: InputError naming `where`.
inline constexpr int64_t kMaxLayers = 1024, kMaxHeads = 1024, kMaxHeadDim = 1024, kMaxVocab = int64_t(1) << 24,
                         kMaxWidth = int64_t(1) << 20;
void validate_hparams(const HParams& hp, const std::string& where);

}  // namespace hg
