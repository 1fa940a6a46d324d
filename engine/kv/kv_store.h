// Contiguous KV storage on the host: per layer and sequence, K and V as [H_kv, capacity, D]
// (D-contiguous rows per head, so attention streams each head's keys). Storage only; which
// tokens are kept and who reads them is a strategy's business.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/kv/kv_strategy.h"
#include "engine/runtime/memory.h"

namespace hg {

class KvStore {
 public:
  // Allocates from `mem` on `tier` when given (an over-capacity tier throws OutOfMemoryError),
  // else from `device` when given (a backend without host memory, outside a runtime), else plain
  // host memory.
  // dtype: element type of the stored K and V (rows arrive as F32 and are converted).
  void reset(const KvShape& shape, std::span<const int32_t> capacity, MemorySystem* mem = nullptr,
             Tier tier = Tier::kDram, DType dtype = DType::kF32, Backend* device = nullptr);
  // F32 stores only (strategies that read rows as floats).
  float* k(int layer, int seq) { return static_cast<float*>(f32(buf_[index(layer, seq)].k)); }
  float* v(int layer, int seq) { return static_cast<float*>(f32(buf_[index(layer, seq)].v)); }
  // Any dtype: element (g, t, d) at index g·head_stride + t·D + d of the storage type.
  void* k_raw(int layer, int seq) { return buf_[index(layer, seq)].k; }
  void* v_raw(int layer, int seq) { return buf_[index(layer, seq)].v; }
  DType dtype() const { return dtype_; }
  // Distance between KV heads, in floats.
  int64_t head_stride(int seq) const { return int64_t(capacity_[size_t(seq)]) * shape_.D; }
  int32_t capacity(int seq) const { return capacity_[size_t(seq)]; }
  // Copies rows' k, v [n, H_kv, D] into their (seq, pos) slots. With a backend, through its
  // write_kv (k and v then live in the backend's memory, as the store does: device memory for
  // cuda); without one, on the host.
  void write(int layer, std::span<const TokenRow> rows, const float* k, const float* v, Backend* be = nullptr);
  // Copies positions [0, n) of every KV head of (layer, src) into (layer, dst): through `be` (the
  // storage is in its memory, as write() with a backend), else on the host.
  void copy_tokens(int layer, int src, int dst, int32_t n, Backend* be = nullptr);
  int64_t bytes() const { return bytes_; }
  const KvShape& shape() const { return shape_; }

 private:
  size_t index(int layer, int seq) const { return size_t(layer) * capacity_.size() + size_t(seq); }
  void* f32(void* p) const {
    if (dtype_ != DType::kF32) throw std::logic_error("KvStore: float access to a non-F32 store");
    return p;
  }
  DType dtype_ = DType::kF32;
  KvShape shape_;
  std::vector<int32_t> capacity_;
  struct Slot {
    AlignedBuffer hk, hv;           // host storage (no memory system)
    Allocation tk, tv;              // tiered storage
    BackendArray<char> dk, dv;      // a backend's own memory
    void* k = nullptr;
    void* v = nullptr;
  };
  std::vector<Slot> buf_;
  int64_t bytes_ = 0;
  std::vector<int32_t> pos_;  // write() scratch
  MemorySystem* mem_ = nullptr;  // where the current storage came from (reset() reuses it)
  Tier tier_ = Tier::kDram;
  Backend* device_ = nullptr;
};

}  // namespace hg
