// The KV strategy interface: the policy for what KV is kept, where it lives and who computes
// attention over it. The decoder calls these hooks per layer and knows nothing about placement.
// Plain-array contract: rows name (sequence, position) of each token the call handles; k, v, q and
// out are row-major [n_rows, heads, D]. Only begin/append/attend/prepare/end_step mutate state.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "engine/core/dtype.h"

namespace hg {

struct RopeTable;

struct KvShape {
  int n_layers = 0;
  int H = 0;     // query heads
  int H_kv = 0;  // KV heads
  int D = 0;     // head dim
  const RopeTable* rope = nullptr;  // the model's RoPE (null: learned positions); keys arrive rotated
};

struct TokenRow {
  int32_t seq = 0;  // index in the batch
  int32_t pos = 0;  // position in its sequence (0-based)
};

class KvStrategy {
 public:
  virtual ~KvStrategy() = default;
  virtual std::string_view name() const = 0;
  // Starts a batch of capacity.size() sequences; sequence b has prompt_len[b] prompt tokens and
  // will hold at most capacity[b] tokens. Drops all previous state.
  virtual void begin(const KvShape& shape, std::span<const int32_t> capacity, std::span<const int32_t> prompt_len) = 0;
  // Stores the keys and values (after RoPE) of `rows` for `layer`: k, v [n_rows, H_kv, D].
  virtual void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) = 0;
  // Causal attention: each row attends its sequence's tokens at positions <= row.pos.
  // q [n_rows, H, D] → out [n_rows, H, D]; logits are scaled by `scale`.
  virtual void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) = 0;
  // Optional: speculative work for next_layer given the input of layer next_layer − 1 (the
  // residual stream before its norm) [n_rows, d_model], called before that layer computes so the
  // work can overlap it (InfiniGen, HybridGen). The buffer is only valid during the call.
  virtual void prepare(int next_layer, std::span<const TokenRow> rows, const float* layer_input) {
    (void)next_layer, (void)rows, (void)layer_input;
  }
  // After the last layer of each decoder forward call; a strategy may finish the step there (the
  // eviction strategies apply the decode rows' evictions), so a caller of append/attend calls it.
  virtual void end_step() {}
  // Makes each sequence of `dst` a copy of sequence `src`, which holds positions [0, n): its keys,
  // values and whatever the strategy keeps about them, so that each continues exactly as src would
  // (scoring runs an item's context once and forks it into the item's choices). Called between
  // forward calls; the dst sequences have received no rows since begin(), and have src's prompt
  // length and room for n positions. State shared by the batch (a scheduler) stays shared.
  virtual void fork(int32_t src, int32_t n, std::span<const int32_t> dst) = 0;
  // What the last step did (K, mode, tokens per tier, bytes moved, …), for per-step records.
  virtual std::map<std::string, double> step_stats() const { return {}; }
  // True when the decode path depends on the prompt's attention (InfiniGen calibrates its skew
  // from the prompt's queries): a cache filled through append() alone, as `bench` fills it, would
  // not reach the state a real prompt leaves, so such a strategy is filled by a real prefill.
  virtual bool needs_prompt_attention() const { return false; }
  // Keys whose K and V the accelerator reads for row r's attention in the coming forward (the
  // modeled clock's attention work, forward_work()): every visible key unless the strategy keeps
  // or computes fewer there (eviction budgets, attention on the CPU, selected tokens).
  virtual int64_t accel_attention_keys(const TokenRow& r) const { return int64_t(r.pos) + 1; }
  // Keys whose values enter row r's attention output in the coming forward, by where their logits
  // are computed: what result rows report as the attended budget. Default: the accelerator's keys.
  struct AttendedKeys {
    int64_t accel = 0, cpu = 0;
  };
  virtual AttendedKeys attended_keys(const TokenRow& r) const { return {accel_attention_keys(r), 0}; }
  // The same for the forward that just ended, summed over its decode rows and averaged over layers,
  // from a strategy that counts them as it attends (InfiniGen: its fetch counts follow the
  // speculation's logits); nullopt: attended_keys() before the forward is exact.
  virtual std::optional<AttendedKeys> last_attended() const { return std::nullopt; }
  // Element type of the K and V the strategy stores and moves (the accelerator's KV reads in
  // forward_work() are charged at its size).
  virtual DType kv_dtype() const { return DType::kF32; }
  // Settings the strategy ran with that differ from, or are derived from, its parameters (a 16-bit
  // kv_dtype stored as F32, HybridGen's effective K, a budget in tokens), as name → value for
  // result rows; the runner reads them without knowing the strategy.
  virtual std::map<std::string, std::string> effective_params() const { return {}; }
};

}  // namespace hg
