// Batched generation: one prefill over all prompts (ragged rows), then decode steps with one row
// per live sequence. Timing covers prefill and decode separately (the caller owns warm-up).
#pragma once
#include <functional>
#include <vector>

#include "engine/decoder/decoder.h"
#include "engine/decoder/sampler.h"
#include "engine/runtime/event_log.h"

namespace hg {

class Runtime;

struct GenerateOptions {
  // With a runtime whose device is an accelerator (emulated or CUDA), every forward runs as a
  // stage on its accelerator queue, logged with its work; the backend passed to generate() must
  // be the runtime's accel_backend().
  Runtime* runtime = nullptr;
  int n_new = 32;                 // tokens to generate per sequence
  bool stop_at_eos = true;
  int max_rows = 512;             // prefill chunk (rows per forward chunk)
  SamplerOptions sampler;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // generated ids per sequence (prompt excluded)
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;  // tokens produced by decode steps (first token comes from prefill)
  double prefill_s = 0;
  double decode_s = 0;
};

// Work of one forward over `rows` (for the event log and the modeled clock): 2 FLOPs per weight
// per row, attention 4·H·D FLOPs per key each row attends on the accelerator (`kv`'s
// accel_attention_keys; every visible key without one); bytes read on the accelerator: all weights
// once plus K and V (F32 cache) of each sequence's keys once per forward, as a fused attention
// kernel reads a block of keys once for all query rows of the chunk.
StageWork forward_work(const Model& m, std::span<const TokenRow> rows, const KvStrategy* kv = nullptr);

// on_token(seq, id) is called as tokens are produced (may be empty).
GenerateResult generate(const Model& model, Backend& backend, KvStrategy& kv,
                        const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opts,
                        const std::function<void(int, int32_t)>& on_token = {});

}  // namespace hg
