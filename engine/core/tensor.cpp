// Aligned buffers and weight helpers.
#include "engine/core/tensor.h"

#include <new>

#include "engine/core/error.h"

namespace hg {

AlignedBuffer::AlignedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw OutOfMemoryError(fmt::format("host allocation of {} bytes failed", bytes));
  ptr_.reset(p);
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

Weight make_weight(DType t, std::vector<int64_t> shape) {
  Weight w;
  w.dtype = t;
  w.shape = std::move(shape);
  w.buf = AlignedBuffer(size_t(w.numel()) * dtype_size(t));
  return w;
}

Weight convert_weight(DType from, const void* src, DType to, std::vector<int64_t> shape) {
  Weight w = make_weight(to, std::move(shape));
  const size_t n = size_t(w.numel());
  if (from == to) {
    std::memcpy(w.buf.data(), src, n * dtype_size(to));
  } else if (to == DType::kF32) {
    to_f32(from, src, static_cast<float*>(w.buf.data()), n);
  } else {
    std::vector<float> tmp(n);
    to_f32(from, src, tmp.data(), n);
    from_f32(to, tmp.data(), w.buf.data(), n);
  }
  return w;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace hg
