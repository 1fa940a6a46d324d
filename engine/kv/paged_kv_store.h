// A paged, tiered KV store for tokens kept off the accelerator (HybridGen's CPU side, InfiniGen's
// whole cache; any strategy that scores or selects pages can hold its offloaded KV here). Pages of
// `page_tokens` positions go to `dram` or `far` as the placement policy (engine/kv/placement.h)
// decides; pages are numbered position-major across layers and sequences, so early tokens of every
// layer claim dram first. Keys: per (layer, sequence) and tier, one block [H_kv][rows][D] of that
// tier's positions in order, so a scorer reads each tier's keys in one pass and far memory only for
// keys there. Values: pages [H_kv][page_tokens][D], allocated on their tier at their first token.
// Elements are of the strategy's KV type; addresses are byte addresses of D-element rows.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/kv_strategy.h"
#include "engine/kv/placement.h"
#include "engine/runtime/memory.h"

namespace hg {

class PagedKvStore {
 public:
  // capacity: offloadable tokens per sequence. dram_bytes: dram the offloaded KV may use (the
  // placement plan's budget). dt: the element type stored.
  void reset(const KvShape& shape, std::span<const int32_t> capacity, int32_t page_tokens,
             PlacementPolicy& placement, int64_t dram_bytes, MemorySystem& mem, DType dt);
  DType dtype() const { return dt_; }
  // Bytes of n elements.
  int64_t bytes(int64_t n) const { return n * es_; }

  Tier key_tier(int layer, int seq, int32_t pos) const;
  Tier value_tier(int layer, int seq, int32_t pos) const;

  // Keys: head g's rows on tier t (key_head_stride elements between heads), and the row of a position.
  char* keys(Tier t, int layer, int seq, int g);
  int64_t key_head_stride(Tier t, int layer, int seq) const;
  char* key(int layer, int seq, int g, int32_t pos);
  // The rows tier t holds of positions [0, n), and the position of tier t's row `row`.
  int32_t key_rows_before(Tier t, int layer, int seq, int32_t n) const;
  int32_t key_position(Tier t, int layer, int seq, int32_t row) const;
  // Runs of positions [a, b) whose keys are consecutive rows of one tier: fn(tier, first row,
  // first position, count), in position order.
  template <class F>
  void key_runs(int layer, int seq, int32_t a, int32_t b, F&& fn) const {
    while (a < b) {
      const int32_t page = a / page_;
      const Tier t = key_tier(layer, seq, a);
      int32_t e = std::min(b, (page + 1) * page_);
      // Following pages of the same tier continue the same run of rows.
      while (e < b && key_tier(layer, seq, e) == t) e = std::min(b, e + page_);
      fn(t, row_of(t, layer, seq, a), a, e - a);
      a = e;
    }
  }

  // The page table of (layer, seq) over positions [0, n): page p holds positions [first, first +
  // count), p·page_tokens onward, its keys and its values each on one tier.
  struct Page {
    int32_t first = 0, count = 0;
    Tier key_tier = Tier::kDram, value_tier = Tier::kDram;
  };
  std::vector<Page> page_table(int layer, int seq, int32_t n) const;

  // Values: the row of (g, pos) in its page (allocated on the page's tier on first use).
  char* value(int layer, int seq, int g, int32_t pos);
  int64_t far_value_pages() const { return far_value_pages_; }
  int32_t page_tokens() const { return page_; }

  // Rows' K and V (host F32 [n, H_kv, D]) stored at their positions, converted to the stored type.
  void write(int layer, std::span<const TokenRow> rows, const float* k, const float* v);
  // Positions [0, n) of every KV head of (layer, src) copied into (layer, dst) on the host; the
  // caller moves rows whose tiers differ between the two sequences through the transfer engine.
  void copy_tokens(int layer, int src, int dst, int32_t n);
  // The rows of KV head g at sorted positions pos[0, n) into dst (n rows of D elements), through
  // one Backend::copy_rows each (the backend reads host tiers by DMA on a device).
  void gather_keys(Backend& be, int layer, int seq, int g, const int32_t* pos, int32_t n, char* dst);
  void gather_values(Backend& be, int layer, int seq, int g, const int32_t* pos, int32_t n, char* dst);
  // The same rows as (destination, source) pairs added to `out`, for one Backend::copy_rows over
  // many heads, sequences and both K and V.
  void key_rows(int layer, int seq, int g, const int32_t* pos, int32_t n, char* dst, RowCopies& out);
  void value_rows(int layer, int seq, int g, const int32_t* pos, int32_t n, char* dst, RowCopies& out);
  int64_t row_bytes() const { return shape_.D * es_; }
  // The gather_rows calls gather_values makes for these positions: runs of consecutive positions
  // within one page (what a transfer's per-row cost counts).
  int64_t value_runs(std::span<const int32_t> pos) const {
    int64_t n = 0;
    int32_t page_end = 0;  // the current run's page ends there: one division per run, not per row
    for (size_t i = 0; i < pos.size(); ++i)
      if (i == 0 || pos[i] != pos[i - 1] + 1 || pos[i] >= page_end) {
        ++n;
        page_end = (pos[i] / page_ + 1) * page_;
      }
    return n;
  }
  // The positions [0, n) tier t holds, uploaded into dst [H_kv][..][D] at row = position
  // (dst_pitch bytes between heads): one strided upload of all heads per run of rows (keys) or
  // per page (values).
  void upload_keys(Backend& be, Tier t, int layer, int seq, int32_t n, char* dst, size_t dst_pitch);
  void upload_values(Backend& be, Tier t, int layer, int seq, int32_t n, char* dst, size_t dst_pitch);

 private:
  size_t idx(int layer, int seq) const { return size_t(layer) * size_t(B_) + size_t(seq); }
  int64_t global_page(int layer, int seq, int32_t page) const {
    return int64_t(page) * shape_.n_layers * B_ + int64_t(layer) * B_ + seq;
  }
  // Key pages of (layer, seq) on dram among its first i pages.
  int32_t dram_pages_before(int layer, int seq, int32_t i) const {
    return dram_before_[idx(layer, seq) * size_t(max_pages_ + 1) + size_t(i)];
  }
  int32_t row_of(Tier t, int layer, int seq, int32_t pos) const;

  KvShape shape_;
  int B_ = 0;
  int32_t page_ = 1, max_pages_ = 0;
  DType dt_ = DType::kF32;
  int64_t es_ = 4;
  PlacementPolicy* placement_ = nullptr;
  MemorySystem* mem_ = nullptr;
  std::vector<int32_t> dram_before_;                   // [(layer, seq)][max_pages + 1]
  std::vector<std::array<Allocation, 2>> key_blocks_;  // [(layer, seq)][dram, far]
  std::vector<std::array<int32_t, 2>> key_rows_;       // their rows
  std::vector<Allocation> value_pages_;                // [(layer, seq)][page]
  int64_t far_value_pages_ = 0;
};

}  // namespace hg
