// Aligned buffers and weight helpers.
#include "engine/core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string_view>

#include "engine/core/error.h"
#include "engine/core/phantom.h"
#include "engine/core/thread_pool.h"

namespace hg {

bool huge_pages_advised() {
  static const bool on = [] {
    const char* v = std::getenv("HG_NO_HUGE_PAGES");
    return !(v && *v && std::string_view(v) != "0");
  }();
  return on;
}

void advise_huge_pages(void* p, size_t bytes) {
  if (!huge_pages_advised()) return;
  const auto b = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (b + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t last = (b + bytes) / kHugePageBytes * kHugePageBytes;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

void* host_alloc(size_t bytes) {
  const size_t align = bytes >= kHugePageBytes ? kHugePageBytes : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
  if (p && align == kHugePageBytes) advise_huge_pages(p, rounded);  // before the first touch
  return p;
}

AlignedBuffer::AlignedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  ptr_.reset(host_alloc(bytes));
  if (!ptr_) throw OutOfMemoryError(fmt::format("host allocation of {} bytes failed", bytes));
}

AlignedBuffer AlignedBuffer::phantom(size_t bytes) {
  AlignedBuffer b;
  b.bytes_ = bytes;
  if (bytes == 0) return b;
  b.ptr_ = std::unique_ptr<void, AlignedFree>(phantom_alloc(bytes), AlignedFree{bytes, nullptr});
  if (!b.ptr_) throw OutOfMemoryError(fmt::format("phantom mapping of {} bytes failed", bytes));
  return b;
}

AlignedBuffer AlignedBuffer::view(const void* p, size_t bytes, std::shared_ptr<const void> owner) {
  AlignedBuffer b;
  b.bytes_ = bytes;
  if (bytes == 0) return b;
  HG_CHECK(owner != nullptr);
  b.ptr_ = std::unique_ptr<void, AlignedFree>(const_cast<void*>(p), AlignedFree{0, std::move(owner)});
  return b;
}

void AlignedFree::operator()(void* p) const {
  if (owner) return;
  if (phantom_bytes) phantom_free(p, phantom_bytes);
  else std::free(p);
}

int64_t Weight::numel() const {
  int64_t n = shape.empty() ? 0 : 1;
  for (auto d : shape) n *= d;
  return n;
}

const float* Weight::f32() const {
  if (dtype != DType::kF32) throw std::logic_error("weight is not f32");
  return static_cast<const float*>(buf.data());
}

Weight make_weight(DType t, std::vector<int64_t> shape, bool phantom) {
  Weight w;
  w.dtype = t;
  w.shape = std::move(shape);
  const size_t bytes = size_t(w.numel()) * dtype_size(t);
  w.buf = phantom ? AlignedBuffer::phantom(bytes) : AlignedBuffer(bytes);
  return w;
}

Weight convert_weight(DType from, const void* src, DType to, std::vector<int64_t> shape,
                      const std::function<void(size_t, size_t)>& consumed) {
  Weight w = make_weight(to, std::move(shape));
  const size_t n = size_t(w.numel()), in = dtype_size(from), out = dtype_size(to);
  const int64_t rows = w.shape.size() >= 2 ? w.shape[0] : 1;
  const size_t row = rows > 0 ? n / size_t(rows) : 0;  // values per row
  constexpr size_t kChunk = size_t(4) << 20;  // values per step and thread: a bounded scratch and release
  parallel_chunks((rows + kWeightRowBlock - 1) / kWeightRowBlock, [&](int64_t b, int64_t e) {
    const size_t first = size_t(b * kWeightRowBlock) * row, last = size_t(std::min(rows, e * kWeightRowBlock)) * row;
    std::vector<float> tmp;
    for (size_t i = first; i < last; i += kChunk) {
      const size_t c = std::min(kChunk, last - i);
      const auto* s = static_cast<const char*>(src) + i * in;
      char* d = static_cast<char*>(w.buf.data()) + i * out;
      if (from == to) {
        std::memcpy(d, s, c * out);
      } else if (to == DType::kF32) {
        to_f32(from, s, reinterpret_cast<float*>(d), c);
      } else {
        tmp.resize(c);
        to_f32(from, s, tmp.data(), c);
        from_f32(to, tmp.data(), d, c);
      }
      if (consumed) consumed(i * in, c * in);
    }
  });
  return w;
}

Weight view_weight(DType t, std::vector<int64_t> shape, const void* src, std::shared_ptr<const void> owner) {
  Weight w;
  w.dtype = t;
  w.shape = std::move(shape);
  w.buf = AlignedBuffer::view(src, size_t(w.numel()) * dtype_size(t), std::move(owner));
  return w;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace hg
