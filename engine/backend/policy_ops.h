// Kernels of KV strategies' policies, apart from the model ops every backend implements
// (backend.h): attention in parts (logits, softmax, weighted values), the merged attention of two
// key sets, and the reductions and gathers scoring needs. Each op's default is its reference: a
// scalar loop over host memory that accumulates in double (policy_ops.cpp). A backend overrides
// an op where it has a faster kernel (cpu, checked against the reference by PolicyOps.* tests) or
// keeps its buffers elsewhere (cuda, checked against cpu). A new policy op is its declaration and
// reference here, plus the overrides a backend wants.
#pragma once
#include <cstdint>

#include "engine/core/dtype.h"

namespace hg {

class PolicyOps {
 public:
  virtual ~PolicyOps() = default;
  // Whether every buffer argument is host memory (the references read them directly). A backend
  // with memory of its own says false and overrides each op it supports.
  virtual bool host_memory() const { return true; }

  // Attention in parts, for strategies that split it (HybridGen, InfiniGen): G query heads of one
  // KV group over n keys/values given as D-contiguous rows of element type kt (F32 queries,
  // logits and outputs).
  // logits[h, t] = scale · q[h] · K[t]   (q [G, D], K [n, D], logits [G, n])
  virtual void group_logits(const float* q, int G, const void* K, int64_t n, int D, float scale, float* logits,
                            DType kt = DType::kF32);
  // group_logits for every KV group at once: logits[h, t] = scale · q[h] · K_g[t] for the H query
  // heads (q [H, D], head h in group g = h / (H / H_kv)), K_g = K + g · k_ld · D elements (k_ld
  // rows apart), logits [H, n]. One launch for the whole layer.
  virtual void heads_logits(const float* q, int H, int H_kv, const void* K, int64_t k_ld, int64_t n, int D,
                            float scale, float* logits, DType kt = DType::kF32);
  // score[t] = max over h < G of logits[h, t] (NaN logits skipped; -inf when all are): HybridGen's
  // `post` selection score. The CPU backend reduces each block of logits before storing it (one
  // float written per key instead of G); the reference computes group_logits into a scratch.
  virtual void group_logit_max(const float* q, int G, const void* K, int64_t n, int D, float scale,
                               float* score, DType kt = DType::kF32);
  // In place softmax over each of `rows` rows of length n.
  virtual void softmax_rows(float* x, int64_t rows, int64_t n);
  // out[h] = Σ_t p[h, t] · V[t]   (p [G, n], V [n, D], out [G, D])
  virtual void group_weighted_v(const float* p, int G, const void* V, int64_t n, int D, float* out,
                                DType vt = DType::kF32);
  // Decode attention of one query row over two key sets that share one softmax (HybridGen's merge
  // of CPU-computed and accelerator-computed logits). Set A arrives as scaled logits la [H, na]
  // with its values Va [H_kv, na, D]; set B as keys and values Kb, Vb [H_kv, ld_b, D] of which the
  // first nb rows count. q [H, D] → out [H, D]; query head h uses KV head h / (H / H_kv). The
  // result does not depend on the order of either set. lb, when given, holds set B's scaled logits
  // [H, nb] already (computed with group_logits before set A was ready, so that work overlaps the
  // wait for it). Va, Kb and Vb are of element type kv_dtype. Reference: the group ops above on a
  // host scratch.
  struct MergedAttention {
    int H = 0, H_kv = 0, D = 0;
    float scale = 1.0f;
    const float* q = nullptr;
    const float* la = nullptr;
    const void* Va = nullptr;
    int64_t na = 0;
    const void* Kb = nullptr;
    const void* Vb = nullptr;
    int64_t ld_b = 0, nb = 0;
    const float* lb = nullptr;
    DType kv_dtype = DType::kF32;
    float* out = nullptr;
  };
  virtual void merged_attention(const MergedAttention& a);

  // The largest of x[0, n), NaN ignored; -inf for n = 0 or all NaN.
  virtual float max_value(const float* x, int64_t n);
  // x[i] = exp(x[i] - shift) in place; returns the sum.
  virtual float exp_shift_sum(float* x, int64_t n, float shift);
  // dst row i ← the row at src + idx[i] · src_stride bytes, row_bytes each, i < n. idx is a host
  // array; dst is this backend's memory; src is too, or host memory from alloc_host or
  // register_host (read by DMA). May run on the copy queue's thread while another thread computes.
  virtual void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                           int64_t n);
  // Row i ← the row at src[i], into the row at dst[i], row_bytes each, i < n: rows from many places
  // (pages, heads, sequences) in one launch. dst and src are host arrays of pointers; the rows are
  // this backend's memory, a src row may be host memory from alloc_host or register_host (by DMA).
  virtual void copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n);
  // out[i] = gumbel::draw(stream, pos[i]) for i < n (engine/backend/gumbel.h: Keyformer's noise),
  // the same bits on every backend. Host arrays.
  virtual void gumbel_noise(uint64_t stream, const int32_t* pos, int64_t n, double* out);
  // The K positions of the highest scores, score(t) = max over h < G of logits[h * ld + t] (NaN
  // skipped; all NaN: -inf), t < n, in increasing order into out; ties go to the lower position.
  // Returns how many: min(K, n), 0 for K ≤ 0. Host arrays. Reference: std::nth_element over
  // (−score, position), then a sort (selectors/logit_topk.h).
  virtual int32_t logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, int32_t* out);

  // Eviction scores (H2O, Keyformer) kept where the attention runs: one record per retained slot
  // of a KV head, its accumulated score and its token's position, so that scoring and picking
  // victims read nothing back but the victims' slots.
  struct ScoreSlot {
    double score = 0;
    int32_t pos = 0;
    int32_t unused = 0;
  };
  // How a query head's taps become score increments: kSum adds the tap (H2O's softmax
  // probabilities); kGumbelSoftmax adds softmax_t((logit_t + g_t) / tau), g_t =
  // gumbel::draw(gumbel::stream(seed, layer, 0, row pos, head), key position) (Keyformer), the
  // noise in F64, z in F32, its max and exp-sum by max_value and exp_shift_sum, accumulated in F64.
  enum class ScoreRule { kSum, kGumbelSoftmax };
  struct ScoreRows {
    ScoreRule rule = ScoreRule::kSum;
    int H = 0, H_kv = 0;
    const float* taps = nullptr;  // [n_rows, H, tap_ld], row i's keys [0, rows[i].n) per head
    int64_t tap_ld = 0;
    uint64_t seed = 0;  // kGumbelSoftmax
    int layer = 0;
    struct Row {
      ScoreSlot* slots = nullptr;  // the row's sequence: [H_kv, slot_ld] records
      int64_t slot_ld = 0;
      int32_t n = 0;    // keys the row attended: slots [0, n) of every head
      int32_t pos = 0;  // the query row's position
      double tau = 1;   // kGumbelSoftmax's temperature
    };
    const Row* rows = nullptr;  // host array
    int64_t n_rows = 0;
  };
  // slots[g·slot_ld + t].score += Σ_{h in group g, in order} increment(h, t) for every row, group
  // and t < n. One launch for the block.
  virtual void accumulate_scores(const ScoreRows& a);
  // One KV head's eviction: of slots [0, n), those whose position is not among the `recent`
  // newest, the `count` with the lowest scores (ties: the older first), lowest first, into
  // out[at, at + count). Returns nothing; fewer than `count` candidates is a logic error.
  struct EvictionPick {
    const ScoreSlot* slots = nullptr;
    int32_t n = 0, recent = 0, count = 0;
    int64_t at = 0;
  };
  // Every pick of a layer in one launch (picks: host array; out: this backend's memory).
  virtual void pick_evictions(const EvictionPick* picks, int64_t n_picks, int32_t* out);
  // SnapKV's pooling of a head's scores before its pick, in place: score[s] becomes the mean (zero
  // padded: the sum over |j − s| ≤ kernel/2, 0 ≤ j < n, divided by kernel) or the maximum over that
  // range, for s < n (slots in position order). One launch for every item (slots: this backend's
  // memory; items: a host array).
  struct ScorePool {
    ScoreSlot* slots = nullptr;
    int32_t n = 0;
  };
  virtual void pool_scores(const ScorePool* items, int64_t n_items, int kernel, bool max);
  // Row i of `src` (host memory, row_bytes each) into dst[i] (this backend's memory), i < n: small
  // records scattered from the host in one call (the new slots' score records).
  virtual void put_rows(void* const* dst, const void* src, int64_t row_bytes, int64_t n);
};

}  // namespace hg
