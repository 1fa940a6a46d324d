// Token-eviction strategies (StreamingLLM, H2O, Keyformer) share this engine: retained tokens
// live in a SlotStore on `dram` (`kv_home: dram`: the KV cache offloaded as for FlexGen, the paper's
// baseline; the new token's K and V go to dram and the retained set is sent to the accelerator every
// layer and step, on FlexGen's overlap schedule), on the accelerator's `gpu` tier (`kv_home: gpu`),
// or split by whole layers within the experiment's accelerator KV budget (`auto`, the default:
// dram without a budget); attention runs on the accelerator over the retained set plus the current token
// (with logit/probability taps); a policy scores tokens and picks which to drop. Prefill keeps the whole
// prompt (causal attention over it, scores accumulated); the first decode step prunes to the budget; every
// decode step then adds one token and evicts down to the budget again. Evicted tokens never return. GQA: one
// retained set per KV head, scores summed over the query heads of the group.
#pragma once
#include <algorithm>
#include <array>
#include <vector>

#include "baselines/common.h"
#include "engine/kv/slot_store.h"

namespace hg {

// The `kv_home` parameter every evicting strategy declares.
ParamSpec kv_home_param();
// The `budget_basis` parameter: what a ratio budget is a fraction of (context | sequence).
ParamSpec budget_basis_param();

class EvictingStrategy : public KvStrategy {
 public:
  EvictingStrategy(const StrategyContext& ctx, const char* name, const StrategyParams& p);
  ~EvictingStrategy() override;
  void end_step() override;
  void begin(const KvShape& shape, std::span<const int32_t> capacity,
             std::span<const int32_t> prompt_len) override;
  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override;
  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override;
  std::map<std::string, double> step_stats() const override;
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override;
  DType kv_dtype() const override { return kv_.dtype(); }
  std::map<std::string, std::string> effective_params() const override;
  const SlotStore& store() const { return store_; }
  // Tokens the policy keeps for sequence `seq` once it holds `context` tokens (ratio budgets are a
  // fraction of the current context; at the first decode step that is the prompt).
  virtual int32_t budget(int seq, int32_t context) const = 0;

 protected:
  // The attention taps a scoring policy reads: a mask of kLogits (scaled logits, before the
  // softmax) and kProbs (softmax probabilities). Taps it does not ask for are not computed (no
  // bytes written per key and head).
  static constexpr int kLogits = 1, kProbs = 2;
  // The taps' cost on the accelerator for the modeled clock, beside the forward's attention: each
  // tap written once and read once by the score policy (4 bytes per key and query head), and the
  // policy's elementwise work (policy_elems_per_score() per key and query head).
  StageWork tap_work(const AttentionArgs& a) const;
  virtual int taps() const = 0;
  // The policy's cost per score beyond one add, in exp_shift_sum elements (StageWork::elems).
  virtual double policy_elems_per_score() const { return 0; }
  // A scoring policy (taps() != 0): its scores are records on the accelerator beside the retained
  // KV (PolicyOps::ScoreSlot), accumulated from the taps by one accumulate_scores per attention
  // call and ranked there by pick_evictions: the lowest scores outside the recent_window() newest
  // tokens go, ties the oldest first. Only the victims' slots reach the host.
  struct ScorePolicy {
    PolicyOps::ScoreRule rule = PolicyOps::ScoreRule::kSum;
    uint64_t seed = 0;
  };
  virtual ScorePolicy score_policy() const { return {}; }
  // The temperature of a query row's scores (ScoreRule::kGumbelSoftmax).
  virtual double score_tau(int /*seq*/, int32_t /*row_pos*/) const { return 1; }
  // Tokens of `seq` a scoring policy never evicts: the newest ones.
  virtual int32_t recent_window(int /*seq*/) const { return 0; }
  // Whether the query row at `pos` of `seq` adds to the scores (its taps are computed only then).
  virtual bool scores_row(int /*seq*/, int32_t /*pos*/) const { return true; }
  // SnapKV: the scores pooled over `pool_kernel()` neighbouring positions (mean, or max) before a
  // pick; 0: not pooled.
  virtual int pool_kernel() const { return 0; }
  virtual bool pool_max() const { return false; }
  // A policy without taps: the `count` slots of (layer, seq, g) to drop now, in the order it
  // would drop them one at a time (one call picks them all).
  virtual void victims(int layer, int seq, int g, int32_t count, std::vector<int32_t>& slots);
  // Keys are stored as given (post-RoPE) unless this returns true (then pre-RoPE, re-rotated
  // at positions within the cache each step, as StreamingLLM's pos-shift).
  virtual bool cache_positions() const { return false; }
  // Keeps the first `count` of `slots` in the order `before` (a strict weak order), in that order.
  template <class Before>
  static void first_in_order(std::vector<int32_t>& slots, int32_t count, Before before) {
    if (int32_t(slots.size()) > count)
      std::nth_element(slots.begin(), slots.begin() + (count - 1), slots.end(), before);
    slots.resize(size_t(count));
    std::sort(slots.begin(), slots.end(), before);
  }
  int32_t prompt_len(int seq) const { return prompt_[size_t(seq)]; }
  // The shared `budget` (attended fraction of the context) when set, else 0: the policy's own
  // parameters size it.
  double shared_budget() const { return budget_; }
  // The context the current eviction of `seq` is sized for: the tokens before the decode row, or
  // with budget_basis=sequence the sequence's whole length (its capacity).
  int32_t context(int seq) const { return sequence_basis_ ? capacity_[size_t(seq)] : context_[size_t(seq)]; }
  // The tokens retained once `seq` holds `n` (budget() of the basis: n, or the whole sequence).
  int32_t keep(int seq, int32_t n) const { return budget(seq, sequence_basis_ ? capacity_[size_t(seq)] : n); }

 public:
  // Prefill attends every visible key; a decode row the budget plus itself.
  int64_t accel_attention_keys(const TokenRow& r) const override {
    return r.pos < prompt_len(r.seq) ? int64_t(r.pos) + 1
                                     : std::min<int64_t>(r.pos + 1, int64_t(keep(r.seq, r.pos)) + 1);
  }

 protected:
  int32_t n_new(int seq) const { return capacity_[size_t(seq)] - prompt_[size_t(seq)]; }
  const KvShape& shape() const { return shape_; }
  int group() const { return shape_.H / shape_.H_kv; }

 private:
  // Every listed (seq, keep) of `layer` down to its keep. A scoring policy's victims are one
  // pick_evictions per layer into the step's victims buffer; with `defer` they are read back and
  // applied at end_step (one download a step, after the step's logits), else now.
  void evict_to(int layer, const std::vector<std::pair<int32_t, int32_t>>& keeps, bool defer);
  void apply_evictions();
  // victims_ of (layer, seq, g) removed down to `keep` slots (score records followed when scored).
  void remove_victims(int layer, int seq, int g, int32_t keep, bool scored);
  struct QueuedEviction {
    int layer = 0;
    std::vector<std::pair<int32_t, int32_t>> keeps;
    size_t first_pick = 0;  // its picks in picks_
  };
  std::vector<QueuedEviction> queued_;
  int64_t picked_used_ = 0;  // of picked_'s entries, this step's
  PolicyOps::ScoreSlot* score_slots(int layer, int seq) const {
    return score_slots_.data() + score_off_[vidx(layer, seq)];
  }
  // kv_home dram: the retained K and V of `rows`' sequences in `layer`, sent to the gpu tier; returns
  // seq → (K, V) in the store's layout (the store itself for kv_home gpu).
  // With `overlap` (as FlexGen's): the retained set of `layer` for `rows`' sequences is loaded into
  // its layer parity's staged copy on the copy queue while the layer before it computes; the
  // attention waits only when the set changed since (the first decode step's pruning) or was not
  // prefetched. Without it every load is waited for where it is needed (InfiniGen's serial schedule).
  std::map<int32_t, std::pair<const void*, const void*>> kv_on_accelerator(int layer, std::span<const TokenRow> rows);
  Event load_retained(int layer, std::map<int32_t, std::vector<int32_t>> counts);
  std::map<int32_t, std::vector<int32_t>> retained_counts(int layer, std::span<const TokenRow> rows) const;
  // next_step: a load for the next step's rows (after the last layer), else for this step's.
  void prefetch(int layer, std::span<const TokenRow> rows, bool next_step);
  void settle();
  struct Prefetch;
  bool prefetch_serves(int layer, std::span<const TokenRow> rows,
                       const std::map<int32_t, std::vector<int32_t>>& counts) const;
  size_t vidx(int layer, int seq) const { return size_t(layer) * prompt_.size() + size_t(seq); }
  int64_t& version(int layer, int seq) { return version_[vidx(layer, seq)]; }
  struct Prefetch {
    int layer = -1;
    std::map<int32_t, std::vector<int32_t>> counts;  // seq → retained slots per KV head when queued
    std::map<int32_t, int64_t> version;              // seq → evictions of the layer when queued
    Event done;
  };
  std::array<Prefetch, 2> prefetch_;  // per layer parity
  std::vector<int64_t> version_;      // per (layer, seq): eviction rounds so far
  std::vector<TokenRow> last_rows_;   // the last layer's rows: the next step's layer-0 prefetch
  const float* new_k_ = nullptr;      // this layer's appended rows (the decoder's, valid until attend)
  const float* new_v_ = nullptr;
  int exposed_ = 0, exposed_last_ = 0;
  Backend& be_;
  Runtime& rt_;
  KvElement kv_;
  KvShape shape_;
  SlotStore store_;
  std::vector<int32_t> prompt_, capacity_, context_;
  // A scoring policy's records, in the accelerator's memory: per (layer, seq) [H_kv, capacity]
  // at score_off_; none in a dry run.
  BackendArray<PolicyOps::ScoreSlot> score_slots_;
  std::vector<size_t> score_off_;
  std::vector<PolicyOps::ScoreSlot> new_slots_;  // append's new records
  std::vector<void*> new_slot_at_;
  std::vector<PolicyOps::ScoreRows::Row> score_rows_;
  std::vector<PolicyOps::EvictionPick> picks_;
  std::vector<PolicyOps::ScorePool> pools_;
  BackendArray<int32_t> picked_;                 // pick_evictions' output, read back to picked_host_
  std::vector<int32_t> picked_host_, origin_;
  RowCopies slot_moves_;                         // records moved by an eviction
  BackendArray<float> logits_, probs_;           // attention taps, in the accelerator's memory
  std::vector<AttnRow> attn_rows_;
  std::vector<int32_t> victims_, pending_, moved_;  // evict_to's scratch
  std::vector<int32_t> slots_, rows_;               // one row's slot per head; write_head_slots' scratch
  // Re-rotating policies: each sequence's keys (rotated at their rank) and values in position
  // order, the queries, and the new keys rotated back to position 0; all in the accelerator's memory.
  BackendArray<float> krot_, vrot_, qrot_, kin_;
  BackendArray<char> rot_stage_;  // a sequence's 16-bit K and V rows in rank order, before conversion
  std::vector<int32_t> ranks_;    // each row's rank: 0 … nmax − 1 for every head
  RowCopies rot_rows_;            // the rank-ordered copy's rows
  std::map<int32_t, int64_t> rot_stride_;  // seq → rows per head of its rotated copy
  std::vector<int32_t> q_delta_;           // per row: a rotation (query: cache position − position)
  std::map<int32_t, size_t> rotated_;     // seq → offset of its rotated K/V copy in this call
  std::string kv_home_;                   // the parameter: auto, dram or gpu
  int gpu_layers_ = 0;  // this run's: layers [0, gpu_layers_) keep their KV on the accelerator
  bool home_dram(int layer) const {
    return layer >= gpu_layers_;
  }  // the layer's retained KV on dram between steps
  bool overlap_ = true;
  bool sequence_basis_ = false;  // budget_basis=sequence
  std::array<std::map<int32_t, Allocation>, 2> staged_;  // kv_home dram, per layer parity: seq → retained K|V on the gpu tier
  int64_t evicted_ = 0;
  double budget_ = 0;
};

}  // namespace hg
