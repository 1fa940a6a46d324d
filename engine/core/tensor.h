// Owned, 64-byte aligned host buffers and the Weight tensor the model formats produce.
// A Weight is immutable after load; shape is PyTorch order ([out, in] for a projection).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace hg {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  void* data() { return ptr_.get(); }
  const void* data() const { return ptr_.get(); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
  size_t bytes_ = 0;
};

struct Weight {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // PyTorch order: [rows, cols] for matrices, [n] for vectors
  AlignedBuffer buf;

  bool empty() const { return buf.empty(); }
  int64_t numel() const;
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? (shape.empty() ? 0 : shape[0]) : shape[1]; }
  const float* f32() const;  // throws unless dtype is F32
  template <typename T>
  const T* as() const { return static_cast<const T*>(buf.data()); }
  size_t bytes() const { return buf.bytes(); }
};

// Allocates a weight of the given type and shape (uninitialised).
Weight make_weight(DType t, std::vector<int64_t> shape);
// Copies n values of `from` into a new weight converted to `to`.
Weight convert_weight(DType from, const void* src, DType to, std::vector<int64_t> shape);
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace hg
