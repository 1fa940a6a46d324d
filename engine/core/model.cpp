// Slot tables and model validation.
#include "engine/core/model.h"

#include <cmath>

#include "engine/core/error.h"

namespace hg {

std::string_view slot_name(Slot s) {
  static constexpr std::string_view kNames[] = {
      "attn_norm", "attn_norm_bias", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo",
      "ffn_norm", "ffn_norm_bias", "w_gate", "w_up", "b_up", "w_down", "b_down"};
  return kNames[size_t(s)];
}
std::string_view slot_name(GlobalSlot s) {
  static constexpr std::string_view kNames[] = {"tok_embd", "pos_embd", "out_norm", "out_norm_bias",
                                                "output"};
  return kNames[size_t(s)];
}

std::vector<Slot> layer_slots(const ArchTraits& t) {
  std::vector<Slot> s = {Slot::kAttnNorm, Slot::kWq, Slot::kWk, Slot::kWv, Slot::kWo,
                         Slot::kFfnNorm, Slot::kWUp, Slot::kWDown};
  auto add = [&](std::initializer_list<Slot> more) {
    for (Slot x : more) s.push_back(x);
  };
  if (t.norm_bias) add({Slot::kAttnNormB, Slot::kFfnNormB});
  if (t.qkv_bias) add({Slot::kBq, Slot::kBk, Slot::kBv});
  if (t.o_bias) add({Slot::kBo});
  if (t.ffn == FfnKind::kSwiGlu) add({Slot::kWGate});
  if (t.ffn_bias) add({Slot::kBUp, Slot::kBDown});
  return s;
}

std::vector<GlobalSlot> global_slots(const ArchTraits& t, bool tie) {
  std::vector<GlobalSlot> s = {GlobalSlot::kTokEmbd, GlobalSlot::kOutNorm};
  if (t.norm_bias) s.push_back(GlobalSlot::kOutNormB);
  if (t.pos == PosKind::kLearned) s.push_back(GlobalSlot::kPosEmbd);
  if (!tie) s.push_back(GlobalSlot::kOutput);
  return s;
}

std::vector<int64_t> slot_shape(Slot s, const HParams& hp) {
  const int64_t d = hp.d_model, qd = int64_t(hp.n_heads) * hp.head_dim,
                kvd = int64_t(hp.n_kv_heads) * hp.head_dim, ff = hp.d_ff;
  switch (s) {
    case Slot::kAttnNorm: case Slot::kAttnNormB: case Slot::kFfnNorm: case Slot::kFfnNormB:
    case Slot::kBo: case Slot::kBDown: return {d};
    case Slot::kWq: return {qd, d};
    case Slot::kBq: return {qd};
    case Slot::kWk: case Slot::kWv: return {kvd, d};
    case Slot::kBk: case Slot::kBv: return {kvd};
    case Slot::kWo: return {d, qd};
    case Slot::kWGate: case Slot::kWUp: return {ff, d};
    case Slot::kBUp: return {ff};
    case Slot::kWDown: return {d, ff};
    case Slot::kCount: break;
  }
  return {};
}

std::vector<int64_t> slot_shape(GlobalSlot s, const HParams& hp) {
  switch (s) {
    case GlobalSlot::kTokEmbd: case GlobalSlot::kOutput: return {hp.n_vocab, hp.d_model};
    case GlobalSlot::kPosEmbd: return {int64_t(hp.max_pos) + hp.pos_offset, hp.d_model};
    case GlobalSlot::kOutNorm: case GlobalSlot::kOutNormB: return {hp.d_model};
    case GlobalSlot::kCount: break;
  }
  return {};
}

bool slot_is_matrix(Slot s) {
  return s == Slot::kWq || s == Slot::kWk || s == Slot::kWv || s == Slot::kWo || s == Slot::kWGate ||
         s == Slot::kWUp || s == Slot::kWDown;
}
bool slot_is_matrix(GlobalSlot s) {
  return s == GlobalSlot::kTokEmbd || s == GlobalSlot::kOutput || s == GlobalSlot::kPosEmbd;
}

const Weight& Model::output() const {
  return hp.tie_embeddings ? (*this)[GlobalSlot::kTokEmbd] : (*this)[GlobalSlot::kOutput];
}

int64_t Model::n_params() const {
  int64_t n = 0;
  for (auto& w : global) n += w.numel();
  for (auto& l : layers)
    for (auto& w : l.t) n += w.numel();
  return n;
}

int64_t Model::weight_bytes() const {
  int64_t n = 0;
  for_each_weight([&](const Weight& w) { n += int64_t(w.bytes()); });
  return n;
}

void validate_hparams(const HParams& hp, const std::string& where) {
  auto pos = [&](int v, const char* name) {
    if (v <= 0) input_error("{}: {} must be positive, got {}", where, name, v);
  };
  pos(hp.n_vocab, "vocab size");
  pos(hp.d_model, "hidden size");
  pos(hp.n_layers, "layer count");
  pos(hp.n_heads, "head count");
  pos(hp.n_kv_heads, "KV head count");
  pos(hp.head_dim, "head dim");
  pos(hp.d_ff, "FFN size");
  pos(hp.max_pos, "context length");
  if (hp.n_heads % hp.n_kv_heads != 0)
    input_error("{}: head count {} is not a multiple of KV head count {}", where, hp.n_heads,
                hp.n_kv_heads);
  if (hp.head_dim % 2 != 0) input_error("{}: head dim {} must be even", where, hp.head_dim);
  // Sane maxima, checked before anything is sized from them (the largest released decoders have
  // 126 layers, 128 heads, 256K vocabularies and 16K-wide hidden states).
  auto at_most = [&](int64_t v, int64_t max, const char* name) {
    if (v > max) input_error("{}: {} {} is above the supported maximum {}", where, name, v, max);
  };
  at_most(hp.n_layers, kMaxLayers, "layer count");
  at_most(hp.n_heads, kMaxHeads, "head count");
  at_most(hp.head_dim, kMaxHeadDim, "head dim");
  at_most(hp.n_vocab, kMaxVocab, "vocab size");
  at_most(hp.d_model, kMaxWidth, "hidden size");
  at_most(hp.d_ff, kMaxWidth, "FFN size");
  if (!(hp.norm_eps > 0) || !std::isfinite(hp.norm_eps))
    input_error("{}: norm epsilon must be positive and finite, got {}", where, hp.norm_eps);
  // 0: no rotary embedding (OPT); the RoPE architectures' parsers require it positive.
  if (!(hp.rope_theta >= 0) || !std::isfinite(hp.rope_theta))
    input_error("{}: RoPE theta must be positive and finite, got {}", where, hp.rope_theta);
}

void validate_model(const Model& m, const std::string& where) {
  validate_hparams(m.hp, where);
  if (int(m.layers.size()) != m.hp.n_layers)
    input_error("{}: {} layers of weights for {} layers", where, m.layers.size(), m.hp.n_layers);
  for (auto s : global_slots(m.traits, m.hp.tie_embeddings)) {
    const Weight& w = m[s];
    if (w.empty()) input_error("{}: missing tensor {}", where, slot_name(s));
    if (w.shape != slot_shape(s, m.hp))
      input_error("{}: tensor {} has shape {}, expected {}", where, slot_name(s), shape_str(w.shape),
                  shape_str(slot_shape(s, m.hp)));
  }
  for (int i = 0; i < m.hp.n_layers; ++i)
    for (auto s : layer_slots(m.traits)) {
      const Weight& w = m.layers[i][s];
      if (w.empty()) input_error("{}: missing tensor {} of layer {}", where, slot_name(s), i);
      if (w.shape != slot_shape(s, m.hp))
        input_error("{}: tensor {} of layer {} has shape {}, expected {}", where, slot_name(s), i,
                    shape_str(w.shape), shape_str(slot_shape(s, m.hp)));
    }
}

}  // namespace hg
