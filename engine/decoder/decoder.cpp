// Decoder forward pass. Shapes: x [M, d_model], q [M, H, D], k/v [M, H_kv, D], f1/f2 [M, d_ff].
#include "engine/decoder/decoder.h"

#include <cmath>

#include "engine/core/error.h"
#include "engine/runtime/queue.h"

namespace hg {

Decoder::Decoder(const Model& model, Backend& backend, KvStrategy& kv, int max_rows)
    : model_(model), be_(backend), kv_(kv), max_rows_(std::max(1, max_rows)) {
  const HParams& hp = model.hp;
  rope_ = make_rope_table(hp, model.rope_freq_factors);
  const size_t M = size_t(max_rows_);
  auto array = [&](size_t n) { return BackendArray<float>(backend, n); };
  x_ = array(M * size_t(hp.d_model));
  h_ = array(M * size_t(hp.d_model));
  o_ = array(M * size_t(hp.d_model));
  q_ = array(M * size_t(hp.n_heads * hp.head_dim));
  att_ = array(M * size_t(hp.n_heads * hp.head_dim));
  k_ = array(M * size_t(hp.n_kv_heads * hp.head_dim));
  v_ = array(M * size_t(hp.n_kv_heads * hp.head_dim));
  f1_ = array(M * size_t(hp.d_ff));
  f2_ = array(M * size_t(hp.d_ff));
  pos_.resize(M);
}

KvShape Decoder::kv_shape() const {
  return KvShape{model_.hp.n_layers, model_.hp.n_heads, model_.hp.n_kv_heads, model_.hp.head_dim,
                 model_.traits.pos == PosKind::kRope ? &rope_ : nullptr};
}

int64_t forward_launches(const Model& m, int64_t rows, int64_t logit_rows, int max_rows) {
  const ArchTraits& tr = m.traits;
  const int64_t chunks = (rows + max_rows - 1) / std::max(max_rows, 1);
  // embed (+ position embed, add); per layer: norm, q, k, v, (2 rope), attention, o, add, norm,
  // FFN (gate, up, swiglu | up, relu), down, add; per chunk with logits: a copy per row, norm, LM head.
  const int64_t embed = tr.pos == PosKind::kLearned ? 3 : 1;
  const int64_t layer = 10 + (tr.pos == PosKind::kRope ? 2 : 0) + (tr.ffn == FfnKind::kSwiGlu ? 3 : 2);
  const int64_t head_chunks = std::min(chunks, logit_rows);
  return chunks * (embed + layer * m.hp.n_layers) + logit_rows + 2 * head_chunks;
}

void Decoder::forward(std::span<const int32_t> tokens, std::span<const TokenRow> rows,
                      std::span<const int32_t> logit_rows, float* logits) {
  HG_CHECK(tokens.size() == rows.size());
  const HParams& hp = model_.hp;
  const int64_t d = hp.d_model, V = hp.n_vocab;
  size_t next_logit = 0;
  const double chunks = double((rows.size() + size_t(max_rows_) - 1) / size_t(max_rows_));
  for (size_t c0 = 0; c0 < rows.size(); c0 += size_t(max_rows_)) {
    const int M = int(std::min(rows.size() - c0, size_t(max_rows_)));
    progress_ = {double(c0 / size_t(max_rows_)) / chunks, 1.0 / chunks};
    forward_chunk(tokens.data() + c0, rows.data() + c0, M);
    // Final norm and LM head only for requested rows of this chunk.
    int n_out = 0;
    while (next_logit + size_t(n_out) < logit_rows.size() &&
           size_t(logit_rows[next_logit + size_t(n_out)]) < c0 + size_t(M)) {
      const int64_t r = logit_rows[next_logit + size_t(n_out)] - int64_t(c0);
      HG_CHECK(r >= 0);
      be_.copy(o_.data() + n_out * d, x_.data() + r * d, size_t(d) * 4);
      ++n_out;
    }
    if (n_out == 0) continue;
    if (model_.traits.norm == NormKind::kRms)
      be_.rms_norm(o_.data(), model_[GlobalSlot::kOutNorm].f32(), n_out, d, hp.norm_eps, h_.data());
    else
      be_.layer_norm(o_.data(), model_[GlobalSlot::kOutNorm].f32(), model_[GlobalSlot::kOutNormB].f32(), n_out, d,
                     hp.norm_eps, h_.data());
    float* out = logits + int64_t(next_logit) * V;
    if (be_.host_memory()) {
      be_.matmul(h_.data(), n_out, model_.output(), nullptr, out);
    } else {
      if (logits_.size() < size_t(n_out * V)) logits_ = BackendArray<float>(be_, size_t(n_out * V));
      be_.matmul(h_.data(), n_out, model_.output(), nullptr, logits_.data());
      be_.download(out, logits_.data(), size_t(n_out * V) * 4);
    }
    next_logit += size_t(n_out);
  }
  kv_.end_step();
}

void Decoder::forward_chunk(const int32_t* tokens, const TokenRow* rows, int M) {
  const HParams& hp = model_.hp;
  const ArchTraits& tr = model_.traits;
  const int64_t d = hp.d_model, H = hp.n_heads, Hkv = hp.n_kv_heads, D = hp.head_dim, ff = hp.d_ff;
  const std::span<const TokenRow> row_span(rows, size_t(M));
  for (int m = 0; m < M; ++m) pos_[size_t(m)] = rows[m].pos;

  be_.embed(model_[GlobalSlot::kTokEmbd], tokens, M, x_.data());
  if (tr.pos == PosKind::kLearned) {
    const Weight& pe = model_[GlobalSlot::kPosEmbd];
    std::vector<int32_t> pidx(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      pidx[size_t(m)] = rows[m].pos + hp.pos_offset;
      if (pidx[size_t(m)] >= pe.rows())
        throw OutOfMemoryError(fmt::format("position {} exceeds the model's {} learned positions", rows[m].pos, hp.max_pos));
    }
    be_.embed(pe, pidx.data(), M, o_.data());
    be_.add(x_.data(), o_.data(), M * d);
  }
  auto norm = [&](const Weight& w, const Weight& b, float* out) {
    if (tr.norm == NormKind::kRms) be_.rms_norm(x_.data(), w.f32(), M, d, hp.norm_eps, out);
    else be_.layer_norm(x_.data(), w.f32(), b.empty() ? nullptr : b.f32(), M, d, hp.norm_eps, out);
  };
  auto bias = [](const Weight& b) -> const float* { return b.empty() ? nullptr : b.f32(); };
  const float scale = 1.0f / std::sqrt(float(D));

  for (int l = 0; l < hp.n_layers; ++l) {
    const LayerWeights& w = model_.layers[size_t(l)];
    // How far the forward is, for the event log's replay (a no-op off an accelerator queue).
    set_accel_progress(progress_.first + progress_.second * double(l) / double(hp.n_layers));
    // Speculation for the next layer reads this layer's input (the residual stream, pre-norm).
    if (l + 1 < hp.n_layers) kv_.prepare(l + 1, row_span, x_.data());
    norm(w[Slot::kAttnNorm], w[Slot::kAttnNormB], h_.data());
    be_.matmul(h_.data(), M, w[Slot::kWq], bias(w[Slot::kBq]), q_.data());
    be_.matmul(h_.data(), M, w[Slot::kWk], bias(w[Slot::kBk]), k_.data());
    be_.matmul(h_.data(), M, w[Slot::kWv], bias(w[Slot::kBv]), v_.data());
    if (tr.pos == PosKind::kRope) {
      be_.rope(q_.data(), M, int(H), int(D), pos_.data(), rope_);
      be_.rope(k_.data(), M, int(Hkv), int(D), pos_.data(), rope_);
    }
    kv_.append(l, row_span, k_.data(), v_.data());
    kv_.attend(l, row_span, q_.data(), scale, att_.data());
    be_.matmul(att_.data(), M, w[Slot::kWo], bias(w[Slot::kBo]), o_.data());
    be_.add(x_.data(), o_.data(), M * d);

    norm(w[Slot::kFfnNorm], w[Slot::kFfnNormB], h_.data());
    if (tr.ffn == FfnKind::kSwiGlu) {
      be_.matmul(h_.data(), M, w[Slot::kWGate], nullptr, f1_.data());
      be_.matmul(h_.data(), M, w[Slot::kWUp], nullptr, f2_.data());
      be_.swiglu(f1_.data(), f2_.data(), M * ff, f1_.data());
    } else {
      be_.matmul(h_.data(), M, w[Slot::kWUp], bias(w[Slot::kBUp]), f1_.data());
      be_.relu(f1_.data(), M * ff);
    }
    be_.matmul(f1_.data(), M, w[Slot::kWDown], bias(w[Slot::kBDown]), o_.data());
    be_.add(x_.data(), o_.data(), M * d);
  }
}

}  // namespace hg
