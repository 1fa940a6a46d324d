// Contiguous host KV storage.
#include "engine/kv/kv_store.h"

#include <algorithm>
#include <cstring>

namespace hg {

void KvStore::reset(const KvShape& shape, std::span<const int32_t> capacity, MemorySystem* mem, Tier tier,
                    DType dtype, Backend* device) {
  // The same batch shape on the same memory again (a new request of the same size): keep the
  // storage — no allocation and no first-touch page faults per request. Contents are stale but
  // every position is written before it is read.
  const bool same = !buf_.empty() && mem == mem_ && tier == tier_ && device == device_ && dtype == dtype_ &&
                    shape.n_layers == shape_.n_layers && shape.H_kv == shape_.H_kv && shape.D == shape_.D &&
                    std::equal(capacity.begin(), capacity.end(), capacity_.begin(), capacity_.end());
  mem_ = mem, tier_ = tier, device_ = device;
  if (same) {
    shape_ = shape;
    return;
  }
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
        sl.tk = mem->allocate(tier, int64_t(n), MemUse::kKv);
        sl.tv = mem->allocate(tier, int64_t(n), MemUse::kKv);
        sl.k = sl.tk.data();
        sl.v = sl.tv.data();
      } else if (device) {
        sl.dk = BackendArray<char>(*device, n);
        sl.dv = BackendArray<char>(*device, n);
        sl.k = sl.dk.data();
        sl.v = sl.dv.data();
      } else {
        sl.hk = AlignedBuffer(n);
        sl.hv = AlignedBuffer(n);
        sl.k = sl.hk.data();
        sl.v = sl.hv.data();
      }
      bytes_ += int64_t(2 * n);
    }
}

void KvStore::write(int layer, std::span<const TokenRow> rows, const float* k, const float* v, Backend* be) {
  const int D = shape_.D, Hkv = shape_.H_kv;
  const int64_t row = int64_t(Hkv) * D;
  // Runs of consecutive rows of one sequence go in one call.
  for (size_t i0 = 0; i0 < rows.size();) {
    const int32_t seq = rows[i0].seq;
    if (seq < 0 || size_t(seq) >= capacity_.size())
      throw OutOfMemoryError(fmt::format("KV store: sequence {} is not in the batch", seq));
    size_t i1 = i0;
    pos_.clear();
    while (i1 < rows.size() && rows[i1].seq == seq) {
      const int32_t p = rows[i1].pos;
      if (p < 0 || p >= capacity_[size_t(seq)])
        throw OutOfMemoryError(fmt::format("KV store: position {} of sequence {} exceeds its capacity", p, seq));
      pos_.push_back(p);
      ++i1;
    }
    const int64_t n = int64_t(i1 - i0), hs = head_stride(seq);
    if (be) {
      be->write_kv(k + int64_t(i0) * row, n, Hkv, D, pos_.data(), k_raw(layer, seq), hs, dtype_);
      be->write_kv(v + int64_t(i0) * row, n, Hkv, D, pos_.data(), v_raw(layer, seq), hs, dtype_);
    } else if (!(mem_ && mem_->phantom())) {  // a dry run's values mean nothing
      write_kv_host(k + int64_t(i0) * row, n, Hkv, D, pos_.data(), k_raw(layer, seq), hs, dtype_);
      write_kv_host(v + int64_t(i0) * row, n, Hkv, D, pos_.data(), v_raw(layer, seq), hs, dtype_);
    }
    i0 = i1;
  }
}

void KvStore::copy_tokens(int layer, int src, int dst, int32_t n, Backend* be) {
  if (n > capacity(src) || n > capacity(dst))
    throw OutOfMemoryError(fmt::format("KV store: {} positions do not fit sequence {} or {}", n, src, dst));
  const int64_t es = int64_t(dtype_size(dtype_)), len = int64_t(n) * shape_.D * es;
  for (auto kv : {0, 1}) {
    const char* from = static_cast<const char*>(kv ? v_raw(layer, src) : k_raw(layer, src));
    char* to = static_cast<char*>(kv ? v_raw(layer, dst) : k_raw(layer, dst));
    for (int g = 0; g < shape_.H_kv; ++g) {
      const char* a = from + g * head_stride(src) * es;
      char* b = to + g * head_stride(dst) * es;
      if (be) be->copy(b, a, size_t(len));
      else std::memcpy(b, a, size_t(len));
    }
  }
}

}  // namespace hg
