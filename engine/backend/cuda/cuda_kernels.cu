// CUDA kernels and cuBLAS GEMM. One stream and one cuBLAS handle per thread (created lazily).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <stdexcept>
#include <string>

#include "engine/backend/cuda/cuda_kernels.h"

#define HG_CUDA_CHECK(call)                                                                             \
  do {                                                                                                  \
    cudaError_t err_ = (call);                                                                          \
    if (err_ != cudaSuccess)                                                                            \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call ": " + \
                               cudaGetErrorString(err_));                                               \
  } while (0)

#define HG_CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                   \
    cublasStatus_t st_ = (call);                                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                    \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call ": " + \
                               cublasGetStatusString(st_));                                              \
  } while (0)

#define HG_CUDA_LAUNCHED() HG_CUDA_CHECK(cudaGetLastError())

namespace hg::cuda {
namespace {

struct Ctx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  Ctx() {
    HG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    HG_CUBLAS_CHECK(cublasCreate(&blas));
    HG_CUBLAS_CHECK(cublasSetStream(blas, stream));
  }
  ~Ctx() {
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }
};
Ctx& ctx() {
  thread_local Ctx c;
  return c;
}
unsigned blocks(int64_t n, int t) { return unsigned((n + t - 1) / t); }

__global__ void f32_to_bf16_k(const float* x, __nv_bfloat16* y, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void f32_to_f16_k(const float* x, __half* y, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}

// Block-wide sum (blockDim.x a multiple of 32, ≤ 1024).
__device__ float block_sum(float v) {
  __shared__ float sh[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? sh[lane] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  v = sh[0];
  __syncthreads();
  return v;
}
__device__ float block_max(float v) {
  __shared__ float sh[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = threadIdx.x < (blockDim.x >> 5) ? sh[lane] : -FLT_MAX;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  v = sh[0];
  __syncthreads();
  return v;
}

__global__ void rms_norm_k(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float* xr = x + blockIdx.x * n;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float r = rsqrtf(ss / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[blockIdx.x * n + i] = xr[i] * r * w[i];
}

__global__ void layer_norm_k(const float* x, const float* w, const float* b, int64_t n, float eps, float* y) {
  const float* xr = x + blockIdx.x * n;
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s) / float(n);
  float v = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float r = rsqrtf(block_sum(v) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    y[blockIdx.x * n + i] = (xr[i] - mean) * r * w[i] + (b ? b[i] : 0.0f);
}

__global__ void rope_k(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const float* inv_freq,
                       bool interleaved) {
  const int half = D / 2;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // over M · n_heads · half
  if (i >= M * n_heads * half) return;
  const int k = int(i % half);
  const int64_t mh = i / half;
  const int64_t m = mh / n_heads;
  float* v = x + mh * D;
  float s, c;
  sincosf(float(pos[m]) * inv_freq[k], &s, &c);
  const int i0 = interleaved ? 2 * k : k, i1 = interleaved ? 2 * k + 1 : k + half;
  const float x0 = v[i0], x1 = v[i1];
  v[i0] = x0 * c - x1 * s;
  v[i1] = x0 * s + x1 * c;
}

__global__ void swiglu_k(const float* g, const float* u, int64_t n, float* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = g[i] / (1.0f + __expf(-g[i])) * u[i];
}
__global__ void relu_k(float* x, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = fmaxf(x[i], 0.0f);
}
__global__ void add_k(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}
__global__ void add_bias_k(float* y, const float* b, int64_t M, int64_t N) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < M * N) y[i] += b[i % N];
}

__global__ void embed_k(const void* table, int t, int64_t d, const int32_t* ids, int64_t M, float* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= M * d) return;
  const int64_t m = i / d, j = i % d, src = int64_t(ids[m]) * d + j;
  if (t == 0) y[i] = static_cast<const float*>(table)[src];
  else if (t == 1) y[i] = __half2float(static_cast<const __half*>(table)[src]);
  else y[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(table)[src]);
}

// One warp per (h, t): lanes split D.
__global__ void attention_logits_k(const float* q, const float* K, int64_t ld, int64_t n, int H, int group, int D,
                                   float scale, float* logits) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(H) * n) return;
  const int h = int(w / n);
  const int64_t t = w % n;
  const float* qh = q + int64_t(h) * D;
  const float* k = K + (int64_t(h / group) * ld + t) * D;
  float s = 0;
  for (int d = lane; d < D; d += 32) s += qh[d] * k[d];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) logits[int64_t(h) * n + t] = s * scale;
}

__global__ void scatter_k(const float* a, int64_t na, const int32_t* pos, int64_t total, int H, float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= int64_t(H) * na) return;
  const int64_t h = i / na, j = i % na;
  out[h * total + pos[j]] = a[i];
}

__global__ void softmax_rows_k(float* x, int64_t n) {
  float* r = x + blockIdx.x * n;
  float m = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
  m = block_max(m);
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (r[i] = __expf(r[i] - m));
  const float inv = 1.0f / block_sum(s);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}

// Block per head; threads over D; loop over tokens (V rows read coalesced along D).
__global__ void weighted_v_k(const float* p, const float* V, int64_t ld, int64_t n, int group, int D, float* out) {
  const int h = blockIdx.x;
  const float* ph = p + int64_t(h) * n;
  const float* v = V + int64_t(h / group) * ld * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0;
    for (int64_t t = 0; t < n; ++t) acc += ph[t] * v[t * D + d];
    out[int64_t(h) * D + d] = acc;
  }
}

__global__ void gather_rows_k(char* dst, const char* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                              int64_t n) {
  const int64_t row = blockIdx.x;
  if (row >= n) return;
  const char* s = src + int64_t(idx[row]) * src_stride;
  char* d = dst + row * row_bytes;
  for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
}

// dst[g·head_stride + pos[i]·D + d] = src[(i·H_kv + g)·D + d]: new K or V rows into the cache.
__global__ void kv_write_k(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, float* dst,
                           int64_t head_stride) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n * H_kv * D) return;
  const int64_t d = i % D, g = (i / D) % H_kv, r = i / (int64_t(D) * H_kv);
  dst[g * head_stride + int64_t(pos[r]) * D + d] = src[i];
}

}  // namespace

void device_info(std::string* name, int64_t* memory_bytes) {
  cudaDeviceProp p{};
  HG_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  *name = p.name;
  *memory_bytes = int64_t(p.totalGlobalMem);
}
void d2d(void* dst, const void* src, size_t bytes) {
  HG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx().stream));
}
void softmax_rows(float* x, int64_t rows, int64_t n) {
  if (rows == 0) return;
  softmax_rows_k<<<unsigned(rows), 256, 0, ctx().stream>>>(x, n);
  HG_CUDA_LAUNCHED();
}
void kv_write(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, float* dst, int64_t head_stride) {
  if (n == 0) return;
  kv_write_k<<<blocks(n * H_kv * D, 256), 256, 0, ctx().stream>>>(src, n, H_kv, D, pos, dst, head_stride);
  HG_CUDA_LAUNCHED();
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  HG_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void dev_free(void* p) { HG_CUDA_CHECK(cudaFree(p)); }
void* host_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  HG_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}
void host_free_pinned(void* p) { HG_CUDA_CHECK(cudaFreeHost(p)); }
void h2d(void* dst, const void* src, size_t bytes) {
  HG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx().stream));
  HG_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
}
void d2h(void* dst, const void* src, size_t bytes) {
  HG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx().stream));
  HG_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
}
void synchronize() { HG_CUDA_CHECK(cudaStreamSynchronize(ctx().stream)); }

void gemm(const float* x, int64_t M, const void* w, DType wt, int64_t N, int64_t K, const float* bias, float* y,
          void* x_half) {
  // Row-major y[M,N] = x[M,K]·W[N,K]ᵀ is column-major yᵀ[N,M] = W(K×N col-major)ᵀ · xᵀ(K×M).
  const float alpha = 1.0f, beta = 0.0f;
  auto& c = ctx();
  if (wt == DType::kF32) {
    HG_CUBLAS_CHECK(cublasSgemm(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha,
                                static_cast<const float*>(w), int(K), x, int(K), &beta, y, int(N)));
  } else {
    const bool bf = wt == DType::kBF16;
    if (bf) f32_to_bf16_k<<<blocks(M * K, 256), 256, 0, c.stream>>>(x, static_cast<__nv_bfloat16*>(x_half), M * K);
    else f32_to_f16_k<<<blocks(M * K, 256), 256, 0, c.stream>>>(x, static_cast<__half*>(x_half), M * K);
    HG_CUDA_LAUNCHED();
    const cudaDataType_t t = bf ? CUDA_R_16BF : CUDA_R_16F;
    HG_CUBLAS_CHECK(cublasGemmEx(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w, t, int(K), x_half,
                                 t, int(K), &beta, y, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (bias) add_bias(y, bias, M, N);
}

void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) {
  rms_norm_k<<<unsigned(M), 256, 0, ctx().stream>>>(x, w, n, eps, y);
  HG_CUDA_LAUNCHED();
}
void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps, float* y) {
  layer_norm_k<<<unsigned(M), 256, 0, ctx().stream>>>(x, w, b, n, eps, y);
  HG_CUDA_LAUNCHED();
}
void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const float* inv_freq, bool interleaved) {
  const int64_t n = M * n_heads * (D / 2);
  rope_k<<<blocks(n, 256), 256, 0, ctx().stream>>>(x, M, n_heads, D, pos, inv_freq, interleaved);
  HG_CUDA_LAUNCHED();
}
void swiglu(const float* gate, const float* up, int64_t n, float* y) {
  swiglu_k<<<blocks(n, 256), 256, 0, ctx().stream>>>(gate, up, n, y);
  HG_CUDA_LAUNCHED();
}
void relu(float* x, int64_t n) {
  relu_k<<<blocks(n, 256), 256, 0, ctx().stream>>>(x, n);
  HG_CUDA_LAUNCHED();
}
void add(float* y, const float* x, int64_t n) {
  add_k<<<blocks(n, 256), 256, 0, ctx().stream>>>(y, x, n);
  HG_CUDA_LAUNCHED();
}
void add_bias(float* y, const float* b, int64_t M, int64_t N) {
  add_bias_k<<<blocks(M * N, 256), 256, 0, ctx().stream>>>(y, b, M, N);
  HG_CUDA_LAUNCHED();
}
void embed(const void* table, DType t, int64_t d, const int32_t* ids, int64_t M, float* y) {
  const int code = t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2;
  embed_k<<<blocks(M * d, 256), 256, 0, ctx().stream>>>(table, code, d, ids, M, y);
  HG_CUDA_LAUNCHED();
}
void attention_logits(const float* q, const float* K, int64_t ld, int64_t n, int H, int H_kv, int D, float scale,
                      float* logits) {
  const int64_t threads = int64_t(H) * n * 32;
  attention_logits_k<<<blocks(threads, 256), 256, 0, ctx().stream>>>(q, K, ld, n, H, H / H_kv, D, scale, logits);
  HG_CUDA_LAUNCHED();
}
void concat_softmax(const float* a, int64_t na, const int32_t* a_pos, const float* b, int64_t nb, const int32_t* b_pos,
                    int H, float* out) {
  const int64_t total = na + nb;
  auto& c = ctx();
  if (na > 0) scatter_k<<<blocks(H * na, 256), 256, 0, c.stream>>>(a, na, a_pos, total, H, out);
  if (nb > 0) scatter_k<<<blocks(H * nb, 256), 256, 0, c.stream>>>(b, nb, b_pos, total, H, out);
  HG_CUDA_LAUNCHED();
  softmax_rows_k<<<unsigned(H), 256, 0, c.stream>>>(out, total);
  HG_CUDA_LAUNCHED();
}
void weighted_v_sum(const float* p, const float* V, int64_t ld, int64_t n, int H, int H_kv, int D, float* out) {
  weighted_v_k<<<unsigned(H), 128, 0, ctx().stream>>>(p, V, ld, n, H / H_kv, D, out);
  HG_CUDA_LAUNCHED();
}
void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx, int64_t n) {
  if (n == 0) return;
  gather_rows_k<<<unsigned(n), 128, 0, ctx().stream>>>(static_cast<char*>(dst), static_cast<const char*>(src),
                                                        row_bytes, src_stride, idx, n);
  HG_CUDA_LAUNCHED();
}

}  // namespace hg::cuda
