// Owned, 64-byte aligned host buffers and the Weight tensor the model formats produce.
// A Weight is immutable after load; shape is PyTorch order ([out, in] for a projection).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace hg {

// Host memory for tensors, KV stores and bandwidth probes, freed with std::free: 64-byte aligned;
// blocks of kHugePageBytes or more are aligned to that and advised as transparent huge pages.
// Random row reads (gathers) are faster from 2 MiB pages; streams are unchanged
// (docs/performance.md, "Tuning choices"). nullptr when the allocation fails.
constexpr size_t kHugePageBytes = size_t(2) << 20;
void* host_alloc(size_t bytes);
// False when the environment sets HG_NO_HUGE_PAGES (to anything but 0): then nothing is advised, for
// A/B runs against 4 KiB pages.
bool huge_pages_advised();
// madvise(MADV_HUGEPAGE) over the whole 2 MiB pages inside [p, p + bytes), for memory from other
// allocators (libnuma). Advice only: where THP is off the call changes nothing.
void advise_huge_pages(void* p, size_t bytes);

// Frees an AlignedBuffer's memory: std::free, the phantom range it is, or nothing for a view (which
// only drops its hold on the owner).
struct AlignedFree {
  size_t phantom_bytes = 0;           // nonzero: a phantom range of this size
  std::shared_ptr<const void> owner;  // set: a view into memory this keeps alive (a file mapping)
  void operator()(void* p) const;
};

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  // A buffer of `bytes` in phantom memory (engine/core/phantom.h): dry runs' weights.
  static AlignedBuffer phantom(size_t bytes);
  // A read-only view of `bytes` at p, which `owner` keeps valid (a weight mapped from its file).
  static AlignedBuffer view(const void* p, size_t bytes, std::shared_ptr<const void> owner);
  bool is_view() const { return ptr_ && ptr_.get_deleter().owner != nullptr; }
  void* data() { return ptr_.get(); }
  const void* data() const { return ptr_.get(); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }

 private:
  std::unique_ptr<void, AlignedFree> ptr_;
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
  bool mapped() const { return buf.is_view(); }  // a view of the model file's mapping, not a copy
};

// Allocates a weight of the given type and shape (uninitialised; in phantom memory when `phantom`).
Weight make_weight(DType t, std::vector<int64_t> shape, bool phantom = false);
// Weight rows per parallel task of the CPU decode GEMV. The pool's threads take contiguous runs of
// these blocks (parallel_chunks), and convert_weight writes each run with the thread that will read
// it: on a multi-node machine the first touch puts a thread's rows on its node.
constexpr int64_t kWeightRowBlock = 64;
// Copies n values of `from` into a new weight converted to `to`, a bounded chunk at a time, rows
// split across the pool as the decode GEMV splits them; consumed(offset, bytes) is told each chunk
// of `src` once it is no longer needed (a loader releases those pages of its file mapping, so a
// large tensor is not resident twice). consumed may be called from several threads at once.
Weight convert_weight(DType from, const void* src, DType to, std::vector<int64_t> shape,
                      const std::function<void(size_t, size_t)>& consumed = {});
// A weight over `src` itself (no copy; read-only), kept valid by `owner`.
Weight view_weight(DType t, std::vector<int64_t> shape, const void* src, std::shared_ptr<const void> owner);
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace hg
