// Slot storage.
#include "engine/kv/slot_store.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "engine/core/error.h"

namespace hg {

void SlotStore::reset(const KvShape& shape, std::span<const int32_t> slots, MemorySystem& mem, Tier tier,
                      Backend* device, DType dtype, int gpu_layers) {
  shape_ = shape;
  dtype_ = dtype;
  tier_ = tier;
  gpu_layers_ = std::clamp(gpu_layers, 0, shape.n_layers);
  device_ = device && !device->host_memory() ? device : nullptr;
  phantom_ = mem.phantom();
  cap_.assign(slots.begin(), slots.end());
  k_.clear();
  v_.clear();
  bytes_ = 0;
  for (int l = 0; l < shape.n_layers; ++l)
    for (size_t b = 0; b < cap_.size(); ++b) {
      const int64_t n = int64_t(shape.H_kv) * cap_[b] * shape.D * elem_bytes();
      k_.push_back(mem.allocate(this->tier(l), n, MemUse::kKv));
      v_.push_back(mem.allocate(this->tier(l), n, MemUse::kKv));
      bytes_ += 2 * n;
    }
  pos_.assign(size_t(shape.n_layers) * cap_.size() * size_t(shape.H_kv), {});
  count_.assign(pos_.size(), 0);
  for (int l = 0; l < shape.n_layers; ++l)
    for (size_t b = 0; b < cap_.size(); ++b)
      for (int g = 0; g < shape.H_kv; ++g) pos_[idx(l, int(b), g)].assign(size_t(cap_[b]), -1);
}

int32_t SlotStore::insert(int layer, int seq, int g, int32_t pos, const float* k_row, const float* v_row) {
  const size_t i = idx(layer, seq, g);
  if (count_[i] >= cap_[size_t(seq)])
    throw OutOfMemoryError(fmt::format("slot store: head {} of layer {} of sequence {} is full ({} slots)", g, layer,
                                       seq, cap_[size_t(seq)]));
  const int32_t s = count_[i]++;
  const int64_t head = g * head_stride(seq) * elem_bytes();
  put_row(layer, static_cast<char*>(k_raw(layer, seq)) + head, s, k_row);
  put_row(layer, static_cast<char*>(v_raw(layer, seq)) + head, s, v_row);
  pos_[i][size_t(s)] = pos;
  return s;
}

void write_head_slots(Backend* device, const float* k_row, const float* v_row, int H_kv, int D, const int32_t* slots,
                      int32_t cap, void* K, void* V, DType dt, std::vector<int32_t>& rows) {
  rows.resize(size_t(H_kv));
  for (int g = 0; g < H_kv; ++g) rows[size_t(g)] = g * cap + slots[g];
  if (device) {
    device->write_kv(k_row, H_kv, 1, D, rows.data(), K, 0, dt);
    device->write_kv(v_row, H_kv, 1, D, rows.data(), V, 0, dt);
  } else {
    write_kv_host(k_row, H_kv, 1, D, rows.data(), K, 0, dt);
    write_kv_host(v_row, H_kv, 1, D, rows.data(), V, 0, dt);
  }
}

void SlotStore::insert_heads(int layer, int seq, int32_t pos, const float* k_row, const float* v_row,
                             int32_t* slots) {
  const int32_t cap = cap_[size_t(seq)];
  for (int g = 0; g < shape_.H_kv; ++g) {
    const size_t i = idx(layer, seq, g);
    if (count_[i] >= cap)
      throw OutOfMemoryError(fmt::format("slot store: head {} of layer {} of sequence {} is full ({} slots)", g,
                                         layer, seq, cap));
    slots[g] = count_[i]++;
    pos_[i][size_t(slots[g])] = pos;
  }
  if (!phantom_)
    write_head_slots(device(layer), k_row, v_row, shape_.H_kv, shape_.D, slots, cap, k_raw(layer, seq),
                     v_raw(layer, seq), dtype_, heads_pos_);
}

void SlotStore::remove_deferred(int layer, int seq, int g, std::span<const int32_t> victims,
                                std::vector<int32_t>& moved) {
  const size_t i = idx(layer, seq, g);
  const int32_t n0 = count_[i];
  origin_.resize(size_t(n0));
  std::iota(origin_.begin(), origin_.end(), 0);
  moved.resize(victims.size());
  for (size_t v = 0; v < victims.size(); ++v) {
    const int32_t slot = victims[v];
    HG_CHECK(slot >= 0 && slot < count_[i]);
    const int32_t last = --count_[i];
    if (slot != last) {
      origin_[size_t(slot)] = origin_[size_t(last)];
      pos_[i][size_t(slot)] = pos_[i][size_t(last)];
    }
    pos_[i][size_t(last)] = -1;
    moved[v] = last;
  }
  if (phantom_) return;
  // A row's data only moves from the last live slot, which is then past the final count: every
  // origin read is at or past it, every destination before it, so the moves commute.
  const int64_t es = elem_bytes(), row = int64_t(shape_.D) * es, head = g * head_stride(seq) * es;
  char* K = static_cast<char*>(k_raw(layer, seq)) + head;
  char* V = static_cast<char*>(v_raw(layer, seq)) + head;
  for (int32_t s = 0; s < count_[i]; ++s)
    if (const int32_t o = origin_[size_t(s)]; o != s) {
      pending_.add(K + s * row, K + o * row);
      pending_.add(V + s * row, V + o * row);
    }
}

void SlotStore::flush_removals(int layer) {
  if (pending_.dst.empty()) return;
  const int64_t row = int64_t(shape_.D) * elem_bytes();
  if (Backend* d = device(layer))
    pending_.run(*d, row);
  else
    for (size_t j = 0; j < pending_.dst.size(); ++j) std::memcpy(pending_.dst[j], pending_.src[j], size_t(row));
  pending_.clear();
}

int32_t SlotStore::remove(int layer, int seq, int g, int32_t slot) {
  const size_t i = idx(layer, seq, g);
  HG_CHECK(slot >= 0 && slot < count_[i]);
  const int32_t last = --count_[i];
  if (slot != last) {
    const int64_t row = int64_t(shape_.D) * elem_bytes();
    char* K = static_cast<char*>(k_raw(layer, seq)) + g * head_stride(seq) * elem_bytes();
    char* V = static_cast<char*>(v_raw(layer, seq)) + g * head_stride(seq) * elem_bytes();
    copy_row(layer, K + int64_t(slot) * row, K + int64_t(last) * row);
    copy_row(layer, V + int64_t(slot) * row, V + int64_t(last) * row);
    pos_[i][size_t(slot)] = pos_[i][size_t(last)];
  }
  pos_[i][size_t(last)] = -1;
  return last;
}

void SlotStore::copy_sequence(int layer, int src, int dst) {
  const int64_t es = elem_bytes(), row = int64_t(shape_.D) * es;
  for (int g = 0; g < shape_.H_kv; ++g) {
    const size_t i = idx(layer, src, g), j = idx(layer, dst, g);
    const int32_t n = count_[i];
    if (n > cap_[size_t(dst)])
      throw OutOfMemoryError(fmt::format("slot store: {} slots do not fit sequence {} ({} slots)", n, dst, cap_[size_t(dst)]));
    for (auto kv : {0, 1}) {
      const char* a = static_cast<const char*>(kv ? v_raw(layer, src) : k_raw(layer, src)) + g * head_stride(src) * es;
      char* b = static_cast<char*>(kv ? v_raw(layer, dst) : k_raw(layer, dst)) + g * head_stride(dst) * es;
      if (phantom_) continue;
      if (Backend* d = device(layer))
        d->copy(b, a, size_t(n * row));
      else std::memcpy(b, a, size_t(n * row));
    }
    std::fill(pos_[j].begin(), pos_[j].end(), -1);
    std::copy(pos_[i].begin(), pos_[i].begin() + n, pos_[j].begin());
    count_[j] = n;
  }
}

void SlotStore::copy_row(int layer, void* dst, const void* src) const {
  if (phantom_) return;
  const size_t n = size_t(shape_.D) * size_t(elem_bytes());
  if (Backend* d = device(layer))
    d->copy(dst, src, n);
  else std::memcpy(dst, src, n);
}

void SlotStore::put_row(int layer, void* head, int32_t slot, const float* row) const {
  if (phantom_) return;
  if (dtype_ == DType::kF32)
    return copy_row(layer, static_cast<float*>(head) + int64_t(slot) * shape_.D, row);
  if (Backend* d = device(layer))
    d->write_kv(row, 1, 1, shape_.D, &slot, head, 0, dtype_);
  else write_kv_host(row, 1, 1, shape_.D, &slot, head, 0, dtype_);
}

}  // namespace hg
