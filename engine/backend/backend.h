// Backend: the math the decoder and the strategies call. `ref` is a scalar, double-accumulating
// oracle; `cpu` uses oneDNN matmul and AVX-512 kernels; `cuda` is listed always and says at run
// time when it is not compiled in or no device exists. Buffers are plain row-major F32 arrays;
// weights are F32 or BF16 [N, K] (PyTorch [out, in]). Backends hold scratch space, so one
// backend object is used by one thread at a time; kernels parallelise internally.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/policy_ops.h"
#include "engine/core/model.h"

namespace hg {

// Rotation frequencies for RoPE: angle(pos, i) = pos * inv_freq[i], i < D/2.
struct RopeTable {
  RopeStyle style = RopeStyle::kHalf;
  std::vector<double> inv_freq;
};
// theta^(-2i/D), then Llama-3 scaling (rope_scaling) or division by GGUF rope_freqs factors.
RopeTable make_rope_table(const HParams& hp, const std::vector<float>& freq_factors);

// One query row of attention: keys/values of its sequence, D-contiguous rows per KV head, of
// element type AttentionArgs::kv_dtype. K element (g, t, d) lives at k[g * head_stride + t * D + d]
// (in elements); same for V. The row attends to keys [0, n_keys).
struct AttnRow {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t head_stride = 0;
  int32_t n_keys = 0;
};

struct AttentionArgs {
  int n_rows = 0;
  int H = 0, H_kv = 0, D = 0;
  float scale = 1.0f;
  const float* q = nullptr;      // [n_rows, H, D]
  const AttnRow* rows = nullptr; // [n_rows]
  DType kv_dtype = DType::kF32;  // element type of every row's K and V
  float* out = nullptr;          // [n_rows, H, D]
  // Optional taps, [n_rows, H, tap_ld]: scaled pre-softmax logits and post-softmax probabilities
  // of each row's keys (H2O and Keyformer scores).
  float* logits_out = nullptr;
  float* probs_out = nullptr;
  int64_t tap_ld = 0;
};

// AttentionArgs for `rows` (taps off).
AttentionArgs attention_args(int H, int H_kv, int D, float scale, const float* q, std::span<const AttnRow> rows,
                             float* out, DType kv_dtype = DType::kF32);

// The model ops every backend implements, its memory, and (from PolicyOps, policy_ops.h) the
// kernels strategies' policies call, each with a reference default.
class Backend : public PolicyOps {
 public:
  virtual std::string_view name() const = 0;
  // y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]).
  virtual void matmul(const float* x, int64_t M, const Weight& w, const float* bias, float* y) = 0;
  // y = x / rms(x) * w, row-wise over n columns.
  virtual void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) = 0;
  // y = (x - mean) / sqrt(var + eps) * w + b, row-wise.
  virtual void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps,
                          float* y) = 0;
  // In place on x[M, n_heads, D]; row m rotates by position pos[m].
  virtual void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const RopeTable& t) = 0;
  // y = silu(gate) * up.
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* y) = 0;
  virtual void relu(float* x, int64_t n) = 0;
  // y += x.
  virtual void add(float* y, const float* x, int64_t n) = 0;
  // y[m, :] = table[ids[m], :] converted to F32; an out-of-range id is an InputError.
  virtual void embed(const Weight& table, const int32_t* ids, int64_t M, float* y) = 0;
  // Softmax attention per row and query head; query head h uses KV head h / (H / H_kv).
  virtual void attention(const AttentionArgs& a) = 0;

  // dst[i] = src[i] as F32, i < n (src of type st; both in this backend's memory).
  virtual void convert_to_f32(const void* src, DType st, int64_t n, float* dst);

  // K or V rows of n new tokens of one sequence into its cache: element (g, pos[i], d) at
  // g·head_stride + pos[i]·D + d of `dst` (type dt), from src [n, H_kv, D] F32. pos is a host array.
  virtual void write_kv(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst,
                        int64_t head_stride, DType dt);

  // The caller is about to free `w`, a weight it made itself (not the model's): a backend that
  // keeps copies of weights by their host address drops its copy (the address may come back with
  // other contents).
  virtual void forget_weight(const Weight&) {}

  // Memory the ops compute on. Host backends (cpu, ref, null) use host memory. The `cuda` backend
  // uses device memory: every float*/void* buffer argument above is then a device pointer, except
  // these host-side arguments — Weight objects, norm weights and biases (model-owned host arrays,
  // uploaded on first use and cached), embed ids, rope positions, write_kv positions, and the
  // AttentionArgs::rows array itself (its k/v pointers are device memory).
  // host_memory() (declared in PolicyOps, whose references read host memory): true here.
  virtual void* alloc(size_t bytes);
  virtual void free(void* p);
  virtual void upload(void* dst, const void* src, size_t bytes);    // host → backend memory
  virtual void download(void* dst, const void* src, size_t bytes);  // backend memory → host; waits
  virtual void copy(void* dst, const void* src, size_t bytes);      // within backend memory
  // Strided forms: `rows` rows of `width` bytes, dst_pitch / src_pitch bytes apart.
  virtual void upload_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                         size_t rows);
  virtual void download_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                           size_t rows);
  // Waits until the work this thread queued on the backend has finished (a no-op on host backends,
  // whose ops return when done). Another thread's copy may then read or overwrite its buffers.
  virtual void synchronize() {}
  // Host memory this backend copies to and from fastest (pinned for cuda; plain for host backends).
  // A backend with memory of its own also reads it in gather_rows (mapped, by DMA).
  virtual void* alloc_host(size_t bytes) { return Backend::alloc(bytes); }
  virtual void free_host(void* p) { Backend::free(p); }
  // Maps host memory allocated elsewhere (the far tier's NUMA node) for gather_rows as alloc_host's
  // is, and unmaps it before it is freed (cudaHostRegister; nothing for host backends).
  virtual void register_host(void*, size_t) {}
  virtual void unregister_host(void*) {}
  // The device this backend computes on ("" for the host) and its memory (0 for the host).
  virtual std::string device_name() const { return ""; }
  virtual int64_t device_memory_bytes() const { return 0; }
};

// An array of T in a backend's memory (host or device), freed with it. Move-only.
template <typename T>
class BackendArray {
 public:
  BackendArray() = default;
  BackendArray(Backend& be, size_t n) : be_(&be), n_(n), p_(n ? static_cast<T*>(be.alloc(n * sizeof(T))) : nullptr) {}
  BackendArray(BackendArray&& o) noexcept { *this = std::move(o); }
  BackendArray& operator=(BackendArray&& o) noexcept {
    if (this != &o) {
      release();
      be_ = o.be_, n_ = o.n_, p_ = o.p_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  ~BackendArray() { release(); }
  T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_) be_->free(p_);
    p_ = nullptr;
  }
  Backend* be_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

// Rows gathered from many places as (destination, source) pairs, moved by one Backend::copy_rows.
struct RowCopies {
  std::vector<void*> dst;
  std::vector<const void*> src;
  void clear() { dst.clear(), src.clear(); }
  void add(void* to, const void* from) { dst.push_back(to), src.push_back(from); }
  void run(Backend& be, int64_t row_bytes) const { be.copy_rows(dst.data(), src.data(), row_bytes, int64_t(dst.size())); }
};

// The host implementation of Backend::write_kv (also used by KvStore without a backend).
void write_kv_host(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst, int64_t head_stride,
                   DType dt);

// Backend names: "cpu", "ref", "cuda", "null" (no-op ops; overhead measurement only). Throws UnsupportedError for cuda when not compiled in or
// no device, InputError for an unknown name.
std::unique_ptr<Backend> make_backend(std::string_view name);
std::vector<std::string> backend_names();
bool cuda_compiled();
// CUDA devices visible to this build (0 without CUDA support or without a device).
int cuda_device_count_or_zero();

std::unique_ptr<Backend> make_ref_backend();
std::unique_ptr<Backend> make_cpu_backend();
// Every op a no-op: for measuring the harness's own per-step overhead (engine/backend/null/).
std::unique_ptr<Backend> make_null_backend();
// The CUDA backend on device 0 (engine/backend/cuda/cuda_backend.cpp); only in CUDA builds —
// call make_backend("cuda"), which says why when it is not available.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace hg
