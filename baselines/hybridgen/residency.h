// HybridGen's residency: each sequence's newest R tokens per layer in a ring on the accelerator
// (slot = position mod R+1), older tokens offloaded to a PagedKvStore (keys on dram, value pages on
// the tier the placement policy gives them), and exact attention over both for prompt rows. It
// moves rows only through the backend and the transfer engine.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "baselines/common.h"
#include "engine/kv/kv_store.h"
#include "engine/kv/paged_kv_store.h"
#include "engine/kv/placement.h"

namespace hg {

class ResidentRing {
 public:
  ResidentRing(Backend& be, Runtime& rt, const KvElement& kv) : be_(be), rt_(rt), kv_(kv) {}
  // Drops all state: R = resident_tokens per sequence and layer on the accelerator; the rest of
  // each sequence's capacity on the CPU side, pages of page_tokens placed within dram_bytes.
  void reset(const KvShape& shape, std::span<const int32_t> capacity, int32_t resident_tokens,
             int32_t page_tokens, PlacementPolicy& placement, int64_t dram_bytes);
  int32_t resident_tokens() const { return resident_; }
  int32_t slots() const { return resident_ + 1; }  // R + this step's token
  int32_t page_tokens() const { return page_; }

  // Stores rows' K and V [n, H_kv, D]: tokens leaving the ring are offloaded first (oldest
  // first; only prefill chunks longer than the ring overflow it within a call), then the rows go
  // into their slots. k and v stay valid until the layer's attend (attend_exact reads them).
  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v);
  // Offloads every token beyond each ring's R newest (the end of a step).
  void trim();
  // Prompt rows: exact attention on the accelerator over [0, pos]; the offloaded part is copied
  // back from the CPU side for it. Returns the highest position attended.
  // rows[i]'s query and output are row out_row[i] of q and out.
  int32_t attend_exact(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& out_row,
                       const float* q, float scale, float* out);
  // Makes sequence dst a copy of src's first n positions: ring and offloaded rows (each to dst's
  // own page tiers).
  void copy_sequence(int32_t src, int32_t n, int32_t dst);

  // Tokens of (layer, seq) on the CPU side (positions [0, offloaded)); its newest position.
  int32_t offloaded(int layer, int seq) const { return offloaded_[idx(layer, seq)]; }
  int32_t last_pos(int layer, int seq) const { return last_pos_[idx(layer, seq)]; }
  // The ring of (layer, seq): [H_kv][slots][D] of kv_dtype, head_stride elements between heads.
  void* ring_k(int layer, int seq) { return ring_.k_raw(layer, seq); }
  void* ring_v(int layer, int seq) { return ring_.v_raw(layer, seq); }
  int64_t head_stride(int seq) const { return ring_.head_stride(seq); }
  PagedKvStore& offloaded_kv() { return offloaded_kv_; }
  const PagedKvStore& offloaded_kv() const { return offloaded_kv_; }
  // The value row of (g, pos) in its page (allocated on first use), and the page's tier.
  char* vrow(int layer, int seq, int g, int32_t pos) { return offloaded_kv_.value(layer, seq, g, pos); }
  Tier vtier(int layer, int seq, int32_t pos) const { return offloaded_kv_.value_tier(layer, seq, pos); }

 private:
  size_t idx(int layer, int seq) const { return size_t(layer) * size_t(B_) + size_t(seq); }
  // Moves (seq, pos) tokens from the ring to the CPU side: K → dram, V → its page's tier. They may
  // be rows of this call (k, v) or ring slots.
  void offload(int layer, const std::vector<std::pair<int, int32_t>>& leaving, std::span<const TokenRow> rows,
               const float* k, const float* v);

  Backend& be_;
  Runtime& rt_;
  const KvElement& kv_;
  KvShape shape_;
  int B_ = 0;
  int32_t resident_ = 1, page_ = 1;
  KvStore ring_;
  PagedKvStore offloaded_kv_;
  std::vector<int32_t> offloaded_, last_pos_;  // per (layer, seq)
  std::vector<int32_t> slots_;                 // append() scratch: ring slots of a run of rows
  const float* new_k_ = nullptr;               // this layer's appended rows (valid until attend)
  const float* new_v_ = nullptr;
};

// The value tier of one (layer, seq)'s positions visited in increasing order, looked up once per
// page (the placement policy decides per page).
class ValueTierCursor {
 public:
  ValueTierCursor(const ResidentRing& ring, int layer, int seq)
      : ring_(ring), layer_(layer), seq_(seq), page_tokens_(ring.offloaded_kv().page_tokens()) {}
  Tier at(int32_t pos) {
    if (pos / page_tokens_ != page_) page_ = pos / page_tokens_, tier_ = ring_.vtier(layer_, seq_, pos);
    return tier_;
  }

 private:
  const ResidentRing& ring_;
  int layer_, seq_;
  int32_t page_tokens_, page_ = -1;
  Tier tier_ = Tier::kDram;
};

}  // namespace hg
