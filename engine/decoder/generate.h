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

// How the prompt reaches the KV cache: a prefill forward (its logits give the first token), or
// seeded rows written through the strategy's append() at positions [0, len − 1) of every layer,
// after which decode starts from the prompt's last token (for decode measurements at long
// contexts without an O(n²) prefill; the values do not change a step's cost).
enum class PromptFill { kPrefill, kSeeded };

struct GenerateOptions {
  // With a runtime whose device is an accelerator (emulated or CUDA), every forward runs as a
  // stage on its accelerator queue, logged with its work; the backend passed to generate() must
  // be the runtime's accel_backend().
  Runtime* runtime = nullptr;
  int n_new = 32;                 // tokens to generate per sequence
  bool stop_at_eos = true;
  int max_rows = 512;             // prefill chunk (rows per forward chunk)
  SamplerOptions sampler;
  PromptFill fill = PromptFill::kPrefill;
  uint64_t fill_seed = 1;         // seeded rows' values
  // A decoder over the same model, backend and strategy to reuse, so that its scratch is warm
  // between requests as a server's is (null: a fresh one per call).
  Decoder* decoder = nullptr;
  // Per sequence (empty, or one list per prompt): tokens fed as decode steps after the prompt
  // before generation starts, their logits not sampled (a question after a compressed context).
  std::vector<std::vector<int32_t>> forced;
  // Runs after the prompt (step 0) and after each decode step (1, 2, …), outside their timing
  // (e.g. a paired bandwidth reference pass, a snapshot of the transfer totals).
  std::function<void(int64_t step)> after_step;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>> tokens;  // generated ids per sequence (prompt excluded)
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;  // tokens produced by decode steps (first token comes from prefill)
  double prefill_s = 0;  // the prefill forward, or the seeded fill
  double decode_s = 0;   // Σ step_s
  std::vector<double> step_s;  // each decode step: its forward and sampling
  // Each decode step, summed over its rows: keys attended with logits on the accelerator, on the
  // CPU (KvStrategy::attended_keys), and the visible context (position + 1).
  struct Attended {
    int64_t accel = 0, cpu = 0, context = 0;
  };
  std::vector<Attended> attended;
};

// Work of one forward over `rows` (for the event log and the modeled clock): 2 FLOPs per weight
// per row, attention 4·H·D FLOPs per key each row attends on the accelerator (`kv`'s
// accel_attention_keys; every visible key without one); bytes read on the accelerator: all weights
// once plus K and V (at the strategy's kv_dtype) of each sequence's keys once per forward, as a fused attention
// kernel reads a block of keys once for all query rows of the chunk. The LM head's FLOPs count for the
// `logit_rows` rows whose logits are computed (-1: every row); `launches` is forward_launches().
StageWork forward_work(const Model& m, std::span<const TokenRow> rows, const KvStrategy* kv = nullptr,
                       int64_t logit_rows = -1, int max_rows = 512);

// on_token(seq, id) is called as tokens are produced (may be empty).
GenerateResult generate(const Model& model, Backend& backend, KvStrategy& kv,
                        const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opts,
                        const std::function<void(int, int32_t)>& on_token = {});

}  // namespace hg
