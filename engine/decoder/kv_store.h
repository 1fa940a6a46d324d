// Contiguous KV storage on the host: per layer and sequence, K and V as [H_kv, capacity, D]
// (D-contiguous rows per head, so attention streams each head's keys). Storage only; which
// tokens are kept and who reads them is a strategy's business.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/decoder/kv_strategy.h"
#include "engine/runtime/memory.h"

namespace hg {

class KvStore {
 public:
  // Allocates from `mem` on `tier` when given (an over-capacity tier throws OutOfMemoryError),
  // else plain host memory.
  void reset(const KvShape& shape, std::span<const int32_t> capacity, MemorySystem* mem = nullptr,
             Tier tier = Tier::kDram);
  float* k(int layer, int seq) { return buf_[index(layer, seq)].k; }
  float* v(int layer, int seq) { return buf_[index(layer, seq)].v; }
  // Distance between KV heads, in floats.
  int64_t head_stride(int seq) const { return int64_t(capacity_[size_t(seq)]) * shape_.D; }
  int32_t capacity(int seq) const { return capacity_[size_t(seq)]; }
  // Copies rows' k, v [n, H_kv, D] into their (seq, pos) slots.
  void write(int layer, std::span<const TokenRow> rows, const float* k, const float* v);
  int64_t bytes() const { return bytes_; }
  const KvShape& shape() const { return shape_; }

 private:
  size_t index(int layer, int seq) const { return size_t(layer) * capacity_.size() + size_t(seq); }
  KvShape shape_;
  std::vector<int32_t> capacity_;
  struct Slot {
    AlignedBuffer hk, hv;  // host storage (no memory system)
    Allocation tk, tv;     // tiered storage
    float* k = nullptr;
    float* v = nullptr;
  };
  std::vector<Slot> buf_;
  int64_t bytes_ = 0;
};

}  // namespace hg
