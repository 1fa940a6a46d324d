// Contiguous host KV storage.
#include "engine/decoder/kv_store.h"

#include <cstring>

namespace hg {

void KvStore::reset(const KvShape& shape, std::span<const int32_t> capacity, MemorySystem* mem, Tier tier,
                    DType dtype) {
  shape_ = shape;
  dtype_ = dtype;
  capacity_.assign(capacity.begin(), capacity.end());
  buf_.clear();  // frees the previous batch's storage before allocating
  bytes_ = 0;
  buf_.reserve(size_t(shape.n_layers) * capacity_.size());
  for (int l = 0; l < shape.n_layers; ++l)
    for (size_t b = 0; b < capacity_.size(); ++b) {
      const size_t n = size_t(shape.H_kv) * size_t(capacity_[b]) * size_t(shape.D) * dtype_size(dtype);
      Slot& sl = buf_.emplace_back();
      if (mem) {
        sl.tk = mem->allocate(tier, int64_t(n));
        sl.tv = mem->allocate(tier, int64_t(n));
        sl.k = sl.tk.data();
        sl.v = sl.tv.data();
      } else {
        sl.hk = AlignedBuffer(n);
        sl.hv = AlignedBuffer(n);
        sl.k = sl.hk.data();
        sl.v = sl.hv.data();
      }
      bytes_ += int64_t(2 * n);
    }
}

void KvStore::write(int layer, std::span<const TokenRow> rows, const float* k, const float* v) {
  const int D = shape_.D, Hkv = shape_.H_kv;
  for (size_t i = 0; i < rows.size(); ++i) {
    const TokenRow r = rows[i];
    if (r.seq < 0 || size_t(r.seq) >= capacity_.size() || r.pos < 0 || r.pos >= capacity_[size_t(r.seq)])
      throw OutOfMemoryError(fmt::format("KV store: position {} of sequence {} exceeds its capacity", r.pos, r.seq));
    char* K = static_cast<char*>(k_raw(layer, r.seq));
    char* V = static_cast<char*>(v_raw(layer, r.seq));
    const int64_t hs = head_stride(r.seq), es = int64_t(dtype_size(dtype_));
    for (int g = 0; g < Hkv; ++g) {
      from_f32(dtype_, k + (int64_t(i) * Hkv + g) * D, K + (g * hs + int64_t(r.pos) * D) * es, size_t(D));
      from_f32(dtype_, v + (int64_t(i) * Hkv + g) * D, V + (g * hs + int64_t(r.pos) * D) * es, size_t(D));
    }
  }
}

}  // namespace hg
