// CUDA backend kernels behind a plain C++ interface (no CUDA types here): device buffers are raw
// pointers, the stream is the backend's own. Every CUDA and cuBLAS call is checked; a failure
// throws std::runtime_error with file and line. Compiled whenever nvcc exists; run only with a
// device (tests/unit/test_cuda_kernels.cpp checks each kernel against the CPU backend).
// Shapes use the engine's vocabulary: M rows, K in, N out, H query heads, H_kv KV heads, D head dim.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/dtype.h"

namespace hg::cuda {

int device_count();
// Opens cuBLAS (libcublas.so.<major>, found like any shared library) if it is not open yet and
// returns its version; throws std::runtime_error naming the library when it cannot. The first CUDA
// context does this itself: cuBLAS is not linked, so processes that never use it do not hold it.
int open_cublas();
void* dev_alloc(size_t bytes);
void dev_free(void* p);
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* p);
// Pins and maps existing host memory (cudaHostRegisterMapped) and undoes it.
void host_register(void* p, size_t bytes);
void host_unregister(void* p);
void h2d(void* dst, const void* src, size_t bytes);
void d2h(void* dst, const void* src, size_t bytes);
void synchronize();
// Device 0's name and memory.
void device_info(std::string* name, int64_t* memory_bytes);
// Device-to-device copy on the stream (asynchronous).
void d2d(void* dst, const void* src, size_t bytes);
// In place softmax over each of `rows` rows of length n.
void softmax_rows(float* x, int64_t rows, int64_t n);
// The same over rows ld floats apart.
void softmax_rows_ld(float* x, int64_t rows, int64_t n, int64_t ld);
// The largest of x[0, n) (NaN skipped, -inf when none) and Σ exp(x[i] - shift) (x overwritten with
// the terms): one block each; waits for the stream and returns the scalar to the host.
float max_value(const float* x, int64_t n);
float exp_shift_sum(float* x, int64_t n, float shift);
// KV caches hold F32, F16 or BF16 elements (`kv`/`kt`/`vt` below: the cache's type); every
// kernel reads them as F32 and accumulates in F32, as the CPU backend does.
// K or V rows of n new tokens into a cache: dst[g·head_stride + pos[i]·D + d] = src[(i·H_kv + g)·D + d]
// (src [n, H_kv, D] F32, rounded to nearest into dt; pos on the device).
void kv_write(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst, int64_t head_stride,
              DType dt);
// dst[i] = src[i] as F32, i < n (src of type st).
void to_f32(const void* src, DType st, int64_t n, float* dst);

// y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]); W F32, BF16 or F16 with F32 accumulation (cuBLAS).
// For BF16/F16 weights x is converted on the device into `x_half` (M·K halves of scratch).
void gemm(const float* x, int64_t M, const void* w, DType wt, int64_t N, int64_t K, const float* bias, float* y,
          void* x_half);
void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y);
void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps, float* y);
// In place on x[M, n_heads, D]; inv_freq[D/2] on the device; interleaved or rotate-half pairs.
void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const float* inv_freq, bool interleaved);
void swiglu(const float* gate, const float* up, int64_t n, float* y);
void relu(float* x, int64_t n);
void add(float* y, const float* x, int64_t n);           // y += x
void add_bias(float* y, const float* b, int64_t M, int64_t N);  // y[m, :] += b
// y[m, :] = table[ids[m], :] as F32.
void embed(const void* table, DType t, int64_t d, const int32_t* ids, int64_t M, float* y);
// logits[h, t] = scale · q[h] · K[h / (H / H_kv), t], t < n; K [H_kv, ld, D] (ld ≥ n rows per head).
// logits_ld: distance between the rows of logits (default n).
void attention_logits(const float* q, const void* K, DType kt, int64_t ld, int64_t n, int H, int H_kv, int D,
                      float scale, float* logits, int64_t logits_ld = -1);
// Token concatenation + softmax: out[h, a_pos[i]] = a[h, i], out[h, b_pos[j]] = b[h, j]
// (a_pos/b_pos give each part's token-order slots, together a permutation of [0, na + nb)), then
// softmax over each row of out [H, na + nb].
void concat_softmax(const float* a, int64_t na, const int32_t* a_pos, const float* b, int64_t nb, const int32_t* b_pos,
                    int H, float* out);
// out[h, :] = Σ_t p[h, t] · V[h / (H / H_kv), t, :]; V [H_kv, ld, D].
// p_ld: distance between the rows of p (default n).
void weighted_v_sum(const float* p, const void* V, DType vt, int64_t ld, int64_t n, int H, int H_kv, int D,
                    float* out, int64_t p_ld = -1);
// Decode attention of one query row: out [H, D] over n keys and values K, V [H_kv, ld, D] (flash
// decoding: chunks of keys in one pass each, merged by log-sum-exp; the three-kernel path for
// shapes the float4 kernels do not take).
void decode_attention(const float* q, const void* K, const void* V, DType kv, int64_t ld, int64_t n, int H,
                      int H_kv, int D, float scale, float* out);
// One query row of attention_rows: q, out [H, D]; K, V [H_kv, ld, D], the first n rows attended.
struct AttnRowDev {
  const float* q;
  const void* k;  // of the call's KV type
  const void* v;
  float* out;
  int64_t ld;
  int64_t n;
};
// Every row in one pair of launches (prefill: the rows of a forward chunk); `rows` is a host array.
void attention_rows(const AttnRowDev* rows, int n_rows, int H, int H_kv, int D, float scale, DType kv);
// Backend::merged_attention: la [H, na] and Va [H_kv, na, D]; Kb, Vb [H_kv, ld_b, D] (nb rows); out [H, D].
// lb: set B's logits [H, nb] when computed already (else from q and Kb).
void merged_attention(const float* q, int H, int H_kv, int D, float scale, const float* la, const void* Va,
                      int64_t na, const void* Kb, const void* Vb, int64_t ld_b, int64_t nb, const float* lb,
                      float* out, DType kv);
// A strided device-to-device copy on the stream (asynchronous).
void d2d_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows);
// Strided copies (cudaMemcpy2D) that wait for completion.
void h2d_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows);
void d2h_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows);
// dst row i = src row idx[i] (row_bytes each; src rows src_stride bytes apart).
void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx, int64_t n);
// The same with idx a host array (copied to this thread's scratch first). src may be pinned host
// memory (mapped into the device's address space with unified addressing).
// Row i from src[i] to dst[i] (row_bytes each); dst and src are host arrays of device (or mapped
// host) pointers, uploaded together through a scratch buffer.
void copy_rows_host_ptrs(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n);
void gather_rows_host_idx(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                          int64_t n);

// Eviction score records (PolicyOps::ScoreSlot, the same layout) and their ops: accumulate_scores
// (rule 0: add the taps; 1: Keyformer's Gumbel softmax), pick_evictions and put_rows, each with
// its descriptors a host array uploaded without a wait.
struct ScoreSlotDev {
  double score;
  int32_t pos;
  int32_t unused;
};
struct ScoreRowDev {
  ScoreSlotDev* slots;
  int64_t slot_ld;
  int32_t n;
  int32_t pos;
  double tau;
};
void accumulate_scores(int rule, int H, int H_kv, const float* taps, int64_t tap_ld, uint64_t seed, int layer,
                       const ScoreRowDev* rows, int64_t n_rows);
struct EvictionPickDev {
  const ScoreSlotDev* slots;
  int32_t n, recent, count;
  int64_t at;
};
void pick_evictions(const EvictionPickDev* picks, int64_t n_picks, int32_t* out);
void put_rows(void* const* dst, const void* src, int64_t row_bytes, int64_t n);
struct ScorePoolDev {
  ScoreSlotDev* slots;
  int32_t n;
};
void pool_scores(const ScorePoolDev* items, int64_t n_items, int kernel, bool max);

}  // namespace hg::cuda
