// Slot storage for strategies that keep a subset of tokens: per (layer, sequence, KV head) up to
// C slots, each a K row and a V row [D] plus the token's logical position. Removing a slot moves
// the last slot into it (attention is order-free), so slots stay dense: slots [0, count) are live.
// Budget tests read count()/positions() here, not the strategy's own counters.
#pragma once
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/kv_strategy.h"
#include "engine/runtime/memory.h"

namespace hg {

// Row g of k_row and v_row [H_kv, D] into slot slots[g] of head g of the [H_kv, cap, D] blocks K and
// V: one write each (row g·cap + slot of H_kv one-head rows), through `device` or on the host (null).
// rows: scratch for the row indices.
void write_head_slots(Backend* device, const float* k_row, const float* v_row, int H_kv, int D, const int32_t* slots,
                      int32_t cap, void* K, void* V, DType dt, std::vector<int32_t>& rows);

class SlotStore {
 public:
  // slots[b]: capacity C_b of sequence b (per layer and KV head). Allocated on `tier` of `mem`.
  // With `device` (a backend with memory of its own, the gpu tier on its allocations) the rows
  // live in its memory: insert() then takes rows in its memory and copies go through it.
  // dtype: element type of the stored rows (rows arrive as F32 and are converted).
  // gpu_layers: layers [0, gpu_layers) on the gpu tier instead (a store split under a budget).
  void reset(const KvShape& shape, std::span<const int32_t> slots, MemorySystem& mem, Tier tier,
             Backend* device = nullptr, DType dtype = DType::kF32, int gpu_layers = 0);
  // The tier layer `layer` lives on.
  Tier tier(int layer) const { return layer < gpu_layers_ ? Tier::kGpu : tier_; }
  int32_t count(int layer, int seq, int g) const { return count_[idx(layer, seq, g)]; }
  int32_t capacity(int seq) const { return cap_[size_t(seq)]; }
  const int32_t* positions(int layer, int seq, int g) const { return pos_[idx(layer, seq, g)].data(); }
  // K/V of (layer, seq): [H_kv, C, D] of dtype(); head stride C·D elements.
  void* k_raw(int layer, int seq) { return k_[size_t(layer) * cap_.size() + size_t(seq)].data(); }
  void* v_raw(int layer, int seq) { return v_[size_t(layer) * cap_.size() + size_t(seq)].data(); }
  // The same of an F32 store (a logic error on another).
  float* k(int layer, int seq) { return static_cast<float*>(f32(k_raw(layer, seq))); }
  float* v(int layer, int seq) { return static_cast<float*>(f32(v_raw(layer, seq))); }
  DType dtype() const { return dtype_; }
  int64_t elem_bytes() const { return int64_t(dtype_size(dtype_)); }
  int64_t head_stride(int seq) const { return int64_t(cap_[size_t(seq)]) * shape_.D; }
  // Appends a token to head g; returns its slot. Throws OutOfMemoryError when the head is full.
  // k_row and v_row are in the store's memory kind (the device's, when it has one).
  int32_t insert(int layer, int seq, int g, int32_t pos, const float* k_row, const float* v_row);
  // Appends a token to every head at once: k_row and v_row are [H_kv, D]; slots[g] gets head g's
  // slot. One write (one device launch) each for K and V, whatever the head count.
  void insert_heads(int layer, int seq, int32_t pos, const float* k_row, const float* v_row, int32_t* slots);
  // Frees `slot`; the last live slot moves into it. Returns the index that moved (or slot itself
  // when it was the last), so callers can mirror per-slot metadata.
  int32_t remove(int layer, int seq, int g, int32_t slot);
  // The same for `victims` of head g in order (moved[i]: what remove() would return for the i-th),
  // with the row moves deferred: each live slot's final content is read from the slot that held it
  // at the start, so flush_removals() moves them all at once, every head's K and V rows in one
  // copy_rows. The rows of (layer, seq) must not be read or written between the two.
  void remove_deferred(int layer, int seq, int g, std::span<const int32_t> victims, std::vector<int32_t>& moved);
  void flush_removals(int layer);
  // Makes (layer, dst) a copy of (layer, src): every head's live slots, their rows and positions.
  void copy_sequence(int layer, int src, int dst);
  const KvShape& shape() const { return shape_; }
  int64_t bytes() const { return bytes_; }

 private:
  size_t idx(int layer, int seq, int g) const {
    return (size_t(layer) * cap_.size() + size_t(seq)) * size_t(shape_.H_kv) + size_t(g);
  }
  void copy_row(int layer, void* dst, const void* src) const;
  void put_row(int layer, void* head, int32_t slot, const float* row) const;  // converts to dtype_
  // The device whose memory holds `layer`'s rows, or null (host memory).
  Backend* device(int layer) const { return tier(layer) == Tier::kGpu ? device_ : nullptr; }
  void* f32(void* p) const {
    if (dtype_ != DType::kF32) throw std::logic_error("SlotStore: float access to a non-F32 store");
    return p;
  }
  KvShape shape_;
  DType dtype_ = DType::kF32;
  Backend* device_ = nullptr;  // copies within device memory (layers on the gpu tier)
  Tier tier_ = Tier::kDram;
  int gpu_layers_ = 0;
  bool phantom_ = false;       // dry run: rows are not copied (positions and counts are kept)
  std::vector<int32_t> cap_;
  std::vector<Allocation> k_, v_;
  std::vector<std::vector<int32_t>> pos_;
  std::vector<int32_t> count_;
  int64_t bytes_ = 0;
  std::vector<int32_t> origin_, heads_pos_;  // remove_deferred's slot origins; insert_heads' row indices
  RowCopies pending_;                         // row moves remove_deferred left to flush_removals
};

}  // namespace hg
