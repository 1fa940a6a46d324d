// CUDA kernels and cuBLAS GEMM. One stream and one cuBLAS handle per thread (created lazily).
#include <cublas_v2.h>
#include <dlfcn.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>
#include <type_traits>

#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/backend/gumbel.h"

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
                               cublas().status_string(st_));                                             \
  } while (0)

#define HG_CUDA_LAUNCHED() HG_CUDA_CHECK(cudaGetLastError())

namespace hg::cuda {
namespace {

// cuBLAS is opened when the first CUDA context needs it, not linked: a process that links it holds
// about 150 MB more resident memory from start-up (its initialisers), GPU or not.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  // cublasGemmEx is overloaded in the header (an inline wrapper for an older compute-type argument).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasGetProperty) get_property = nullptr;
};

const CublasApi& cublas() {
  static const CublasApi api = [] {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error("cannot open " + name + " (cuBLAS): " + dlerror());
    CublasApi a;
    auto bind = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (!fn) throw std::runtime_error(name + " has no " + symbol);
    };
    bind(a.create, "cublasCreate_v2");
    bind(a.destroy, "cublasDestroy_v2");
    bind(a.set_stream, "cublasSetStream_v2");
    bind(a.sgemm, "cublasSgemm_v2");
    bind(a.gemm_ex, "cublasGemmEx");
    bind(a.status_string, "cublasGetStatusString");
    bind(a.get_property, "cublasGetProperty");
    return a;
  }();
  return api;
}

struct Ctx {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  // Grow-only device scratch buffers of this thread's kernels: 0 weighted_v_sum's partial sums,
  // 1 merged_attention's logits, 2 its second output, 3 and 4 decode_attention's partial outputs
  // and their (max, sum) pairs, 5 attention_rows' row descriptors, 6 gather_rows_host_idx's
  // indices, 7 max_value's and exp_shift_sum's result, 8 copy_rows_host_ptrs' pointer lists,
  // 9 accumulate_scores' rows, 10 its softmax scratch, 11 pick_evictions' picks and cuts,
  // 12 put_rows' pointers and rows, 13 pool_scores' items and input scores.
  float* buf[14] = {};
  size_t buf_floats[14] = {};
  Ctx() {
    HG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    HG_CUBLAS_CHECK(cublas().create(&blas));
    HG_CUBLAS_CHECK(cublas().set_stream(blas, stream));
  }
  ~Ctx() {
    for (float* b : buf)
      if (b) cudaFree(b);
    if (blas) cublas().destroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }
  float* scratch(int i, size_t floats) {
    if (buf_floats[i] < floats) {
      HG_CUDA_CHECK(cudaStreamSynchronize(stream));  // queued work may still read the old buffer
      if (buf[i]) HG_CUDA_CHECK(cudaFree(buf[i]));
      buf[i] = nullptr;
      buf_floats[i] = std::max(floats, 2 * buf_floats[i]);
      HG_CUDA_CHECK(cudaMalloc(&buf[i], buf_floats[i] * sizeof(float)));
    }
    return buf[i];
  }
};
Ctx& ctx() {
  thread_local Ctx c;
  return c;
}
unsigned blocks(int64_t n, int t) { return unsigned((n + t - 1) / t); }
// Threads of a row-wise norm's block (one block per row): enough that each reads a few elements,
// since one decode row is one block (docs/performance.md, "Tuning choices").
unsigned norm_threads(int64_t n) { return n >= 4096 ? 1024u : n >= 1024 ? 512u : 256u; }

__global__ void f32_to_bf16_k(const float* x, __nv_bfloat16* y, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void f32_to_f16_k(const float* x, __half* y, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}

// Decode GEMV for half-precision weights: y[n] = W[n, :] · x (+ bias[n]), W BF16 or F16 [N, K], x
// F32 read as it is (no conversion pass, no rounding of x). One warp per kGemvRows rows; each lane
// reads 8 weights (16 bytes) per row and step, the rows side by side and kGemvUnroll steps
// unrolled, so that several 16-byte loads per lane are in flight. K % 8 == 0 (16-byte rows).
constexpr int kGemvWarps = 8;
// The 8 half-precision values of a 16-byte load as floats (T: __half or __nv_bfloat16).
template <typename T>
__device__ inline void widen8(const uint4 u, float* f) {
  constexpr bool kF16 = std::is_same_v<T, __half>;
  using T2 = std::conditional_t<kF16, __half2, __nv_bfloat162>;
  const T2* h = reinterpret_cast<const T2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 v;
    if constexpr (kF16) v = __half22float2(h[i]);
    else v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x, f[2 * i + 1] = v.y;
  }
}
template <typename T, int kGemvRows, int kGemvUnroll>
__global__ void gemv_half_k(const T* W, const float* x, int64_t N, int64_t K, const float* bias, float* y) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n0 = (int64_t(blockIdx.x) * kGemvWarps + warp) * kGemvRows;
  if (n0 >= N) return;
  const int64_t K8 = K / 8;
  const uint4* rows[kGemvRows];
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) rows[r] = reinterpret_cast<const uint4*>(W + min(n0 + r, N - 1) * K);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float acc[kGemvRows] = {};
  for (int64_t k0 = lane; k0 < K8; k0 += 32 * kGemvUnroll) {
    uint4 w[kGemvUnroll][kGemvRows];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r)
        w[u][r] = k0 + u * 32 < K8 ? __ldg(rows[r] + k0 + u * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t k = k0 + u * 32;
      if (k >= K8) break;
      const float4 xa = __ldg(x4 + 2 * k), xb = __ldg(x4 + 2 * k + 1);
      const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        float f[8];
        widen8<T>(w[u][r], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] += f[i] * xv[i];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && n0 + r < N) y[n0 + r] = v + (bias ? bias[n0 + r] : 0.0f);
  }
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

// KV cache elements (F32, F16 or BF16) as float: one, or four consecutive ones (a 16-byte float4
// or an 8-byte pair of half pairs; rows must be aligned to four elements).
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ void from_f(float x, T* y);
template <>
__device__ __forceinline__ void from_f(float x, float* y) { *y = x; }
template <>
__device__ __forceinline__ void from_f(float x, __half* y) { *y = __float2half_rn(x); }
template <>
__device__ __forceinline__ void from_f(float x, __nv_bfloat16* y) { *y = __float2bfloat16_rn(x); }
// Elements [4·i, 4·i + 4) of p.
__device__ __forceinline__ float4 load4(const float* p, int64_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ float4 load4(const __half* p, int64_t i) {
  const uint2 u = reinterpret_cast<const uint2*>(p)[i];
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p, int64_t i) {
  const uint2 u = reinterpret_cast<const uint2*>(p)[i];
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// One warp per (h, t): lanes split D.
template <typename T>
__global__ void attention_logits_k(const float* q, const T* K, int64_t ld, int64_t n, int H, int group,
                                   int D, float scale, float* logits, int64_t lld) {
  const int64_t w = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= int64_t(H) * n) return;
  const int h = int(w / n);
  const int64_t t = w % n;
  const float* qh = q + int64_t(h) * D;
  const T* k = K + (int64_t(h / group) * ld + t) * D;
  float s = 0;
  for (int d = lane; d < D; d += 32) s += qh[d] * to_f(k[d]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) logits[int64_t(h) * lld + t] = s * scale;
}

// Decode attention for one query row, G query heads per KV head read each K/V row once for the
// whole group (GQA), rows as float4 (D % 4 == 0, 16-byte aligned rows, G ≤ kMaxG; otherwise the
// one-warp-per-(head, token) kernels above and below). Grid: (token blocks, H_kv).
constexpr int kMaxG = 8;
constexpr int kLogitWarps = 8, kLogitRowsPerWarp = 4, kLogitIters = 4;
constexpr int kLogitTokens = kLogitWarps * kLogitRowsPerWarp * kLogitIters;  // tokens per block

// logits[g·G + h, t] = scale · q[g·G + h] · K[g, t]. The group's queries sit in shared memory; each
// warp loads kLogitRowsPerWarp key rows before it reduces, so several rows are in flight per warp.
template <typename T>
__global__ void group_logits4_k(const float* q, const T* K, int64_t ld, int64_t n, int G, int D,
                                float scale, float* logits, int64_t lld) {
  extern __shared__ float4 qs[];  // [G, D/4]
  const int g = blockIdx.y, D4 = D / 4;
  const float4* qg = reinterpret_cast<const float4*>(q + int64_t(g) * G * D);
  for (int i = threadIdx.x; i < G * D4; i += blockDim.x) qs[i] = qg[i];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t_end = min(n, int64_t(blockIdx.x + 1) * kLogitTokens);
  const T* Kg = K + int64_t(g) * ld * D;
  for (int64_t base = int64_t(blockIdx.x) * kLogitTokens + warp * kLogitRowsPerWarp; base < t_end;
       base += kLogitWarps * kLogitRowsPerWarp) {
    float s[kLogitRowsPerWarp][kMaxG];
#pragma unroll
    for (int j = 0; j < kLogitRowsPerWarp; ++j)
#pragma unroll
      for (int h = 0; h < kMaxG; ++h) s[j][h] = 0.0f;
    for (int i = lane; i < D4; i += 32) {
      float4 kv[kLogitRowsPerWarp];
#pragma unroll
      for (int j = 0; j < kLogitRowsPerWarp; ++j)
        kv[j] = base + j < t_end ? load4(Kg, (base + j) * D4 + i) : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int h = 0; h < kMaxG; ++h) {
        if (h >= G) break;
        const float4 qv = qs[h * D4 + i];
#pragma unroll
        for (int j = 0; j < kLogitRowsPerWarp; ++j)
          s[j][h] += qv.x * kv[j].x + qv.y * kv[j].y + qv.z * kv[j].z + qv.w * kv[j].w;
      }
    }
#pragma unroll
    for (int j = 0; j < kLogitRowsPerWarp; ++j)
#pragma unroll
      for (int h = 0; h < kMaxG; ++h) {
        if (h >= G) break;
        float v = s[j][h];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && base + j < t_end) logits[(int64_t(g) * G + h) * lld + base + j] = v * scale;
      }
  }
}

constexpr int kVThreads = 128, kVChunk = 256;  // threads per block; tokens per block (one partial sum)
// part[c, g·G + h, :] = Σ_{t in chunk c} p[g·G + h, t] · V[g, t, :]. Threads: D/4 lanes along a row
// (float4 each) × rows_per_pass rows; the rows' sums are added in shared memory at the end.
template <typename T>
__global__ void weighted_v_part_k(const float* p, int64_t pld, const T* V, int64_t ld, int64_t n, int G,
                                  int D, int H, float* part) {
  extern __shared__ float4 red[];  // [rows_per_pass, G, D/4]
  const int g = blockIdx.y, D4 = D / 4, rpp = kVThreads / D4, r = threadIdx.x / D4, i = threadIdx.x % D4;
  float4 acc[kMaxG];
#pragma unroll
  for (int h = 0; h < kMaxG; ++h) acc[h] = make_float4(0, 0, 0, 0);
  const int64_t t0 = int64_t(blockIdx.x) * kVChunk, t_end = min(n, t0 + kVChunk);
  const T* Vg = V + int64_t(g) * ld * D;
  const float* pg = p + int64_t(g) * G * pld;
  if (r < rpp) {
#pragma unroll 4
    for (int64_t t = t0 + r; t < t_end; t += rpp) {
      const float4 v = load4(Vg, t * D4 + i);
#pragma unroll
      for (int h = 0; h < kMaxG; ++h) {
        if (h >= G) break;
        const float w = pg[int64_t(h) * pld + t];
        acc[h].x += w * v.x, acc[h].y += w * v.y, acc[h].z += w * v.z, acc[h].w += w * v.w;
      }
    }
#pragma unroll
    for (int h = 0; h < kMaxG; ++h)
      if (h < G) red[(r * G + h) * D4 + i] = acc[h];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < G * D4; x += blockDim.x) {
    float4 s = make_float4(0, 0, 0, 0);
    for (int rr = 0; rr < rpp; ++rr) {
      const float4 v = red[rr * G * D4 + x];
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    const int h = x / D4, d4 = x % D4;
    reinterpret_cast<float4*>(part + (int64_t(blockIdx.x) * H + int64_t(g) * G + h) * D)[d4] = s;
  }
}
// out[j] = Σ_c part[c, j], j < HD.
__global__ void sum_parts_k(const float* part, int64_t chunks, int64_t HD, float* out) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= HD) return;
  float s = 0;
  for (int64_t c = 0; c < chunks; ++c) s += part[c * HD + j];
  out[j] = s;
}
// Flash decoding: one pass over a chunk of kFdChunk keys and values of one KV head for its G
// query heads — logits into shared memory, the chunk's max and exp-sum per head, the weighted sum
// of the chunk's value rows — then a second kernel merges the chunks by their log-sum-exp. K and V
// are read once, and no logits go through device memory (docs/performance.md, "Tuning choices").
constexpr int kFdThreads = 128, kFdChunk = 256, kFdLanes = 8;  // lanes per key row in the logits phase
// Rows of one launch (blockIdx.z): `one` when rows is null, else rows[blockIdx.z] (prefill: every
// query row of a forward chunk in one launch). Partial results of row z, chunk c, head h at
// (z·max_chunks + c)·H + h.
template <typename T>
__global__ void flash_decode_part_k(AttnRowDev one, const AttnRowDev* rows, int G, int D, int H, float scale,
                                    int64_t max_chunks, float* part_o, float* part_ml) {
  extern __shared__ float4 fd_smem[];
  const AttnRowDev row = rows ? rows[blockIdx.z] : one;
  const int64_t n = row.n, ld = row.ld;
  if (int64_t(blockIdx.x) * kFdChunk >= n) return;  // past this row's keys (block-uniform)
  const float* q = row.q;
  const T* K = static_cast<const T*>(row.k);
  const T* V = static_cast<const T*>(row.v);
  const int64_t slot = int64_t(blockIdx.z) * max_chunks + blockIdx.x;
  const int g = blockIdx.y, D4 = D / 4, tid = threadIdx.x;
  float4* qs = fd_smem;                                        // [G, D/4]
  float* sc = reinterpret_cast<float*>(fd_smem + G * D4);      // [G, kFdChunk] logits, then weights
  float4* red = reinterpret_cast<float4*>(sc + G * kFdChunk);  // [rows_per_pass, G, D/4]
  __shared__ float ml[kMaxG][2];
  const float4* qg = reinterpret_cast<const float4*>(q + int64_t(g) * G * D);
  for (int i = tid; i < G * D4; i += kFdThreads) qs[i] = qg[i];
  __syncthreads();
  const int64_t t0 = int64_t(blockIdx.x) * kFdChunk;
  const int cnt = int(min(int64_t(kFdChunk), n - t0));
  const T* Kg = K + (int64_t(g) * ld + t0) * D;
  const T* Vg = V + (int64_t(g) * ld + t0) * D;
  // Logits: groups of kFdLanes lanes per key row, kFdThreads / kFdLanes rows at a time.
  const int sub = tid % kFdLanes, row0 = tid / kFdLanes, rows_at_once = kFdThreads / kFdLanes;
  for (int t = row0; t < ((cnt + rows_at_once - 1) / rows_at_once) * rows_at_once; t += rows_at_once) {
    float acc[kMaxG];
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) acc[h] = 0.0f;
    if (t < cnt)
      for (int i = sub; i < D4; i += kFdLanes) {
        const float4 k = load4(Kg, int64_t(t) * D4 + i);
#pragma unroll
        for (int h = 0; h < kMaxG; ++h) {
          if (h >= G) break;
          const float4 qv = qs[h * D4 + i];
          acc[h] += qv.x * k.x + qv.y * k.y + qv.z * k.z + qv.w * k.w;
        }
      }
#pragma unroll
    for (int h = 0; h < kMaxG; ++h) {
      if (h >= G) break;
      float v = acc[h];
      for (int o = kFdLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (sub == 0 && t < cnt) sc[h * kFdChunk + t] = v * scale;
    }
  }
  __syncthreads();
  // Per head: the chunk's max and exp-sum (a warp per head); the logits become exp(s − max).
  const int warp = tid >> 5, lane = tid & 31;
  for (int h = warp; h < G; h += kFdThreads / 32) {
    float m = -FLT_MAX;
    for (int t = lane; t < cnt; t += 32) m = fmaxf(m, sc[h * kFdChunk + t]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float l = 0;
    for (int t = lane; t < cnt; t += 32) l += (sc[h * kFdChunk + t] = __expf(sc[h * kFdChunk + t] - m));
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
    if (lane == 0) ml[h][0] = m, ml[h][1] = l;
  }
  __syncthreads();
  // Weighted values: D/4 lanes along a row (float4 each) × rows_per_pass rows.
  const int rpp = kFdThreads / D4, r = tid / D4, i = tid % D4;
  float4 acc[kMaxG];
#pragma unroll
  for (int h = 0; h < kMaxG; ++h) acc[h] = make_float4(0, 0, 0, 0);
  if (r < rpp) {
#pragma unroll 4
    for (int t = r; t < cnt; t += rpp) {
      const float4 v = load4(Vg, int64_t(t) * D4 + i);
#pragma unroll
      for (int h = 0; h < kMaxG; ++h) {
        if (h >= G) break;
        const float w = sc[h * kFdChunk + t];
        acc[h].x += w * v.x, acc[h].y += w * v.y, acc[h].z += w * v.z, acc[h].w += w * v.w;
      }
    }
#pragma unroll
    for (int h = 0; h < kMaxG; ++h)
      if (h < G) red[(r * G + h) * D4 + i] = acc[h];
  }
  __syncthreads();
  for (int x = tid; x < G * D4; x += kFdThreads) {
    float4 sum = make_float4(0, 0, 0, 0);
    for (int rr = 0; rr < rpp; ++rr) {
      const float4 v = red[rr * G * D4 + x];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
    const int h = x / D4, d4 = x % D4;
    reinterpret_cast<float4*>(part_o + (slot * H + int64_t(g) * G + h) * D)[d4] = sum;
  }
  if (tid < G) {
    part_ml[(slot * H + int64_t(g) * G + tid) * 2] = ml[tid][0];
    part_ml[(slot * H + int64_t(g) * G + tid) * 2 + 1] = ml[tid][1];
  }
}
// out[h, :] = Σ_c e^{m_c − M} o_c / Σ_c e^{m_c − M} l_c over the chunks c of head h (block per head).
__global__ void flash_decode_merge_k(AttnRowDev one, const AttnRowDev* rows, int64_t max_chunks, int H, int D,
                                     const float* part_o, const float* part_ml) {
  const AttnRowDev row = rows ? rows[blockIdx.y] : one;
  const int h = blockIdx.x;
  float* out = row.out;
  const int64_t chunks = (row.n + kFdChunk - 1) / kFdChunk;
  if (chunks == 0) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) out[int64_t(h) * D + d] = 0.0f;
    return;
  }
  part_o += int64_t(blockIdx.y) * max_chunks * H * D;
  part_ml += int64_t(blockIdx.y) * max_chunks * H * 2;
  float M = -FLT_MAX;
  for (int64_t c = 0; c < chunks; ++c) M = fmaxf(M, part_ml[(c * H + h) * 2]);
  float L = 0;
  for (int64_t c = 0; c < chunks; ++c)
    L += __expf(part_ml[(c * H + h) * 2] - M) * part_ml[(c * H + h) * 2 + 1];
  const float inv = 1.0f / L;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0;
    for (int64_t c = 0; c < chunks; ++c)
      acc += __expf(part_ml[(c * H + h) * 2] - M) * part_o[(c * H + h) * D + d];
    out[int64_t(h) * D + d] = acc * inv;
  }
}

// Whether the four-element group kernels take this shape: rows of whole groups of four, G ≤ kMaxG,
// the F32 operand `a` 16-byte aligned and the cache `kv` aligned to four of its elements.
bool vec4_shape(const float* a, const void* kv, DType kt, int G, int D) {
  return D % 4 == 0 && D / 4 <= kVThreads && G <= kMaxG && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(kv) % (4 * dtype_size(kt)) == 0;
}
// Calls f with a null `const T*` for the KV element type t.
template <typename F>
void by_kv_type(DType t, F&& f) {
  switch (t) {
    case DType::kF32: return f(static_cast<const float*>(nullptr));
    case DType::kF16: return f(static_cast<const __half*>(nullptr));
    case DType::kBF16: return f(static_cast<const __nv_bfloat16*>(nullptr));
  }
  throw std::runtime_error("cuda: unknown KV element type");
}

__global__ void scatter_k(const float* a, int64_t na, const int32_t* pos, int64_t total, int H, float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= int64_t(H) * na) return;
  const int64_t h = i / na, j = i % na;
  out[h * total + pos[j]] = a[i];
}

__global__ void softmax_rows_k(float* x, int64_t n, int64_t ld) {
  float* r = x + blockIdx.x * ld;
  float m = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
  m = block_max(m);
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (r[i] = __expf(r[i] - m));
  const float inv = 1.0f / block_sum(s);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}

// One block of 1024 threads (every lane of block_max's last warp real, so -inf survives).
__global__ void max_value_k(const float* x, int64_t n, float* result) {
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, x[i]);  // fmaxf skips NaN
  m = block_max(m);
  if (threadIdx.x == 0) *result = m;
}
__global__ void exp_shift_sum_k(float* x, int64_t n, float shift, float* result) {
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (x[i] = expf(x[i] - shift));
  s = block_sum(s);
  if (threadIdx.x == 0) *result = s;
}

// Block per head; threads over D; loop over tokens (V rows read coalesced along D).
template <typename T>
__global__ void weighted_v_k(const float* p, int64_t pld, const T* V, int64_t ld, int64_t n, int group,
                             int D, float* out) {
  const int h = blockIdx.x;
  const float* ph = p + int64_t(h) * pld;
  const T* v = V + int64_t(h / group) * ld * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0;
    for (int64_t t = 0; t < n; ++t) acc += ph[t] * to_f(v[t * D + d]);
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

// One block per row: row i from ptrs[n + i] to ptrs[i].
__global__ void copy_rows_k(char* const* ptrs, int64_t row_bytes, int64_t n) {
  const int64_t row = blockIdx.x;
  if (row >= n) return;
  const char* s = ptrs[n + row];
  char* d = ptrs[row];
  for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x) d[i] = s[i];
}

// dst[g·head_stride + pos[i]·D + d] = src[(i·H_kv + g)·D + d]: new K or V rows into the cache.
template <typename T>
__global__ void kv_write_k(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, T* dst,
                           int64_t head_stride) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n * H_kv * D) return;
  const int64_t d = i % D, g = (i / D) % H_kv, r = i / (int64_t(D) * H_kv);
  from_f(src[i], dst + g * head_stride + int64_t(pos[r]) * D + d);
}
template <typename T>
__global__ void to_f32_k(const T* x, int64_t n, float* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = to_f(x[i]);
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
  softmax_rows_k<<<unsigned(rows), 256, 0, ctx().stream>>>(x, n, n);
  HG_CUDA_LAUNCHED();
}
void softmax_rows_ld(float* x, int64_t rows, int64_t n, int64_t ld) {
  if (rows == 0) return;
  softmax_rows_k<<<unsigned(rows), 256, 0, ctx().stream>>>(x, n, ld);
  HG_CUDA_LAUNCHED();
}
float max_value(const float* x, int64_t n) {
  float* result = ctx().scratch(7, 1);
  max_value_k<<<1, 1024, 0, ctx().stream>>>(x, n, result);
  HG_CUDA_LAUNCHED();
  float m = 0;
  d2h(&m, result, 4);
  return m;
}
float exp_shift_sum(float* x, int64_t n, float shift) {
  float* result = ctx().scratch(7, 1);
  exp_shift_sum_k<<<1, 1024, 0, ctx().stream>>>(x, n, shift, result);
  HG_CUDA_LAUNCHED();
  float s = 0;
  d2h(&s, result, 4);
  return s;
}
void kv_write(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst, int64_t head_stride,
              DType dt) {
  if (n == 0) return;
  by_kv_type(dt, [&](auto* tag) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    kv_write_k<<<blocks(n * H_kv * D, 256), 256, 0, ctx().stream>>>(src, n, H_kv, D, pos, static_cast<T*>(dst),
                                                                    head_stride);
  });
  HG_CUDA_LAUNCHED();
}
void to_f32(const void* src, DType st, int64_t n, float* dst) {
  if (n == 0) return;
  by_kv_type(st, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    to_f32_k<<<blocks(n, 256), 256, 0, ctx().stream>>>(static_cast<T*>(src), n, dst);
  });
  HG_CUDA_LAUNCHED();
}

int open_cublas() {
  int major = 0;
  cublas().get_property(MAJOR_VERSION, &major);
  return major;
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
void host_register(void* p, size_t bytes) { HG_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped)); }
void host_unregister(void* p) { HG_CUDA_CHECK(cudaHostUnregister(p)); }
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
  if (M == 1 && wt != DType::kF32 && K % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    // Decode: our GEMV reads the weights once at close to the copy rate and needs no x conversion.
    // Two rows per warp for tall matrices; one below 8192 rows, where two would leave SMs idle.
    // Four 16-byte steps in flight per lane and row (docs/performance.md, "Tuning choices").
    auto launch = [&](auto* wp) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(wp)>>;
      const unsigned t = kGemvWarps * 32;
      if (N >= 8192)
        gemv_half_k<T, 2, 4>
            <<<unsigned((N + kGemvWarps * 2 - 1) / (kGemvWarps * 2)), t, 0, c.stream>>>(wp, x, N, K, bias, y);
      else
        gemv_half_k<T, 1, 4>
            <<<unsigned((N + kGemvWarps - 1) / kGemvWarps), t, 0, c.stream>>>(wp, x, N, K, bias, y);
    };
    if (wt == DType::kBF16)
      launch(static_cast<const __nv_bfloat16*>(w));
    else
      launch(static_cast<const __half*>(w));
    HG_CUDA_LAUNCHED();
    return;
  }
  if (wt == DType::kF32) {
    HG_CUBLAS_CHECK(cublas().sgemm(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha,
                                static_cast<const float*>(w), int(K), x, int(K), &beta, y, int(N)));
  } else {
    const bool bf = wt == DType::kBF16;
    if (bf) f32_to_bf16_k<<<blocks(M * K, 256), 256, 0, c.stream>>>(x, static_cast<__nv_bfloat16*>(x_half), M * K);
    else f32_to_f16_k<<<blocks(M * K, 256), 256, 0, c.stream>>>(x, static_cast<__half*>(x_half), M * K);
    HG_CUDA_LAUNCHED();
    const cudaDataType_t t = bf ? CUDA_R_16BF : CUDA_R_16F;
    HG_CUBLAS_CHECK(cublas().gemm_ex(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w, t, int(K), x_half,
                                 t, int(K), &beta, y, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (bias) add_bias(y, bias, M, N);
}

void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) {
  rms_norm_k<<<unsigned(M), norm_threads(n), 0, ctx().stream>>>(x, w, n, eps, y);
  HG_CUDA_LAUNCHED();
}
void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps, float* y) {
  layer_norm_k<<<unsigned(M), norm_threads(n), 0, ctx().stream>>>(x, w, b, n, eps, y);
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
void attention_logits(const float* q, const void* K, DType kt, int64_t ld, int64_t n, int H, int H_kv, int D,
                      float scale, float* logits, int64_t logits_ld) {
  if (n == 0) return;
  const int G = H / H_kv;
  const int64_t lld = logits_ld < 0 ? n : logits_ld;
  by_kv_type(kt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* Kt = static_cast<T*>(K);
    if (vec4_shape(q, K, kt, G, D)) {
      const dim3 grid(blocks(n, kLogitTokens), unsigned(H_kv));
      group_logits4_k<<<grid, kLogitWarps * 32, size_t(G) * D * 4, ctx().stream>>>(q, Kt, ld, n, G, D, scale,
                                                                                   logits, lld);
    } else {
      const int64_t threads = int64_t(H) * n * 32;
      attention_logits_k<<<blocks(threads, 256), 256, 0, ctx().stream>>>(q, Kt, ld, n, H, G, D, scale, logits,
                                                                         lld);
    }
  });
  HG_CUDA_LAUNCHED();
}
void concat_softmax(const float* a, int64_t na, const int32_t* a_pos, const float* b, int64_t nb, const int32_t* b_pos,
                    int H, float* out) {
  const int64_t total = na + nb;
  auto& c = ctx();
  if (na > 0) scatter_k<<<blocks(H * na, 256), 256, 0, c.stream>>>(a, na, a_pos, total, H, out);
  if (nb > 0) scatter_k<<<blocks(H * nb, 256), 256, 0, c.stream>>>(b, nb, b_pos, total, H, out);
  HG_CUDA_LAUNCHED();
  softmax_rows_k<<<unsigned(H), 256, 0, c.stream>>>(out, total, total);
  HG_CUDA_LAUNCHED();
}
void weighted_v_sum(const float* p, const void* V, DType vt, int64_t ld, int64_t n, int H, int H_kv, int D,
                    float* out, int64_t p_ld) {
  const int G = H / H_kv;
  const int64_t pld = p_ld < 0 ? n : p_ld;
  auto& c = ctx();
  by_kv_type(vt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* Vt = static_cast<T*>(V);
    if (n > 0 && vec4_shape(out, V, vt, G, D)) {
      const int64_t chunks = (n + kVChunk - 1) / kVChunk, HD = int64_t(H) * D;
      float* part = c.scratch(0, size_t(chunks * HD));
      const size_t shm = size_t(kVThreads / (D / 4)) * G * D * 4;
      weighted_v_part_k<<<dim3(unsigned(chunks), unsigned(H_kv)), kVThreads, shm, c.stream>>>(p, pld, Vt, ld, n,
                                                                                              G, D, H, part);
      HG_CUDA_LAUNCHED();
      sum_parts_k<<<blocks(HD, 256), 256, 0, c.stream>>>(part, chunks, HD, out);
    } else {
      weighted_v_k<<<unsigned(H), 128, 0, c.stream>>>(p, pld, Vt, ld, n, G, D, out);
    }
  });
  HG_CUDA_LAUNCHED();
}

void decode_attention(const float* q, const void* K, const void* V, DType kv, int64_t ld, int64_t n, int H,
                      int H_kv, int D, float scale, float* out) {
  auto& c = ctx();
  const int G = H / H_kv;
  if (n == 0) {
    HG_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(H) * D * 4, c.stream));
    return;
  }
  if (!vec4_shape(q, K, kv, G, D) || !vec4_shape(out, V, kv, G, D)) {  // three kernels through device memory
    float* lg = c.scratch(1, size_t(H) * size_t(n));
    attention_logits(q, K, kv, ld, n, H, H_kv, D, scale, lg);
    softmax_rows(lg, H, n);
    weighted_v_sum(lg, V, kv, ld, n, H, H_kv, D, out);
    return;
  }
  const int64_t chunks = (n + kFdChunk - 1) / kFdChunk;
  float* po = c.scratch(3, size_t(chunks) * size_t(H) * size_t(D));
  float* pml = c.scratch(4, size_t(chunks) * size_t(H) * 2);
  const size_t shm = (size_t(G) * D + size_t(G) * kFdChunk + size_t(kFdThreads / (D / 4)) * G * D) * 4;
  const AttnRowDev one{q, K, V, out, ld, n};
  by_kv_type(kv, [&](auto* tag) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    flash_decode_part_k<T><<<dim3(unsigned(chunks), unsigned(H_kv)), kFdThreads, shm, c.stream>>>(
        one, nullptr, G, D, H, scale, chunks, po, pml);
  });
  HG_CUDA_LAUNCHED();
  flash_decode_merge_k<<<unsigned(H), 128, 0, c.stream>>>(one, nullptr, chunks, H, D, po, pml);
  HG_CUDA_LAUNCHED();
}

void attention_rows(const AttnRowDev* rows, int n_rows, int H, int H_kv, int D, float scale, DType kv) {
  if (n_rows <= 0) return;
  const int G = H / H_kv;
  int64_t max_n = 0;
  bool vec4 = true;
  for (int r = 0; r < n_rows; ++r) {
    max_n = std::max(max_n, rows[r].n);
    vec4 = vec4 && vec4_shape(rows[r].q, rows[r].k, kv, G, D) && vec4_shape(rows[r].out, rows[r].v, kv, G, D);
  }
  if (!vec4 || n_rows == 1 || n_rows > 65535) {
    for (int r = 0; r < n_rows; ++r)
      decode_attention(rows[r].q, rows[r].k, rows[r].v, kv, rows[r].ld, rows[r].n, H, H_kv, D, scale,
                       rows[r].out);
    return;
  }
  auto& c = ctx();
  const int64_t max_chunks = std::max<int64_t>(1, (max_n + kFdChunk - 1) / kFdChunk);
  // The row descriptors go over once per call (a waiting copy: prefill, not the decode path).
  static_assert(sizeof(AttnRowDev) % sizeof(float) == 0, "descriptors live in a float scratch");
  auto* dr = reinterpret_cast<AttnRowDev*>(c.scratch(5, size_t(n_rows) * sizeof(AttnRowDev) / sizeof(float)));
  HG_CUDA_CHECK(
      cudaMemcpyAsync(dr, rows, size_t(n_rows) * sizeof(AttnRowDev), cudaMemcpyHostToDevice, c.stream));
  float* po = c.scratch(3, size_t(n_rows) * size_t(max_chunks) * size_t(H) * size_t(D));
  float* pml = c.scratch(4, size_t(n_rows) * size_t(max_chunks) * size_t(H) * 2);
  const size_t shm = (size_t(G) * D + size_t(G) * kFdChunk + size_t(kFdThreads / (D / 4)) * G * D) * 4;
  by_kv_type(kv, [&](auto* tag) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
    flash_decode_part_k<T><<<dim3(unsigned(max_chunks), unsigned(H_kv), unsigned(n_rows)), kFdThreads, shm,
                             c.stream>>>(rows[0], dr, G, D, H, scale, max_chunks, po, pml);
  });
  HG_CUDA_LAUNCHED();
  flash_decode_merge_k<<<dim3(unsigned(H), unsigned(n_rows)), 128, 0, c.stream>>>(rows[0], dr, max_chunks, H,
                                                                                  D, po, pml);
  HG_CUDA_LAUNCHED();
  HG_CUDA_CHECK(cudaStreamSynchronize(c.stream));  // `rows` is the caller's host array
}

void merged_attention(const float* q, int H, int H_kv, int D, float scale, const float* la, const void* Va,
                      int64_t na, const void* Kb, const void* Vb, int64_t ld_b, int64_t nb, const float* lb,
                      float* out, DType kv) {
  auto& c = ctx();
  const int64_t n = na + nb;
  if (n == 0) {
    HG_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(H) * D * 4, c.stream));
    return;
  }
  float* S = c.scratch(1, size_t(H) * size_t(n));
  if (na > 0)
    HG_CUDA_CHECK(cudaMemcpy2DAsync(S, size_t(n) * 4, la, size_t(na) * 4, size_t(na) * 4, size_t(H),
                                    cudaMemcpyDeviceToDevice, c.stream));
  if (lb && nb > 0)
    HG_CUDA_CHECK(cudaMemcpy2DAsync(S + na, size_t(n) * 4, lb, size_t(nb) * 4, size_t(nb) * 4, size_t(H),
                                    cudaMemcpyDeviceToDevice, c.stream));
  else
    attention_logits(q, Kb, kv, ld_b, nb, H, H_kv, D, scale, S + na, n);
  softmax_rows(S, H, n);
  weighted_v_sum(S + na, Vb, kv, ld_b, nb, H, H_kv, D, out, n);
  if (na > 0) {
    float* oa = c.scratch(2, size_t(H) * D);
    weighted_v_sum(S, Va, kv, na, na, H, H_kv, D, oa, n);
    add(out, oa, int64_t(H) * D);
  }
}

void h2d_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (rows == 0 || width == 0) return;
  HG_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyHostToDevice, ctx().stream));
  HG_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
}
void d2d_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (rows == 0 || width == 0) return;
  HG_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, ctx().stream));
}
void d2h_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (rows == 0 || width == 0) return;
  HG_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToHost, ctx().stream));
  HG_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
}
void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx, int64_t n) {
  if (n == 0) return;
  gather_rows_k<<<unsigned(n), 128, 0, ctx().stream>>>(static_cast<char*>(dst), static_cast<const char*>(src),
                                                        row_bytes, src_stride, idx, n);
  HG_CUDA_LAUNCHED();
}

void gather_rows_host_idx(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                          int64_t n) {
  if (n == 0) return;
  auto* d = reinterpret_cast<int32_t*>(ctx().scratch(6, size_t(n)));
  h2d(d, idx, size_t(n) * 4);
  gather_rows(dst, src, row_bytes, src_stride, d, n);
}

void copy_rows_host_ptrs(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n) {
  if (n == 0) return;
  // Both pointer lists in one upload (scratch 8: floats, two per pointer).
  std::vector<const void*> ptrs(size_t(2 * n));
  std::copy(dst, dst + n, ptrs.begin());
  std::copy(src, src + n, ptrs.begin() + n);
  auto* d = reinterpret_cast<char* const*>(ctx().scratch(8, size_t(4 * n)));
  h2d(const_cast<char**>(d), ptrs.data(), ptrs.size() * sizeof(void*));
  copy_rows_k<<<unsigned(n), 128, 0, ctx().stream>>>(d, row_bytes, n);
  HG_CUDA_LAUNCHED();
}


// --- Eviction scores -------------------------------------------------------------------------

namespace {

constexpr int kScoreThreads = 256;

// An upload on the stream without a wait: a pageable source is consumed before the call returns,
// and the kernels that read the destination follow on the same stream.
void h2d_nowait(void* dst, const void* src, size_t bytes) {
  HG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx().stream));
}

// Block reductions over kScoreThreads threads through shared memory (integers and argmins).
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T sh[kScoreThreads];
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int w = kScoreThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) sh[threadIdx.x] = op(sh[threadIdx.x], sh[threadIdx.x + w]);
    __syncthreads();
  }
  const T r = sh[0];
  __syncthreads();
  return r;
}
struct IntMax {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};
struct IntMin {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a < b ? a : b; }
};
struct IntSum {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a + b; }
};
// A candidate slot for an eviction: (score, position, slot), the lowest score first, then the
// older position; slot −1 is no candidate.
struct Cand {
  double score;
  int32_t pos, slot;
};
__device__ inline bool cand_before(const Cand& a, const Cand& b) {
  if (a.slot < 0) return false;
  if (b.slot < 0) return true;
  return a.score < b.score || (a.score == b.score && a.pos < b.pos);
}
struct CandMin {
  __device__ Cand operator()(const Cand& a, const Cand& b) const { return cand_before(b, a) ? b : a; }
};

// Block (row, KV group): the group's query heads' increments added to its records, head by head.
__global__ void accumulate_scores_k(const ScoreRowDev* rows, int rule, int H, int G, const float* taps,
                                    int64_t tap_ld, uint64_t seed, int layer, float* zbuf, int64_t zld) {
  const int64_t i = blockIdx.x;
  const int g = blockIdx.y;
  const ScoreRowDev r = rows[i];
  ScoreSlotDev* sl = r.slots + int64_t(g) * r.slot_ld;
  const int32_t n = r.n;
  const float* tap0 = taps + (i * H + int64_t(g) * G) * tap_ld;
  if (rule == 0) {
    for (int32_t t = threadIdx.x; t < n; t += blockDim.x) {
      double acc = sl[t].score;
      for (int h = 0; h < G; ++h) acc += double(tap0[int64_t(h) * tap_ld + t]);
      sl[t].score = acc;
    }
    return;
  }
  float* z = zbuf + (i * gridDim.y + g) * zld;
  for (int h = 0; h < G; ++h) {
    const float* tap = tap0 + int64_t(h) * tap_ld;
    const uint64_t base = gumbel::stream(seed, layer, 0, r.pos, g * G + h);
    float m = -FLT_MAX;
    for (int32_t t = threadIdx.x; t < n; t += blockDim.x) {
      const float v = float((double(tap[t]) + gumbel::draw(base, sl[t].pos)) / r.tau);
      z[t] = v;
      m = fmaxf(m, v);
    }
    m = n > 0 ? block_max(m) : 0.0f;
    float sum = 0;
    for (int32_t t = threadIdx.x; t < n; t += blockDim.x) sum += (z[t] = expf(z[t] - m));
    sum = block_sum(sum);
    const double inv = 1.0 / double(sum);
    for (int32_t t = threadIdx.x; t < n; t += blockDim.x) sl[t].score += double(z[t]) * inv;
  }
}

// Block per pick: the recent window's cut (positions >= cut are the `recent` newest; INT32_MAX
// when nothing is recent, INT32_MIN when everything is), and a single victim's argmin.
__global__ void pick_cut_k(const EvictionPickDev* picks, int32_t* cuts, int32_t* out) {
  const EvictionPickDev p = picks[blockIdx.x];
  const ScoreSlotDev* sl = p.slots;
  int32_t cut = INT32_MAX;
  if (p.recent > 0 && p.recent >= p.n) cut = INT32_MIN;
  if (p.recent > 0 && p.recent < p.n) {
    int32_t hi = INT32_MIN, lo = INT32_MAX;
    for (int32_t s = threadIdx.x; s < p.n; s += blockDim.x) hi = max(hi, sl[s].pos), lo = min(lo, sl[s].pos);
    hi = block_reduce(hi, IntMax{});
    lo = block_reduce(lo, IntMin{});
    // Usually the newest `recent` positions are consecutive (one count confirms it); else the
    // largest c with count(pos >= c) >= recent, by bisection (positions within a head are distinct).
    auto at_least = [&](int32_t c) {
      int32_t k = 0;
      for (int32_t s = threadIdx.x; s < p.n; s += blockDim.x) k += sl[s].pos >= c;
      return block_reduce(k, IntSum{});
    };
    cut = hi - p.recent + 1;
    if (at_least(cut) != p.recent) {
      int64_t a = lo, b = hi;
      while (a < b) {
        const int64_t mid = a + (b - a + 1) / 2;
        if (at_least(int32_t(mid)) >= p.recent) a = mid;
        else b = mid - 1;
      }
      cut = int32_t(a);
    }
  }
  if (threadIdx.x == 0) cuts[blockIdx.x] = cut;
  if (p.count != 1) return;
  Cand best{0, 0, -1};
  for (int32_t s = threadIdx.x; s < p.n; s += blockDim.x)
    if (sl[s].pos < cut) {
      const Cand c{sl[s].score, sl[s].pos, s};
      if (cand_before(c, best)) best = c;
    }
  best = block_reduce(best, CandMin{});
  if (threadIdx.x == 0) out[p.at] = best.slot;
}

// Picks of several victims (the first decode step's pruning): each candidate's rank among the
// candidates in (score, position) order, by comparing it with every other through shared tiles;
// a rank below `count` is its place in the output.
__global__ void pick_rank_k(const EvictionPickDev* picks, const int32_t* cuts, int32_t* out) {
  const EvictionPickDev p = picks[blockIdx.x];
  if (p.count <= 1) return;
  const int32_t cut = cuts[blockIdx.x];
  const ScoreSlotDev* sl = p.slots;
  __shared__ double tile_score[kScoreThreads];
  __shared__ int32_t tile_pos[kScoreThreads];
  for (int64_t s0 = int64_t(blockIdx.y) * kScoreThreads; s0 < p.n; s0 += int64_t(gridDim.y) * kScoreThreads) {
    const int32_t s = int32_t(s0) + int32_t(threadIdx.x);
    const bool mine = s < p.n && sl[s].pos < cut;
    const double ms = mine ? sl[s].score : 0;
    const int32_t mp = mine ? sl[s].pos : 0;
    int32_t rank = 0;
    for (int32_t t0 = 0; t0 < p.n; t0 += kScoreThreads) {
      const int32_t t = t0 + int32_t(threadIdx.x);
      const bool cand = t < p.n && sl[t].pos < cut;
      tile_score[threadIdx.x] = cand ? sl[t].score : 0;
      tile_pos[threadIdx.x] = cand ? sl[t].pos : INT32_MAX;  // INT32_MAX: not a candidate
      __syncthreads();
      const int32_t m = min(kScoreThreads, p.n - t0);
      if (mine)
        for (int j = 0; j < m; ++j)
          if (tile_pos[j] != INT32_MAX &&
              (tile_score[j] < ms || (tile_score[j] == ms && tile_pos[j] < mp)))
            ++rank;
      __syncthreads();
    }
    if (mine && rank < p.count) out[p.at + rank] = s;
  }
}

__global__ void put_rows_k(char* const* ptrs, const char* rows, int64_t row_bytes, int64_t n) {
  const int64_t i = blockIdx.x;
  if (i >= n) return;
  for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) ptrs[i][b] = rows[i * row_bytes + b];
}

size_t floats_for(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

// Block per item: the scores copied out (pass 1), then each slot's pooled value (pass 2).
__global__ void pool_scores_k(const ScorePoolDev* items, const int64_t* offsets, double* in, int kernel, bool max) {
  const ScorePoolDev it = items[blockIdx.x];
  double* x = in + offsets[blockIdx.x];
  for (int32_t s = threadIdx.x; s < it.n; s += blockDim.x) x[s] = it.slots[s].score;
  __syncthreads();
  const int half = kernel / 2;
  for (int32_t s = threadIdx.x; s < it.n; s += blockDim.x) {
    double acc = max ? -CUDART_INF : 0.0;
    for (int32_t j = s - half > 0 ? s - half : 0; j <= (s + half < it.n - 1 ? s + half : it.n - 1); ++j)
      acc = max ? fmax(acc, x[j]) : acc + x[j];
    it.slots[s].score = max ? acc : acc / kernel;
  }
}



}  // namespace

void accumulate_scores(int rule, int H, int H_kv, const float* taps, int64_t tap_ld, uint64_t seed, int layer,
                       const ScoreRowDev* rows, int64_t n_rows) {
  if (n_rows <= 0) return;
  if (n_rows > 2147483647 || H_kv > 65535) throw std::runtime_error("accumulate_scores: too many rows or heads");
  int64_t max_n = 1;
  for (int64_t i = 0; i < n_rows; ++i) max_n = std::max<int64_t>(max_n, rows[i].n);
  auto* d = reinterpret_cast<ScoreRowDev*>(ctx().scratch(9, floats_for(size_t(n_rows) * sizeof(ScoreRowDev))));
  h2d_nowait(d, rows, size_t(n_rows) * sizeof(ScoreRowDev));
  float* z = rule == 0 ? nullptr : ctx().scratch(10, size_t(n_rows) * size_t(H_kv) * size_t(max_n));
  accumulate_scores_k<<<dim3(unsigned(n_rows), unsigned(H_kv)), kScoreThreads, 0, ctx().stream>>>(
      d, rule, H, H / H_kv, taps, tap_ld, seed, layer, z, max_n);
  HG_CUDA_LAUNCHED();
}

void pick_evictions(const EvictionPickDev* picks, int64_t n_picks, int32_t* out) {
  if (n_picks <= 0) return;
  if (n_picks > 65535) throw std::runtime_error("pick_evictions: more than 65535 picks in one call");
  int32_t max_n = 1;
  bool many = false;
  for (int64_t k = 0; k < n_picks; ++k) max_n = std::max(max_n, picks[k].n), many = many || picks[k].count > 1;
  const size_t desc = size_t(n_picks) * sizeof(EvictionPickDev);
  char* buf = reinterpret_cast<char*>(ctx().scratch(11, floats_for(desc) + size_t(n_picks)));
  auto* d = reinterpret_cast<EvictionPickDev*>(buf);
  auto* cuts = reinterpret_cast<int32_t*>(buf + floats_for(desc) * sizeof(float));
  h2d_nowait(d, picks, desc);
  pick_cut_k<<<unsigned(n_picks), kScoreThreads, 0, ctx().stream>>>(d, cuts, out);
  HG_CUDA_LAUNCHED();
  if (!many) return;
  const unsigned chunks = unsigned(std::min<int64_t>((int64_t(max_n) + kScoreThreads - 1) / kScoreThreads, 1024));
  pick_rank_k<<<dim3(unsigned(n_picks), chunks), kScoreThreads, 0, ctx().stream>>>(d, cuts, out);
  HG_CUDA_LAUNCHED();
}

void put_rows(void* const* dst, const void* src, int64_t row_bytes, int64_t n) {
  if (n <= 0) return;
  // The pointers, then the rows, in one upload.
  const size_t ptr_bytes = size_t(n) * sizeof(void*), row_total = size_t(n) * size_t(row_bytes);
  std::vector<char> staged(ptr_bytes + row_total);
  std::memcpy(staged.data(), dst, ptr_bytes);
  std::memcpy(staged.data() + ptr_bytes, src, row_total);
  char* d = reinterpret_cast<char*>(ctx().scratch(12, floats_for(staged.size())));
  h2d_nowait(d, staged.data(), staged.size());
  put_rows_k<<<unsigned(n), 32, 0, ctx().stream>>>(reinterpret_cast<char* const*>(d), d + ptr_bytes, row_bytes, n);
  HG_CUDA_LAUNCHED();
}


void pool_scores(const ScorePoolDev* items, int64_t n_items, int kernel, bool max) {
  if (n_items <= 0) return;
  if (n_items > 2147483647) throw std::runtime_error("pool_scores: too many items");
  // Items, their offsets into the copied scores, then the scores, in one scratch buffer.
  std::vector<int64_t> off(static_cast<size_t>(n_items));
  int64_t total = 0;
  for (int64_t i = 0; i < n_items; ++i) off[size_t(i)] = total, total += std::max(items[i].n, 0);
  const size_t item_bytes = size_t(n_items) * sizeof(ScorePoolDev), off_bytes = size_t(n_items) * sizeof(int64_t);
  const size_t head = (item_bytes + off_bytes + 15) / 16 * 16;
  char* buf = reinterpret_cast<char*>(ctx().scratch(13, floats_for(head + size_t(total) * sizeof(double))));
  h2d_nowait(buf, items, item_bytes);
  h2d_nowait(buf + item_bytes, off.data(), off_bytes);
  pool_scores_k<<<unsigned(n_items), kScoreThreads, 0, ctx().stream>>>(
      reinterpret_cast<const ScorePoolDev*>(buf), reinterpret_cast<const int64_t*>(buf + item_bytes),
      reinterpret_cast<double*>(buf + head), kernel, max);
  HG_CUDA_LAUNCHED();
}

}  // namespace hg::cuda
