// The decoder: embeddings, the per-layer block (norm → q/k/v → RoPE → strategy attention → out
// projection → residual → norm → FFN → residual), final norm and LM head, for a ragged batch of
// token rows (prefill and decode alike). Architecture differences come from ArchTraits only; KV
// placement is the strategy's. Scratch buffers are allocated once for `max_rows` rows, in the
// backend's memory; logits arrive in host memory.
#pragma once
#include <span>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/model.h"
#include "engine/kv/kv_strategy.h"

namespace hg {

// Kernel launches of one Decoder::forward over `rows` rows in chunks of `max_rows` with logits for
// `logit_rows` of them, counted from the ops forward issues (the strategy's attention as one).
int64_t forward_launches(const Model& m, int64_t rows, int64_t logit_rows, int max_rows);

class Decoder {
 public:
  Decoder(const Model& model, Backend& backend, KvStrategy& kv, int max_rows = 512);
  KvShape kv_shape() const;
  // Runs tokens[i] at rows[i] (any number of rows; processed in chunks of max_rows). For each
  // index j in logit_rows (ascending), writes the logits of row logit_rows[j] to logits[j, V].
  void forward(std::span<const int32_t> tokens, std::span<const TokenRow> rows, std::span<const int32_t> logit_rows,
               float* logits);
  const Model& model() const { return model_; }
  const KvStrategy& kv() const { return kv_; }
  const Backend& backend() const { return be_; }
  int max_rows() const { return max_rows_; }

 private:
  void forward_chunk(const int32_t* tokens, const TokenRow* rows, int M);
  const Model& model_;
  Backend& be_;
  KvStrategy& kv_;
  int max_rows_;
  std::pair<double, double> progress_{0, 1};  // the current chunk's start and share of the forward
  RopeTable rope_;
  // Activations live in the backend's memory (device memory for cuda).
  BackendArray<float> x_, h_, q_, k_, v_, att_, f1_, f2_, o_;
  BackendArray<float> logits_;  // backends without host memory: logits before the download
  std::vector<int32_t> pos_;    // host (rope takes host positions)
};

}  // namespace hg
