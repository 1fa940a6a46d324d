// The CPU kernels' bodies (maths in kernels.h), included once per instruction-set level by
// kernels_portable.cpp, kernels_avx512.cpp and kernels_avx512_bf16.cpp, each in its own namespace
// (HG_KERNEL_NS). The AVX-512 levels switch the target with a pragma after the standard headers,
// so that no standard-library function compiled for AVX-512 can be shared with the portable path
// (inline functions of different translation units are merged by the linker).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "engine/backend/cpu/kernel_table.h"
#include "engine/backend/gumbel.h"
#include "engine/core/cpu_features.h"
#include "engine/core/dtype.h"

#if HG_KERNEL_AVX512
#include <immintrin.h>
#define HG_AVX512 1
// GCC switches the target for what follows; clang ignores that pragma and takes the attribute on
// every function declared up to the matching pop (lambdas included).
#if defined(__clang__) && HG_KERNEL_BF16
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,avx512bf16"))), apply_to = function)
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#if HG_KERNEL_BF16
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2,avx512bf16")
#else
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2")
#endif
#endif
#endif

namespace hg::cpu::HG_KERNEL_NS {
// Everything but kernel_table() has internal linkage: a level that takes most of its kernels from
// another level's table does not compile its own copies (kernel_table() below).
namespace {

// Storage tags for 16-bit KV elements (both are uint16_t in memory).
struct F16Tag {
  uint16_t bits;
};
struct BF16Tag {
  uint16_t bits;
};

namespace {
// exp(x) for x in [-87.3, 88] (clamped): exp512's reduction and polynomial in scalar code that the
// compiler vectorises (integer rounding and exponent bits instead of library calls).
inline float exp_portable(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);
  const float t = x * 1.44269504088896341f;
  const int32_t ni = int32_t(t + (t >= 0 ? 0.5f : -0.5f));
  const float n = float(ni);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.0f);
  return p * std::bit_cast<float>(uint32_t(ni + 127) << 23);
}

// F16 bits to F32 in integer and float steps without branches, which the compiler vectorises
// (a scalar conversion does not): the exponent rebased, infinities and NaNs moved to F32's top
// exponent, subnormals renormalised by a float subtraction. Exact; NaN payloads kept unquieted,
// as f16_to_f32 keeps them.
inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t o0 = uint32_t(h & 0x7fff) << 13;
  const uint32_t e = o0 & 0x0f800000u;
  uint32_t o = o0 + ((127u - 15u) << 23);
  const float sub = std::bit_cast<float>(o + (1u << 23)) - std::bit_cast<float>(113u << 23);
  const uint32_t inf_nan = 0u - uint32_t(e == 0x0f800000u), subnormal = 0u - uint32_t(e == 0);
  o += inf_nan & ((128u - 16u) << 23);
  o = (o & ~subnormal) | (std::bit_cast<uint32_t>(sub) & subnormal);
  return std::bit_cast<float>(o | (uint32_t(h & 0x8000) << 16));
}

// Element i of a row of type T as F32, in forms the compiler vectorises.
template <typename T>
inline float elem(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return p[i];
  else if constexpr (std::is_same_v<T, F16Tag>) return f16_bits_to_f32(p[i].bits);
  else return std::bit_cast<float>(uint32_t(p[i].bits) << 16);
}

// Σ a[i] · elem(b, i) over 16 partial sums, the form the compiler vectorises (the portable level).
template <typename T>
inline float portable_dot(const float* a, const T* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * elem(b, i + j);
  float s = 0;
  for (float v : acc) s += v;
  for (; i < n; ++i) s += a[i] * elem(b, i);
  return s;
}
}  // namespace

#if HG_AVX512
namespace {
inline __mmask16 tail_mask(int64_t r) { return __mmask16((1u << r) - 1u); }
// The mask of a row's last 16-lane block (all lanes when D is a multiple of 16).
inline __mmask16 last_block_mask(int D) { return D % 16 ? tail_mask(D % 16) : __mmask16(0xffff); }

// exp(x) for x <= ~88: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial.
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
}  // namespace
#endif

float dot(const float* a, const float* b, int64_t n) {
#if HG_AVX512
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : tail_mask(n - i);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  return portable_dot(a, b, n);
#endif
}

float max_value(const float* x, int64_t n) {
  int64_t i = 0;
  float m = -INFINITY;
#if HG_AVX512
  __m512 a[4] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY),
                 _mm512_set1_ps(-INFINITY)};
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 4; ++j) a[j] = _mm512_max_ps(_mm512_loadu_ps(x + i + 16 * j), a[j]);  // NaN: a[j]
  for (; i + 16 <= n; i += 16) a[0] = _mm512_max_ps(_mm512_loadu_ps(x + i), a[0]);
  m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a[0], a[1]), _mm512_max_ps(a[2], a[3])));
#endif
  for (; i < n; ++i) m = m < x[i] ? x[i] : m;
  return m;
}

#if HG_AVX512
// Tuning by vendor, where the two differ in what was measured (docs/performance.md, "Tuning
// choices"): AMD cores (Zen 4 and 5) split 512-bit work into halves or run it on narrower units.
inline bool amd_core() { return cpu_tuning() == CpuTuning::kAmd; }

// Read prefetch with the hint H (_MM_HINT_T0 or _MM_HINT_T2) as a template argument: GCC's
// _mm_prefetch wants its enum and clang's a literal, the builtin takes H's locality on both.
template <int H>
inline void prefetch_read(const void* p) {
  __builtin_prefetch(p, 0, H & 3);
}

// sum's eight streams over p[0, 8·q): stream j reads p[j·q, (j+1)·q), each prefetched kAhead
// floats ahead with hint H, into a[j].
template <int64_t kAhead, int H>
void sum_eight_streams(const float* p, int64_t q, __m512* a) {
  for (int64_t i = 0; i < q; i += 16)
    for (int j = 0; j < 8; ++j) {
      if (i + kAhead < q) prefetch_read<H>(p + j * q + i + kAhead);
      a[j] = _mm512_add_ps(a[j], _mm512_loadu_ps(p + j * q + i));
    }
}
#endif

float sum(const float* p, int64_t n) {
  int64_t i = 0;
  float s = 0;
#if HG_AVX512
  // Eight streams (eighths of the range) read side by side, each prefetched ahead: the reference
  // must be the best read the machine does, and concurrent streams read faster than one. AMD cores
  // read faster prefetching 1 KiB ahead into L1, Intel 4 KiB ahead into L2 (docs/performance.md,
  // "Tuning choices").
  constexpr int S = 8;
  const int64_t q = n / S / 16 * 16;
  __m512 a[S];
  for (auto& v : a) v = _mm512_setzero_ps();
  if (q >= 1024) {
    if (amd_core())
      sum_eight_streams<256, _MM_HINT_T0>(p, q, a);
    else
      sum_eight_streams<1024, _MM_HINT_T2>(p, q, a);
    i = S * q;
  }
  for (; i + 16 <= n; i += 16) a[0] = _mm512_add_ps(a[0], _mm512_loadu_ps(p + i));
  for (int j = 1; j < S; ++j) a[0] = _mm512_add_ps(a[0], a[j]);
  s = _mm512_reduce_add_ps(a[0]);
#else
  float acc[16] = {};
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += p[i + j];
  for (float v : acc) s += v;
#endif
  for (; i < n; ++i) s += p[i];
  return s;
}

#if HG_AVX512
// Four independent partial sums of a read-only stream (sum_one_stream, sum_rows): `add` reads the
// whole 16-float vectors of p[0, n) front to back, vector k into part k % 4, and returns how many
// floats it read; `total` is the sum of the parts.
struct FourSums {
  __m512 a[4];
  // An explicit constructor: GCC compiles an implicit one without the AVX-512 target pragma.
  FourSums() {
    for (auto& v : a) v = _mm512_setzero_ps();
  }
  int64_t add(const float* p, int64_t n) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
      for (int j = 0; j < 4; ++j) a[j] = _mm512_add_ps(a[j], _mm512_loadu_ps(p + i + 16 * j));
    for (; i + 16 <= n; i += 16) a[(i / 16) % 4] = _mm512_add_ps(a[(i / 16) % 4], _mm512_loadu_ps(p + i));
    return i;
  }
  float total() const { return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]))); }
};
#endif

float sum_one_stream(const float* p, int64_t n) {
  int64_t i = 0;
  float s = 0;
#if HG_AVX512
  FourSums f;
  i = f.add(p, n);
  s = f.total();
#endif
  for (; i < n; ++i) s += p[i];
  return s;
}

void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float ss = dot(x, x, n);
  const float r = 1.0f / std::sqrt(ss / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

void layer_norm_row(const float* x, const float* w, const float* b, int64_t n, float eps, float* y) {
  float mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= float(n);
  float var = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= float(n);
  const float r = 1.0f / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - mean) * r * w[i] + (b ? b[i] : 0.0f);
}

void swiglu(const float* gate, const float* up, int64_t n, float* y) {
  int64_t i = 0;
#if HG_AVX512
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_storeu_ps(y + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) y[i] = gate[i] / (1.0f + exp_portable(-gate[i])) * up[i];
}

void relu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::max(x[i], 0.0f);
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

float exp_shift_sum(float* x, int64_t n, float shift) {
  int64_t i = 0;
  float sum = 0;
#if HG_AVX512
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), sh));
    _mm512_mask_storeu_ps(x + i, m, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    i = n;
  }
  sum = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) sum += (x[i] = exp_portable(x[i] - shift));
  return sum;
}

void f32_to_bf16_row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if HG_KERNEL_BF16
  for (; i + 16 <= n; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    std::memcpy(y + i, &b, 32);
  }
#endif
  for (; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

void bf16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
#if HG_AVX512
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))), 16);
    _mm512_storeu_ps(y + i, _mm512_castsi512_ps(v));
  }
#endif
  for (; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

void f16_to_f32_row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
#if HG_AVX512
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
#endif
  for (; i < n; ++i) y[i] = f16_bits_to_f32(x[i]);
}

namespace {
// Loads 16 (masked) elements of a K/V row as F32.
#if HG_AVX512
template <typename T>
inline __m512 load16(const T* p, __mmask16 m) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (std::is_same_v<T, F16Tag>) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}
#endif
// q·k for a K row of type T.
template <typename T>
inline float dot_kv(const float* q, const T* k, int D) {
#if HG_AVX512
  if constexpr (std::is_same_v<T, float>) {
    return dot(q, k, D);
  } else {
    // Two independent FMA chains; full loads in the main loop, one masked tail.
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= D; i += 32) {
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16(k + i, __mmask16(0xffff)), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), load16(k + i + 16, __mmask16(0xffff)), a1);
    }
    for (; i < D; i += 16) {
      const __mmask16 m = D - i >= 16 ? __mmask16(0xffff) : tail_mask(D - i);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), load16(k + i, m), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  }
#else
  return portable_dot(q, k, D);
#endif
}

template <typename T>
void weighted_v_kv(const float* p, int G, const T* V, int64_t n, int D, float* out) {
  std::fill(out, out + int64_t(G) * D, 0.0f);
#if HG_AVX512
  const int nb = (D + 15) / 16;
  const __mmask16 last = last_block_mask(D);
  for (int64_t t = 0; t < n; ++t) {
    const T* v = V + t * D;
    for (int b = 0; b < nb; ++b) {
      const __mmask16 m = b == nb - 1 ? last : __mmask16(0xffff);
      const __m512 vv = load16(v + b * 16, m);
      for (int h = 0; h < G; ++h) {
        float* o = out + int64_t(h) * D + b * 16;
        _mm512_mask_storeu_ps(o, m, _mm512_fmadd_ps(_mm512_set1_ps(p[h * n + t]), vv, _mm512_maskz_loadu_ps(m, o)));
      }
    }
  }
#else
  thread_local std::vector<float> row;  // V[t] converted once for the G heads
  row.resize(size_t(D));
  for (int64_t t = 0; t < n; ++t) {
    for (int d = 0; d < D; ++d) row[size_t(d)] = elem(V, t * D + d);
    for (int h = 0; h < G; ++h) {
      const float ph = p[h * n + t];
      float* o = out + int64_t(h) * D;
      for (int d = 0; d < D; ++d) o[d] += ph * row[size_t(d)];
    }
  }
#endif
}

#if HG_AVX512
// A loaded value kept in a register: without it GCC folds the load into every FMA that uses the
// value (one 512-bit load per FMA), and this core issues one 512-bit load per cycle, so a block
// shared by G heads was loaded G times and the loads, not the FMAs, set the pace.
inline __m512 in_register(__m512 x) {
  asm("" : "+v"(x));
  return x;
}

// Rows ahead that the attention kernels prefetch (reading past the end of K or V is harmless:
// prefetches do not fault): 64 rows (one attention chunk), but no more than 16 KiB, the best of
// the distances tried (docs/performance.md, "Tuning choices").
constexpr int kPrefetchRows = 64;
constexpr int kPrefetchBytes = 16384;
constexpr int prefetch_rows(int row_bytes) {
  return std::min(kPrefetchRows, std::max(16, kPrefetchBytes / row_bytes));
}

// Lane i of the result is the sum of the 16 lanes of v[i] (a transposing tree: 15 shuffle pairs
// for 16 sums instead of 16 separate horizontal reductions). Always inlined: called out of line
// (GCC 12 did so under the target pragma), its caller kept the 16 accumulators in memory and stored
// them on every D-block (docs/performance.md, "Tuning choices").
[[gnu::always_inline]] inline __m512 hsum16(const __m512* v) {
  __m512 w[8], z[4];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: v[2i] folded to 8; lanes 8-15: v[2i+1]
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // quarter j: key 4i+j folded to 4 lanes
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
  const __m512 y0 = _mm512_add_ps(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
  const __m512 y1 = _mm512_add_ps(_mm512_unpacklo_ps(z[2], z[3]), _mm512_unpackhi_ps(z[2], z[3]));
  // 64-bit interleave (pairs of floats move together), then a float add.
  const __m512d y0d = _mm512_castps_pd(y0), y1d = _mm512_castps_pd(y1);
  const __m512 r = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(y0d, y1d)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(y0d, y1d)));
  // Lane 4j+m now holds key 4m+j; restore key order.
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

// Heads of D = 8 (stories260K, the accuracy runs' model) hold two rows per 512-bit vector. A
// block of 16 keys is transposed into 8 vectors, one per dimension (keys in the lane order
// 0 2 4 6 1 3 5 7 8 10 …), so that each head's 16 logits are 8 FMAs with broadcast query elements
// and one permute, not 16 half-masked FMAs and a 16-vector reduction.
template <typename T>
inline __m512 load_row_pair(const T* p, int rows) {  // rows 0, 1 or 2 of 8 elements
  return rows <= 0 ? _mm512_setzero_ps() : load16(p, rows >= 2 ? __mmask16(0xffff) : __mmask16(0x00ff));
}

template <int G, typename T>
inline void logits16_d8(const float* q, const T* K, int kk, float scale, float* s, int64_t ld) {
  __m512 r[8], t[8], col[8];
  for (int j = 0; j < 8; ++j) r[j] = load_row_pair(K + 16 * j, kk - 2 * j);
  // 4×4 transposes within each 128-bit lane of r0..r3 and of r4..r7: t[4·half + e] lane L holds
  // element e of that lane of the four rows.
  for (int half = 0; half < 2; ++half) {
    const __m512* a = r + 4 * half;
    const __m512d u0 = _mm512_castps_pd(_mm512_unpacklo_ps(a[0], a[1])),
                  u1 = _mm512_castps_pd(_mm512_unpackhi_ps(a[0], a[1])),
                  u2 = _mm512_castps_pd(_mm512_unpacklo_ps(a[2], a[3])),
                  u3 = _mm512_castps_pd(_mm512_unpackhi_ps(a[2], a[3]));
    t[4 * half + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(u0, u2));
    t[4 * half + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(u0, u2));
    t[4 * half + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(u1, u3));
    t[4 * half + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(u1, u3));
  }
  // Lanes 0 and 2 of t[e] hold dimension e of the even and odd keys, lanes 1 and 3 dimension 4 + e.
  for (int e = 0; e < 4; ++e) {
    col[e] = _mm512_shuffle_f32x4(t[e], t[4 + e], 0x88);
    col[4 + e] = _mm512_shuffle_f32x4(t[e], t[4 + e], 0xDD);
  }
  const __m512i natural = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  const __mmask16 valid = tail_mask(kk);  // kk ≤ 16
  for (int h = 0; h < G; ++h) {
    const float* qh = q + 8 * h;
    __m512 a = _mm512_mul_ps(_mm512_set1_ps(qh[0]), col[0]);
    for (int d = 1; d < 8; ++d) a = _mm512_fmadd_ps(_mm512_set1_ps(qh[d]), col[d], a);
    a = _mm512_mul_ps(_mm512_permutexvar_ps(natural, a), _mm512_set1_ps(scale));
    _mm512_storeu_ps(s + h * ld, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, a));
  }
}

// acc[h] += Σ_{c < cn} p[h * ld + c] · V[c] for D = 8: two rows per vector (even rows' sums in the
// low 8 lanes, odd rows' in the high 8), each row's weight spread over its half by a permute.
template <int G, typename T>
inline void weighted_v_d8(const float* p, int64_t ld, const T* V, int cn, float* acc) {
  __m512 a[G];
  for (int h = 0; h < G; ++h) a[h] = _mm512_setzero_ps();
  __m512i pair[8];
  for (int j = 0; j < 8; ++j)
    pair[j] = _mm512_add_epi32(_mm512_set1_epi32(2 * j),
                               _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  for (int c0 = 0; c0 < cn; c0 += 16) {
    const int kk = std::min(16, cn - c0);
    const __mmask16 valid = tail_mask(kk);  // kk ≤ 16
    __m512 P[G];
    for (int h = 0; h < G; ++h) P[h] = _mm512_maskz_loadu_ps(valid, p + h * ld + c0);
    for (int j = 0; 2 * j < kk; ++j) {
      const __m512 v = in_register(load_row_pair(V + int64_t(c0 + 2 * j) * 8, kk - 2 * j));
      for (int h = 0; h < G; ++h) a[h] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pair[j], P[h]), v, a[h]);
    }
  }
  for (int h = 0; h < G; ++h) {
    const __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(a[h]), _mm512_extractf32x8_ps(a[h], 1));
    _mm256_storeu_ps(acc + 8 * h, _mm256_add_ps(_mm256_loadu_ps(acc + 8 * h), sum));
  }
}

// Bytes ahead of a row of D elements of T that the attention kernels prefetch: prefetch_rows() rows.
template <typename T>
constexpr int64_t prefetch_bytes(int D) {
  return int64_t(prefetch_rows(D * int(sizeof(T)))) * D * int64_t(sizeof(T));
}

// a[h][i] = the partial vector (16 lanes) of q[h] · row[i], for NK rows of D elements read once
// for the G heads; the rows are converted to F32 as they load.
template <int G, int NK, int DT, int Hint = _MM_HINT_T2, typename T>
[[gnu::always_inline]] inline void dot_rows(const float* q, const T* const (&row)[NK], int D,
                                            int64_t ahead_bytes, __m512 (&a)[G][NK]) {
  const int nb = (D + 15) / 16;
  const __mmask16 last = last_block_mask(D);
  for (int h = 0; h < G; ++h)
    for (int i = 0; i < NK; ++i) a[h][i] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const int off = b * 16 * int(sizeof(T));  // bytes into the row
    // Software prefetch ahead_bytes ahead of each row (the hardware prefetcher alone leaves the
    // single-thread stream well under the read bandwidth), one line per row per 64 bytes read,
    // spread over the loop: bursts of requests get dropped.
    if (off % 64 == 0)
      for (int i = 0; i < NK; ++i)
        prefetch_read<Hint>(reinterpret_cast<const char*>(row[i]) + ahead_bytes + off);
    const __mmask16 m = b == nb - 1 ? last : __mmask16(0xffff);
    __m512 kv[NK];
    for (int i = 0; i < NK; ++i) kv[i] = in_register(load16(row[i] + b * 16, m));
    for (int h = 0; h < G; ++h) {
      const __m512 qv = in_register(_mm512_maskz_loadu_ps(m, q + h * D + b * 16));
      for (int i = 0; i < NK; ++i) a[h][i] = _mm512_fmadd_ps(qv, kv[i], a[h][i]);
    }
  }
}

// Keys per dot_rows step: KB keys share each q load (with one key per step the q loads, G per 16
// elements, outnumbered the FMAs' other operand and bound the kernel on this core's one 512-bit load
// per cycle). G·KB accumulators + KB keys + 1 q stay within the 32 registers.
template <int G>
constexpr int logit_keys_per_step() {
  return G <= 4 ? 4 : 2;
}

// s[h * ld + c] = scale · q[h] · K[c] for c < kk ≤ 16 (lanes c ≥ kk get -inf). Each K row is read
// once for the G heads.
template <int G, int DT, typename T>
inline void logits16(const float* q, const T* K, int kk, int D_, float scale, float* s, int64_t ld) {
  if constexpr (DT == 8) {
    logits16_d8<G>(q, K, kk, scale, s, ld);
    return;
  }
  const int D = DT > 0 ? DT : D_;
  constexpr int KB = logit_keys_per_step<G>();
  const int64_t ahead_bytes = prefetch_bytes<T>(D);
  auto step = [&](auto kb_const, int c, __m512(&a)[G][decltype(kb_const)::value]) {
    constexpr int NK = decltype(kb_const)::value;
    const T* row[NK];
    for (int i = 0; i < NK; ++i) row[i] = K + int64_t(c + i) * D;
    dot_rows<G, NK, DT>(q, row, D, ahead_bytes, a);
  };
  int c = 0;
  if constexpr (G * KB == 16) {
    // A step's 16 accumulators reduce in registers, one hsum16 per step (lane h·KB + i), instead
    // of being stored as partial vectors and reduced per head: L2-resident G = 4 logits went from
    // 12.4 to 10.1 ns per key (F32) and 12.2 to 11.5 (F16).
    for (; c + KB <= kk; c += KB) {
      __m512 a[G][KB];
      step(std::integral_constant<int, KB>{}, c, a);
      alignas(64) float r[16];
      _mm512_store_ps(r, _mm512_mul_ps(hsum16(&a[0][0]), _mm512_set1_ps(scale)));
      for (int h = 0; h < G; ++h) std::memcpy(s + h * ld + c, r + h * KB, KB * sizeof(float));
    }
  } else {
    alignas(64) __m512 part[G][16];
    for (; c + KB <= kk; c += KB) {
      __m512 a[G][KB];
      step(std::integral_constant<int, KB>{}, c, a);
      for (int h = 0; h < G; ++h)
        for (int i = 0; i < KB; ++i) part[h][c + i] = a[h][i];
    }
    for (int r = c; r < 16; ++r)
      for (int h = 0; h < G; ++h) part[h][r] = _mm512_setzero_ps();
    const __mmask16 valid = tail_mask(c);  // lanes ≥ c: written below
    for (int h = 0; h < G; ++h)
      _mm512_storeu_ps(s + h * ld, _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), valid, hsum16(part[h]),
                                                      _mm512_set1_ps(scale)));
  }
  for (; c < kk; ++c) {  // fewer than KB keys left: one at a time
    __m512 a[G][1];
    step(std::integral_constant<int, 1>{}, c, a);
    for (int h = 0; h < G; ++h) s[h * ld + c] = scale * _mm512_reduce_add_ps(a[h][0]);
  }
  for (; c < 16; ++c)
    for (int h = 0; h < G; ++h) s[h * ld + c] = -INFINITY;
}

// acc[h] += Σ_{c < cn} p[h * ld + c] · V[c] for D-blocks [b0, b0 + BB): G·BB accumulators stay in
// registers across the chunk's rows.
// D-blocks per V pass: G·BB ≤ 16 accumulators.
constexpr int v_blocks_per_pass(int G) { return G <= 4 ? 4 : 2; }

// The G·BB accumulators of D-blocks [b0, b0 + BB) of acc [G, D], with each block's mask (none
// past block nb − 1, `last` for it).
template <int G, int BB>
[[gnu::always_inline]] inline void load_v_blocks(const float* acc, int D, int b0, int nb, __mmask16 last,
                                                 __m512 (&a)[G][BB], __mmask16 (&mk)[BB]) {
  for (int j = 0; j < BB; ++j) {
    mk[j] = b0 + j < nb ? (b0 + j == nb - 1 ? last : __mmask16(0xffff)) : __mmask16(0);
    for (int h = 0; h < G; ++h) a[h][j] = _mm512_maskz_loadu_ps(mk[j], acc + h * D + (b0 + j) * 16);
  }
}
template <int G, int BB>
[[gnu::always_inline]] inline void store_v_blocks(float* acc, int D, int b0, const __m512 (&a)[G][BB],
                                                  const __mmask16 (&mk)[BB]) {
  for (int j = 0; j < BB; ++j)
    for (int h = 0; h < G; ++h) _mm512_mask_storeu_ps(acc + h * D + (b0 + j) * 16, mk[j], a[h][j]);
}
// a[h][j] += p(h) · D-block b0 + j of one V row, h < G, j < BB (the row read once for the G heads).
template <int G, int BB, typename T, typename P>
[[gnu::always_inline]] inline void add_v_row(const T* row, int b0, const __mmask16 (&mk)[BB], P&& p,
                                             __m512 (&a)[G][BB]) {
  __m512 vv[BB];
  for (int j = 0; j < BB; ++j) vv[j] = in_register(load16(row + (b0 + j) * 16, mk[j]));
  for (int h = 0; h < G; ++h) {
    const __m512 ph = _mm512_set1_ps(p(h));
    for (int j = 0; j < BB; ++j) a[h][j] = _mm512_fmadd_ps(ph, vv[j], a[h][j]);
  }
}

// Each pass prefetches the lines of its own D-blocks, kPrefetchRows rows ahead, so that the V
// stream's requests are spread over all the passes rather than issued by the first pass alone
// (docs/performance.md, "Tuning choices").
template <int G, int BB, int DT, typename T>
inline void weighted_v_blocks(const float* p, int64_t ld, const T* V, int cn, int D_, int b0, int nb, __mmask16 last,
                              float* acc) {
  const int D = DT > 0 ? DT : D_;
  __m512 a[G][BB];
  __mmask16 mk[BB];
  load_v_blocks<G, BB>(acc, D, b0, nb, last, a, mk);
  const int pf_begin = b0 * 16 * int(sizeof(T)), pf_end = std::min(D, (b0 + BB) * 16) * int(sizeof(T));
  const int64_t ahead_bytes = prefetch_bytes<T>(D);
  for (int c = 0; c < cn; ++c) {
    const T* row = V + int64_t(c) * D;
    const char* ahead = reinterpret_cast<const char*>(row) + ahead_bytes;
    for (int off = pf_begin; off < pf_end; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T2);
    const auto prob = [&](int h) { return p[h * ld + c]; };
    add_v_row<G, BB>(row, b0, mk, prob, a);
  }
  store_v_blocks<G, BB>(acc, D, b0, a, mk);
}

// All D-blocks of a chunk: passes of BB blocks, the last pass only as wide as the blocks left, so
// that a small head (D = 8, 16, 32) does not run three masked-off blocks' loads and FMAs per row.
template <int G, int DT, typename T>
inline void weighted_v_all_blocks(const float* p, int64_t ld, const T* V, int cn, int D, int nb, __mmask16 last,
                                  float* acc) {
  if constexpr (DT == 8) {
    weighted_v_d8<G>(p, ld, V, cn, acc);
    return;
  }
  constexpr int BB = v_blocks_per_pass(G);
  int b0 = 0;
  for (; b0 + BB <= nb; b0 += BB) weighted_v_blocks<G, BB, DT>(p, ld, V, cn, D, b0, nb, last, acc);
  switch (nb - b0) {
    case 1: weighted_v_blocks<G, 1, DT>(p, ld, V, cn, D, b0, nb, last, acc); break;
    case 2: weighted_v_blocks<G, 2, DT>(p, ld, V, cn, D, b0, nb, last, acc); break;
    case 3: weighted_v_blocks<G, 3, DT>(p, ld, V, cn, D, b0, nb, last, acc); break;
    default: break;
  }
}

// Bytes ahead that AMD cores prefetch, into L1, a stream of one of four parts of a key range
// (four_part_logits).
constexpr int64_t kFourPartAheadAmd = 2048;

// The same for the attention's four-part blocks, whose V pass comes between one step's keys and
// the next: 16-bit rows of D = 128 read faster one whole 16-row block ahead (4 KiB); F32 rows do
// not (docs/performance.md, "Tuning choices").
template <typename T>
constexpr int64_t attention_four_part_ahead_amd() {
  return sizeof(T) == 2 ? 4096 : kFourPartAheadAmd;
}

// Where a four-part block keeps the logit of head h, part j's row r (r < 16, j < 4) for G ∈ {1, 2,
// 4} query heads: each step reads R = 4 / G consecutive rows of each part, 16 logits per step in
// the lane order of hsum16, head h in lanes [16h / G, 16(h + 1) / G).
template <int G>
constexpr int four_part_index(int r, int h, int part) {
  constexpr int R = 4 / G;
  return 16 * (r / R) + 4 * (h * R + r % R) + part;
}

// acc[h] += Σ p[four_part_index(r, h, j)] · part j's row r, r < 16, j < 4, for D-blocks [b0, b0 + BB):
// the V rows of a four-part block (vp[j]: part j's first row), read row r of each part in turn so
// that each part is a stream in address order.
template <int G, int BB, int DT, int Hint, typename T>
inline void weighted_v_four_parts(const float* p, const T* const (&vp)[4], int D_, int b0, int nb,
                                  __mmask16 last, int64_t ahead_bytes, float* acc) {
  const int D = DT > 0 ? DT : D_;
  __m512 a[G][BB];
  __mmask16 mk[BB];
  load_v_blocks<G, BB>(acc, D, b0, nb, last, a, mk);
  const int pf_begin = b0 * 16 * int(sizeof(T)), pf_end = std::min(D, (b0 + BB) * 16) * int(sizeof(T));
  for (int r = 0; r < 16; ++r)
    for (int part = 0; part < 4; ++part) {
      const T* row = vp[part] + int64_t(r) * D;
      const char* ahead = reinterpret_cast<const char*>(row) + ahead_bytes;
      for (int off = pf_begin; off < pf_end; off += 64) prefetch_read<Hint>(ahead + off);
      const auto prob = [&](int h) { return p[four_part_index<G>(r, h, part)]; };
      add_v_row<G, BB>(row, b0, mk, prob, a);
    }
  store_v_blocks<G, BB>(acc, D, b0, a, mk);
}

// s[four_part_index(r, h, j)] = scale · q[h] · (part j's row r), r < 16, j < 4 (kp[j]: part j's
// first key row), G ∈ {1, 2, 4}: each step reads 4 / G rows of each part, as four_part_logits
// does for G = 4, and stores its 16 logits as one vector.
template <int G, int DT, int Hint, typename T>
inline void logits_four_parts(const float* q, const T* const (&kp)[4], int D, float scale,
                              int64_t ahead_bytes, float* s) {
  constexpr int R = 4 / G;
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < 16; r += R) {
    const T* row[4 * R];
    for (int rr = 0; rr < R; ++rr)
      for (int part = 0; part < 4; ++part) row[4 * rr + part] = kp[part] + int64_t(r + rr) * D;
    __m512 a[G][4 * R];
    dot_rows<G, 4 * R, DT, Hint>(q, row, D, ahead_bytes, a);
    _mm512_store_ps(s + 16 * (r / R), _mm512_mul_ps(hsum16(&a[0][0]), sc));
  }
}

// One head's running softmax max raised to m if m is larger: its output accumulators out_h [D]
// rescaled (unless first: nothing accumulated yet). Returns the factor its running sum takes (1
// when the max stays).
[[gnu::always_inline]] inline float raise_running_max(float& mx, float m, float* out_h, int D, bool first) {
  if (!(m > mx)) return 1.0f;
  const float corr = mx == -INFINITY ? 0.0f : std::exp(mx - m);
  if (!first)
    for (int d = 0; d < D; ++d) out_h[d] *= corr;
  mx = m;
  return corr;
}

// Keys from which the attention reads its range as four parts (each at least 256 keys).
constexpr int64_t kFourPartMinKeys = 1024;

// The heads with which attention_group_fused reads in four parts, 0 where it keeps the 64-key
// chunks (rows under 128 elements: at D = 64 the kernel is bound by its arithmetic, which this order
// raises). G ∈ {1, 2, 4, 8} as they are (the 16 lanes of hsum16 hold whole rows of each part for up
// to four heads; eight take two passes over each block, the second from L1); G = 3 and 5-7 padded
// to 4 and 8 (zero queries, results dropped), four-part reading at the padded heads' arithmetic
// beating the chunks at G's (docs/performance.md, "Tuning choices").
template <int G, int DT>
constexpr int four_part_heads() {
  if (DT < 128 || G > 8) return 0;
  return G == 3 ? 4 : G >= 5 ? 8 : G;
}

// The first 4·per keys of the attention (per = n / 4 rounded down to 16 keys) as four parts, one
// 16-key block of each per step, 4 / G rows of each part in turn (heads in groups of at most four),
// so that K and V are read as four streams in address order each, as the read reference reads.
// Same online softmax as attention_group_fused (mx, sum, out its running state, s its 64·G-float
// block; each group's logits in four_part_index's order); returns 4·per, the first key left to the
// caller. Heads from `live` on are padding: no taps, no key limits.
template <int G, int DT, typename T>
int64_t attention_four_parts(const float* q, const T* K, const T* V, int64_t n, float scale, float* out,
                             float* s, float* mx, float* sum, float* logits_out, float* probs_out,
                             int64_t tap_ld, const int32_t* key_limits, int live = G) {
  static_assert(DT % 16 == 0, "whole 16-element blocks");
  static_assert(four_part_heads<G, DT>() == G, "whole rows of each part per step");
  constexpr int GQ = G < 4 ? G : 4, M = G / GQ;     // M groups of GQ heads
  constexpr int D = DT, nb = DT / 16, L = 16 / GQ;  // L: lanes per head
  const int64_t per = n / 4 / 16 * 16;
  __m512 vsum[M];  // lanes of group m's head h: parts of its sum
  for (auto& v : vsum) v = _mm512_setzero_ps();
  auto run = [&](auto hint, int64_t ahead_bytes) {
    constexpr int H = decltype(hint)::value;
    for (int64_t b = 0; b < per; b += 16) {
      const T* kp[4];
      const T* vp[4];
      for (int part = 0; part < 4; ++part)
        kp[part] = K + (part * per + b) * D, vp[part] = V + (part * per + b) * D;
      for (int m = 0; m < M; ++m)
        logits_four_parts<GQ, DT, H>(q + m * GQ * D, kp, D, scale, ahead_bytes, s + 64 * GQ * m);
      if (key_limits || logits_out || probs_out)
        for (int r = 0; r < 16; ++r)
          for (int h = 0; h < live; ++h)
            for (int part = 0; part < 4; ++part) {
              const int64_t t = part * per + b + r;
              float& x = s[64 * GQ * (h / GQ) + four_part_index<GQ>(r, h % GQ, part)];
              if (key_limits && t >= key_limits[h]) x = -INFINITY;
              if (logits_out)
                logits_out[h * tap_ld + t] = x;
              else if (probs_out)
                probs_out[h * tap_ld + t] = x;  // parked, normalised at the end
            }
      for (int m = 0; m < M; ++m) {
        float* sm = s + 64 * GQ * m;
        // Online softmax over the group's block: each lane's max, then each head's over its L lanes.
        __m512 m16 = _mm512_load_ps(sm);
        for (int r = 1; r < 4 * GQ; ++r) m16 = _mm512_max_ps(m16, _mm512_load_ps(sm + 16 * r));
        m16 = _mm512_max_ps(m16, _mm512_shuffle_ps(m16, m16, 0xB1));
        m16 = _mm512_max_ps(m16, _mm512_shuffle_ps(m16, m16, 0x4E));
        if constexpr (GQ <= 2) m16 = _mm512_max_ps(m16, _mm512_shuffle_f32x4(m16, m16, 0xB1));
        if constexpr (GQ == 1) m16 = _mm512_max_ps(m16, _mm512_shuffle_f32x4(m16, m16, 0x4E));
        alignas(64) float mh[16], corr[16];
        _mm512_store_ps(mh, m16);
        bool grew = false;
        for (int h = 0; h < GQ; ++h) {
          const int hg = m * GQ + h;
          const float c = raise_running_max(mx[hg], mh[L * h], out + hg * D, D, b == 0);
          grew |= c != 1.0f;
          for (int j = 0; j < L; ++j) corr[L * h + j] = c, mh[L * h + j] = mx[hg];
        }
        if (grew) vsum[m] = _mm512_mul_ps(vsum[m], _mm512_load_ps(corr));
        const __m512 shift = _mm512_load_ps(mh);
        for (int r = 0; r < 4 * GQ; ++r) {
          const __m512 e = exp512(_mm512_sub_ps(_mm512_load_ps(sm + 16 * r), shift));
          _mm512_store_ps(sm + 16 * r, e);
          vsum[m] = _mm512_add_ps(vsum[m], e);
        }
      }
      constexpr int BB = v_blocks_per_pass(GQ);
      for (int m = 0; m < M; ++m)
        for (int b0 = 0; b0 < nb; b0 += BB)
          weighted_v_four_parts<GQ, BB, DT, H>(s + 64 * GQ * m, vp, D, b0, nb, __mmask16(0xffff), ahead_bytes,
                                               out + m * GQ * D);
    }
  };
  if (amd_core())
    run(std::integral_constant<int, _MM_HINT_T0>{}, attention_four_part_ahead_amd<T>());
  else
    run(std::integral_constant<int, _MM_HINT_T2>{}, prefetch_bytes<T>(D));
  for (int m = 0; m < M; ++m) {
    alignas(64) float vs[16];
    _mm512_store_ps(vs, vsum[m]);
    for (int h = 0; h < GQ; ++h) {
      float t = 0;
      for (int j = 0; j < L; ++j) t += vs[L * h + j];
      sum[m * GQ + h] = t;
    }
  }
  return 4 * per;
}

// One pass over K and V in chunks of kChunk keys with an online softmax (running max and sum per
// head; accumulators rescaled when the max grows): K and V are each streamed once, the chunk's
// logits stay in L1. Long ranges start with attention_four_parts where four_part_heads allows.
template <int G, int DT, typename T>
void attention_group_fused(const float* q, const T* K, const T* V, int64_t n, int D_, float scale, float* out,
                           float* logits_out, float* probs_out, int64_t tap_ld, float* lse_out,
                           const int32_t* key_limits) {
  const int D = DT > 0 ? DT : D_;
  constexpr int kChunk = 64;
  alignas(64) float s[G * kChunk];
  float mx[G], sum[G];
  for (int h = 0; h < G; ++h) mx[h] = -INFINITY, sum[h] = 0.0f;
  std::fill(out, out + int64_t(G) * D, 0.0f);
  const int nb = (D + 15) / 16;
  const __mmask16 last = last_block_mask(D);
  // The chunk's logits in s → exp(logit − running max) in place, the running max and sum updated
  // and the accumulators rescaled when the max grows.
  auto softmax_chunk = [&](bool first) {
    for (int h = 0; h < G; ++h) {
      float* sh = s + h * kChunk;
      __m512 m16 = _mm512_set1_ps(-INFINITY);
      for (int c = 0; c < kChunk; c += 16) m16 = _mm512_max_ps(m16, _mm512_load_ps(sh + c));
      sum[h] *= raise_running_max(mx[h], _mm512_reduce_max_ps(m16), out + h * D, D, first);
      sum[h] += exp_shift_sum(sh, kChunk, mx[h]);  // lanes ≥ cn hold -inf → 0
    }
  };
  int64_t t_begin = 0;
  if constexpr (constexpr int GP = four_part_heads<G, DT>(); GP == G) {
    if (n >= kFourPartMinKeys)
      t_begin = attention_four_parts<G, DT>(q, K, V, n, scale, out, s, mx, sum, logits_out, probs_out, tap_ld,
                                            key_limits);
  } else if constexpr (GP > 0) {
    if (n >= kFourPartMinKeys) {
      alignas(64) float qp[GP * DT] = {}, outp[GP * DT] = {}, sp[GP * kChunk];
      float mxp[GP], sump[GP];
      std::copy(q, q + G * DT, qp);
      for (int h = 0; h < GP; ++h) mxp[h] = -INFINITY, sump[h] = 0.0f;
      t_begin = attention_four_parts<GP, DT>(qp, K, V, n, scale, outp, sp, mxp, sump, logits_out, probs_out,
                                             tap_ld, key_limits, G);
      std::copy(outp, outp + G * DT, out);
      std::copy(mxp, mxp + G, mx);
      std::copy(sump, sump + G, sum);
    }
  }
  for (int64_t t0 = t_begin; t0 < n; t0 += kChunk) {
    const int cn = int(std::min<int64_t>(kChunk, n - t0));
    if (cn < kChunk) std::fill(s, s + G * kChunk, -INFINITY);  // the last chunk's unused lanes
    for (int c0 = 0; c0 < cn; c0 += 16)
      logits16<G, DT>(q, K + (t0 + c0) * D, std::min(16, cn - c0), D, scale, s + c0, kChunk);
    if (key_limits)  // head h sees keys [0, key_limits[h]) only
      for (int h = 0; h < G; ++h)
        for (int64_t c = std::max<int64_t>(0, key_limits[h] - t0); c < cn; ++c) s[h * kChunk + c] = -INFINITY;
    if (logits_out)
      for (int h = 0; h < G; ++h)
        std::copy(s + h * kChunk, s + h * kChunk + cn, logits_out + h * tap_ld + t0);
    else if (probs_out)  // logits parked in probs_out, normalised at the end
      for (int h = 0; h < G; ++h) std::copy(s + h * kChunk, s + h * kChunk + cn, probs_out + h * tap_ld + t0);
    softmax_chunk(t0 == 0);
    weighted_v_all_blocks<G, DT>(s, kChunk, V + t0 * D, cn, D, nb, last, out);
  }
  for (int h = 0; h < G; ++h) {
    const float inv = sum[h] > 0 ? 1.0f / sum[h] : 0.0f;
    for (int d = 0; d < D; ++d) out[h * D + d] *= inv;
    const float lse = mx[h] + std::log(sum[h]);
    if (lse_out) lse_out[h] = lse;
    if (probs_out) {  // exp(logit − lse), in place over the logits parked there or a copy of them
      float* pr = probs_out + h * tap_ld;
      if (logits_out) std::copy(logits_out + h * tap_ld, logits_out + h * tap_ld + n, pr);
      exp_shift_sum(pr, n, lse);
    }
  }
}

// Key blocks of 16 in [t0, t1), visited kKeyStreams side by side: block i of each of the range's
// kKeyStreams contiguous parts in turn, the last part taking the remainder. Several streams read
// faster than one on this core's prefetchers, as the read reference's eight do (docs/performance.md,
// "Tuning choices"). fn(t, kk): the block at key t, kk ≤ 16 keys.
constexpr int kKeyStreams = 4;
template <typename F>
inline void key_blocks_interleaved(int64_t t0, int64_t t1, F&& fn) {
  const int64_t per = (t1 - t0) / 16 / kKeyStreams;  // whole blocks per part
  for (int64_t i = 0; i < per; ++i)
    for (int j = 0; j < kKeyStreams; ++j) fn(t0 + (j * per + i) * 16, 16);
  for (int64_t t = t0 + kKeyStreams * per * 16; t < t1; t += 16) fn(t, int(std::min<int64_t>(16, t1 - t)));
}

// G = 4 query heads: each step's four keys come from four parts of [t0, t1), one each, so that
// every row is read in address order: the hardware prefetcher streams that order, not four adjacent
// rows' blocks in turn (docs/performance.md, "HybridGen's CPU stage"). fn(t, per, v) per step: lane
// 4h + j of v is head h's scaled logit of key t + j·per. Returns the first key not visited (the
// last (t1 − t0) mod 4 are left to the caller).
// Each part is a stream in address order: AMD cores read it faster prefetched kFourPartAheadAmd
// ahead into L1 than prefetch_bytes() ahead into L2; Intel keeps the latter (docs/performance.md,
// "Tuning choices").
template <int DT, typename T, typename F>
[[gnu::always_inline]] inline int64_t four_part_logits(const float* q, const T* K, int64_t t0, int64_t t1,
                                                       int D, float scale, F&& fn) {
  const int64_t per = (t1 - t0) / 4;
  const __m512 sc = _mm512_set1_ps(scale);
  auto run = [&](auto hint, int64_t ahead_bytes) {
    for (int64_t i = 0; i < per; ++i) {
      const T* row[4];
      for (int j = 0; j < 4; ++j) row[j] = K + (t0 + j * per + i) * D;
      __m512 a[4][4];
      dot_rows<4, 4, DT, decltype(hint)::value>(q, row, D, ahead_bytes, a);
      fn(t0 + i, per, _mm512_mul_ps(hsum16(&a[0][0]), sc));
    }
  };
  if (amd_core())
    run(std::integral_constant<int, _MM_HINT_T0>{}, kFourPartAheadAmd);
  else
    run(std::integral_constant<int, _MM_HINT_T2>{}, prefetch_bytes<T>(D));
  return t0 + 4 * per;
}

template <int G, int DT, typename T>
void group_logits_fixed(const float* q, const T* K, int64_t n, int64_t t0, int64_t t1, int D_, float scale,
                        float* logits) {
  const int D = DT > 0 ? DT : D_;
  if constexpr (G == 4 && DT > 8) {
    // The 16 logits of each step (head h, part j in lane 4h + j) gather in a tile, 16 steps per
    // row, and leave as one 64-byte store per row: stored one by one into the 16 destination rows
    // (64 KiB and 16 KiB apart at 16K keys), they hit one L1 set and evicted each other.
    alignas(64) float tile[16][16];
    int64_t first = 0, stride = 0;
    int k = 0;
    auto flush = [&] {
      for (int h = 0; h < G; ++h)
        for (int j = 0; j < 4; ++j) {
          float* dst = logits + h * n + first + j * stride;
          if (k == 16)
            _mm512_storeu_ps(dst, _mm512_load_ps(tile[4 * h + j]));
          else
            std::copy(tile[4 * h + j], tile[4 * h + j] + k, dst);
        }
      k = 0;
    };
    t0 = four_part_logits<DT>(q, K, t0, t1, D, scale, [&](int64_t t, int64_t per, __m512 v) {
      if (k == 0) first = t, stride = per;
      alignas(64) float r[16];
      _mm512_store_ps(r, v);
      for (int lane = 0; lane < 16; ++lane) tile[lane][k] = r[lane];
      if (++k == 16) flush();
    });
    if (k > 0) flush();
  }
  key_blocks_interleaved(t0, t1, [&](int64_t t, int kk) {
    if (kk == 16) {
      logits16<G, DT>(q, K + t * D, 16, D, scale, logits + t, n);
    } else {  // tail: through a buffer, so nothing past t1 is written
      alignas(64) float tmp[G * 16];
      logits16<G, DT>(q, K + t * D, kk, D, scale, tmp, 16);
      for (int h = 0; h < G; ++h) std::copy(tmp + h * 16, tmp + h * 16 + kk, logits + h * n + t);
    }
  });
}

template <int G, int DT, typename T>
void group_logit_max_fixed(const float* q, const T* K, int64_t t0, int64_t t1, int D_, float scale,
                           float* score) {
  const int D = DT > 0 ? DT : D_;
  if constexpr (G == 4 && DT > 8) {
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    t0 = four_part_logits<DT>(q, K, t0, t1, D, scale, [&](int64_t t, int64_t per, __m512 v) {
      v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), neg_inf);  // NaN: skipped
      v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
      v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // lane j: the max over the heads
      alignas(16) float r[4];
      _mm_store_ps(r, _mm512_castps512_ps128(v));
      for (int j = 0; j < 4; ++j) score[t + j * per] = r[j];
    });
  }
  key_blocks_interleaved(t0, t1, [&](int64_t t, int kk) {
    alignas(64) float tmp[G * 16];  // this block's logits, in L1
    logits16<G, DT>(q, K + t * D, kk, D, scale, tmp, 16);
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int h = 0; h < G; ++h) m = _mm512_max_ps(_mm512_load_ps(tmp + h * 16), m);  // NaN: m
    _mm512_mask_storeu_ps(score + t, tail_mask(kk), m);
  });
}

// out[h] = Σ_t p[h, t] · V[t]: the attention's V pass (accumulators in registers) over chunks of
// 64 rows, so that each chunk's rows stay in L1 across the D-block passes.
template <int G, int DT, typename T>
void group_weighted_v_fixed(const float* p, const T* V, int64_t n, int D_, float* out) {
  const int D = DT > 0 ? DT : D_;
  const int nb = (D + 15) / 16;
  const __mmask16 last = last_block_mask(D);
  std::fill(out, out + int64_t(G) * D, 0.0f);
  for (int64_t t0 = 0; t0 < n; t0 += 64) {
    const int cn = int(std::min<int64_t>(64, n - t0));
    weighted_v_all_blocks<G, DT>(p + t0, n, V + t0 * D, cn, D, nb, last, out);
  }
}
#endif

// y[m, n] = x[m] · W[n] for n in [n0, n1), MR rows of x (decode batch), W rows of type T. Blocks
// of 16 weight rows, read RB rows side by side per pass (RB·MR accumulators), and one hsum16 per
// x row turns the 16 rows' partial vectors into 16 outputs. Weights are read once, streamed.
#if HG_AVX512
constexpr int64_t kGemvPrefetchRows = 16;
// One step of the GEMV's inner loop, per weight type: kStep weights per row, loaded and multiplied
// into F32 accumulators.
// - GemvConvert<T>: F32/F16/BF16 weights converted to F32 as they stream, F32 x, FMA.
// - GemvBf16Dot: BF16 weights with `vdpbf16ps` (32 weights per instruction, no conversion, two
//   products per F32 lane) against x rounded to BF16.
template <typename T>
struct GemvConvert {
  using W = T;
  using X = float;
  using XV = __m512;
  using WV = __m512;
  using Mask = __mmask16;
  static constexpr int kStep = 16;
  static Mask tail(int64_t r) { return tail_mask(int(r)); }
  static WV load_w(const T* p, Mask m) { return load16(p, m); }
  static XV load_x(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static __m512 mac(__m512 a, XV x, WV w) { return _mm512_fmadd_ps(x, w, a); }
};
#if HG_KERNEL_BF16
struct GemvBf16Dot {
  using W = uint16_t;
  using X = uint16_t;
  using XV = __m512bh;
  using WV = __m512bh;
  using Mask = __mmask32;
  static constexpr int kStep = 32;
  static Mask tail(int64_t r) { return Mask((uint64_t(1) << r) - 1); }
  static WV load_w(const uint16_t* p, Mask m) { return (__m512bh)_mm512_maskz_loadu_epi16(m, p); }
  static XV load_x(const uint16_t* p, Mask m) { return (__m512bh)_mm512_maskz_loadu_epi16(m, p); }
  static __m512 mac(__m512 a, XV x, WV w) { return _mm512_dpbf16_ps(a, x, w); }
};
#endif

// Weight rows read side by side per pass (RB): more concurrent streams read faster, F16 included
// on both vendors (docs/performance.md, "Tuning choices"). MR·RB accumulators + RB weight vectors
// + x stay within the 32 registers.
template <int MR>
constexpr int gemv_rows_per_pass() {
  return MR <= 2 ? 8 : 4;
}

// Whether the GEMV prefetches the rows ahead. AMD cores stream F32 and BF16 weight rows faster
// with the hardware prefetcher alone, F16 rows slower; Intel cores read every type faster with
// software prefetches (docs/performance.md, "Tuning choices").
template <typename W>
inline bool gemv_prefetches() {
  return std::is_same_v<W, F16Tag> || !amd_core();
}

// y[m, n] for MR x rows and weight rows [n0, n1) (the layout of cpu::gemv), with step policy P.
template <int MR, typename P>
void gemv_t(const typename P::X* x, const typename P::W* W, int64_t K, int64_t n0, int64_t n1, float* y,
            int64_t ldy) {
  constexpr int RB = gemv_rows_per_pass<MR>();
  constexpr int S = P::kStep;
  const int64_t kb_full = K / S;
  const typename P::Mask all = typename P::Mask(~uint64_t(0)), tail = P::tail(K % S);
  const bool prefetch = gemv_prefetches<typename P::W>();
  for (int64_t nb = n0; nb < n1; nb += 16) {
    const int rows = int(std::min<int64_t>(16, n1 - nb));
    alignas(64) __m512 part[MR][16];
    for (int r0 = 0; r0 < rows; r0 += RB) {
      const int rr = std::min(RB, rows - r0);
      const typename P::W* w[RB];
      for (int j = 0; j < RB; ++j) w[j] = W + (nb + r0 + std::min(j, rr - 1)) * K;  // rows past the end repeat
      __m512 a[MR][RB];
      for (int m = 0; m < MR; ++m)
        for (int j = 0; j < RB; ++j) a[m][j] = _mm512_setzero_ps();
      auto step = [&](int64_t k0, typename P::Mask msk) {
        typename P::WV wv[RB];
        for (int j = 0; j < RB; ++j) wv[j] = P::load_w(w[j] + k0, msk);
        for (int m = 0; m < MR; ++m) {
          const typename P::XV xv = P::load_x(x + m * K + k0, msk);
          for (int j = 0; j < RB; ++j) a[m][j] = P::mac(a[m][j], xv, wv[j]);
        }
      };
      for (int64_t kb = 0; kb < kb_full; ++kb) {
        // Prefetch the rows kGemvPrefetchRows ahead, spread over the loop (one line per row per
        // 64 bytes read), so that the requests do not arrive in one burst.
        if (prefetch && (kb * S * int64_t(sizeof(typename P::W))) % 64 == 0)
          for (int j = 0; j < RB; ++j)
            _mm_prefetch(reinterpret_cast<const char*>(w[j] + kGemvPrefetchRows * K + kb * S), _MM_HINT_T2);
        step(kb * S, all);
      }
      if (K % S) step(kb_full * S, tail);
      for (int m = 0; m < MR; ++m)
        for (int j = 0; j < RB; ++j) part[m][r0 + j] = a[m][j];
    }
    for (int m = 0; m < MR; ++m) {
      for (int r = rows; r < 16; ++r) part[m][r] = _mm512_setzero_ps();
      _mm512_mask_storeu_ps(y + m * ldy + nb, rows >= 16 ? __mmask16(0xffff) : tail_mask(rows), hsum16(part[m]));
    }
  }
}

// Whether the one-x-row GEMV reads its rows as streams (gemv_streams) instead of blocks of rows
// side by side (gemv_t): AMD cores read every weight type faster so; Intel was not measured with
// streams (docs/performance.md, "Tuning choices").
inline bool gemv_reads_streams() { return amd_core(); }

// y[n] = x · W[n] for one x row and weight rows [n0, n1), read as kGemvStreams streams: the range
// in that many consecutive parts, one row of each per pass, so that each stream runs through its
// part's contiguous rows front to back, prefetched kGemvStreamAhead bytes ahead into L1. Blocks of
// rows side by side restart every stream at each block, which the hardware prefetcher follows less
// well. Two accumulators per stream (alternate steps) keep the FMA chains short.
constexpr int kGemvStreams = 4;
constexpr int64_t kGemvStreamAhead = 1024;
template <typename P>
void gemv_streams(const typename P::X* x, const typename P::W* W, int64_t K, int64_t n0, int64_t n1,
                  float* y) {
  using WT = typename P::W;
  constexpr int S = kGemvStreams, kS = P::kStep;
  constexpr int64_t kStepBytes = 2 * kS * int64_t(sizeof(WT));
  static_assert(kStepBytes % 64 == 0, "a double step covers whole cache lines");
  const typename P::Mask all = typename P::Mask(~uint64_t(0));
  const int64_t q = (n1 - n0 + S - 1) / S, k_full = K / (2 * kS) * (2 * kS), rest = K - k_full;
  for (int64_t r = 0; r < q; ++r) {
    int64_t row[S];
    const WT* w[S];
    for (int j = 0; j < S; ++j)
      row[j] = n0 + j * q + r, w[j] = W + std::min(row[j], n1 - 1) * K;  // past the end: repeats
    __m512 a[S], b[S];
    for (int j = 0; j < S; ++j) a[j] = b[j] = _mm512_setzero_ps();
    // Elements [k, k + kS) into a, [k + kS, k + 2·kS) into b, under masks m0 and m1 (0: none).
    auto step = [&](int64_t k, typename P::Mask m0, typename P::Mask m1, bool prefetch) {
      const typename P::XV x0 = P::load_x(x + k, m0), x1 = P::load_x(x + k + kS, m1);
      for (int j = 0; j < S; ++j) {
        if (prefetch) {
          const char* ahead = reinterpret_cast<const char*>(w[j] + k) + kGemvStreamAhead;
          for (int64_t line = 0; line < kStepBytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
        }
        a[j] = P::mac(a[j], x0, P::load_w(w[j] + k, m0));
        b[j] = P::mac(b[j], x1, P::load_w(w[j] + k + kS, m1));
      }
    };
    for (int64_t k = 0; k < k_full; k += 2 * kS) step(k, all, all, true);
    if (rest > 0)
      step(k_full, rest >= kS ? all : P::tail(rest), rest > kS ? P::tail(rest - kS) : typename P::Mask(0),
           false);
    for (int j = 0; j < S; ++j)
      if (row[j] < n1) y[row[j]] = _mm512_reduce_add_ps(_mm512_add_ps(a[j], b[j]));
  }
}
#endif


// Calls f(std::integral_constant<int, G>) for G in 1..8; false for other G.
template <typename F>
bool with_group_size(int G, F&& f) {
  switch (G) {
    case 1: f(std::integral_constant<int, 1>{}); return true;
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 3: f(std::integral_constant<int, 3>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    case 5: f(std::integral_constant<int, 5>{}); return true;
    case 6: f(std::integral_constant<int, 6>{}); return true;
    case 7: f(std::integral_constant<int, 7>{}); return true;
    case 8: f(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}

// Calls f(std::integral_constant<int, D>) for the common head sizes 64 and 128 (fully unrolled
// loops) and 8 (two rows per vector), f(std::integral_constant<int, 0>) (run-time D) otherwise.
template <typename F>
void with_head_dim(int D, F&& f) {
  if (D == 128) f(std::integral_constant<int, 128>{});
  else if (D == 64) f(std::integral_constant<int, 64>{});
  else if (D == 8) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 0>{});
}

template <typename T>
void attention_group_t(const float* q, const T* K, const T* V, int64_t n_keys, int G, int D, float scale, float* out,
                       float* scratch, float* logits_out, float* probs_out, int64_t tap_ld, float* lse_out,
                       const int32_t* key_limits) {
  if (n_keys <= 0) {
    std::fill(out, out + int64_t(G) * D, 0.0f);
    if (lse_out) std::fill(lse_out, lse_out + G, -INFINITY);
    return;
  }
#if HG_AVX512
  if (with_group_size(G, [&](auto g) {
        with_head_dim(D, [&](auto d) {
          attention_group_fused<decltype(g)::value, decltype(d)::value>(q, K, V, n_keys, D, scale, out, logits_out,
                                                                         probs_out, tap_ld, lse_out, key_limits);
        });
      }))
    return;
#endif
  // scratch[h * n_keys + t] = scale * q_h · k_t (each K row read once for the G heads); then
  // softmax per h; out_h = Σ_t p_h[t] v_t (each V row read once).
  for (int64_t t = 0; t < n_keys; ++t) {
    const T* k = K + t * D;
    for (int h = 0; h < G; ++h) scratch[h * n_keys + t] = dot_kv(q + int64_t(h) * D, k, D) * scale;
  }
  if (key_limits)
    for (int h = 0; h < G; ++h)
      for (int64_t t = key_limits[h]; t < n_keys; ++t) scratch[h * n_keys + t] = -INFINITY;
  if (logits_out)
    for (int h = 0; h < G; ++h) std::copy(scratch + h * n_keys, scratch + (h + 1) * n_keys, logits_out + h * tap_ld);
  std::vector<float> inv_sum(static_cast<size_t>(G), 0.0f);
  for (int h = 0; h < G; ++h) {
    float* s = scratch + int64_t(h) * n_keys;
    float mx = -INFINITY;
    for (int64_t t = 0; t < n_keys; ++t) mx = std::max(mx, s[t]);
    const float sum = exp_shift_sum(s, n_keys, mx);
    inv_sum[size_t(h)] = sum > 0 ? 1.0f / sum : 0.0f;
    if (lse_out) lse_out[h] = mx + std::log(sum);
    if (probs_out)
      for (int64_t t = 0; t < n_keys; ++t) probs_out[h * tap_ld + t] = s[t] * inv_sum[size_t(h)];
  }
  weighted_v_kv(scratch, G, V, n_keys, D, out);  // unnormalised weights; scaled below
  for (int h = 0; h < G; ++h)
    for (int d = 0; d < D; ++d) out[int64_t(h) * D + d] *= inv_sum[size_t(h)];
}

// Calls f(T{}) with T the storage type of KV elements of type dt (float, F16Tag, BF16Tag).
template <typename F>
void with_kv_type(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32: return f(float{});
    case DType::kF16: return f(F16Tag{});
    case DType::kBF16: return f(BF16Tag{});
  }
}

template <typename T>
void group_weighted_v_t(const float* p, int G, const T* V, int64_t n, int D, float* out) {
#if HG_AVX512
  if (with_group_size(G, [&](auto g) {
        with_head_dim(D, [&](auto d) { group_weighted_v_fixed<decltype(g)::value, decltype(d)::value>(p, V, n, D, out); });
      }))
    return;
#endif
  weighted_v_kv(p, G, V, n, D, out);
}

template <typename T>
void group_logit_max_t(const float* q, int G, const T* K, int64_t t0, int64_t t1, int D, float scale, float* score) {
#if HG_AVX512
  if (with_group_size(G, [&](auto g) {
        with_head_dim(D, [&](auto d) {
          group_logit_max_fixed<decltype(g)::value, decltype(d)::value>(q, K, t0, t1, D, scale, score);
        });
      }))
    return;
#endif
  for (int64_t t = t0; t < t1; ++t) {
    float m = -INFINITY;
    for (int h = 0; h < G; ++h) {
      const float l = dot_kv(q + int64_t(h) * D, K + t * D, D) * scale;
      m = m < l ? l : m;
    }
    score[t] = m;
  }
}

template <typename T>
void group_logits_t(const float* q, int G, const T* K, int64_t n, int64_t t0, int64_t t1, int D, float scale,
                    float* logits) {
#if HG_AVX512
  if (with_group_size(G, [&](auto g) {
        with_head_dim(D, [&](auto d) {
          group_logits_fixed<decltype(g)::value, decltype(d)::value>(q, K, n, t0, t1, D, scale, logits);
        });
      }))
    return;
#endif
  for (int64_t t = t0; t < t1; ++t) {
    const T* k = K + t * D;
    for (int h = 0; h < G; ++h) logits[h * n + t] = dot_kv(q + int64_t(h) * D, k, D) * scale;
  }
}

}  // namespace

void group_weighted_v(const float* p, int G, const void* V, DType vt, int64_t n, int D, float* out) {
  with_kv_type(vt, [&](auto t) { group_weighted_v_t(p, G, static_cast<const decltype(t)*>(V), n, D, out); });
}

void group_logit_max(const float* q, int G, const void* K, DType kt, int64_t t0, int64_t t1, int D, float scale,
                     float* score) {
  with_kv_type(kt,
               [&](auto t) { group_logit_max_t(q, G, static_cast<const decltype(t)*>(K), t0, t1, D, scale, score); });
}

void group_logits(const float* q, int G, const void* K, DType kt, int64_t n, int64_t t0, int64_t t1, int D,
                  float scale, float* logits) {
  with_kv_type(kt,
               [&](auto t) { group_logits_t(q, G, static_cast<const decltype(t)*>(K), n, t0, t1, D, scale, logits); });
}

void to_f32(const void* x, DType xt, float* y, int64_t n) {
  switch (xt) {
    case DType::kF32: std::copy_n(static_cast<const float*>(x), n, y); return;
    case DType::kF16: return f16_to_f32_row(static_cast<const uint16_t*>(x), y, n);
    case DType::kBF16: return bf16_to_f32_row(static_cast<const uint16_t*>(x), y, n);
  }
}

void attention_group(const float* q, const void* K, const void* V, DType kv, int64_t n_keys, int G, int D, float scale,
                     float* out, float* scratch, float* logits_out, float* probs_out, int64_t tap_ld, float* lse_out,
                     const int32_t* key_limits) {
  with_kv_type(kv, [&](auto t) {
    using T = decltype(t);
    attention_group_t(q, static_cast<const T*>(K), static_cast<const T*>(V), n_keys, G, D, scale, out, scratch,
                      logits_out, probs_out, tap_ld, lse_out, key_limits);
  });
}

bool gemv_rounds_bf16_activations() {
#if HG_AVX512 && HG_KERNEL_BF16
  return true;
#else
  return false;
#endif
}

void gemv(const float* x, int M, const void* W, DType wt, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  auto run = [&](auto tag) {
    using T = decltype(tag);
#if HG_AVX512
    auto dispatch = [&](auto policy, const auto* xs) {
      using P = decltype(policy);
      const auto* wp = static_cast<const typename P::W*>(W);
      auto rows = [&](auto mr) {  // MR x rows
        constexpr int MR = decltype(mr)::value;
        if constexpr (MR == 1)
          if (gemv_reads_streams()) return gemv_streams<P>(xs, wp, K, n0, n1, y);
        return gemv_t<MR, P>(xs, wp, K, n0, n1, y, ldy);
      };
      switch (M) {
        case 1: return rows(std::integral_constant<int, 1>{});
        case 2: return rows(std::integral_constant<int, 2>{});
        case 3: return rows(std::integral_constant<int, 3>{});
        default: return rows(std::integral_constant<int, 4>{});
      }
    };
    if (M > 4) {
      for (int m = 0; m < M; m += 4)
        gemv(x + int64_t(m) * K, std::min(4, M - m), W, wt, K, n0, n1, y + int64_t(m) * ldy, ldy);
      return;
    }
#if HG_KERNEL_BF16
    if constexpr (std::is_same_v<T, BF16Tag>) {
      // x rounded to BF16 once per call (as oneDNN's BF16 prefill rounds it).
      thread_local std::vector<uint16_t> xb;
      xb.resize(size_t(M * K));
      f32_to_bf16_row(x, xb.data(), int64_t(M) * K);
      return dispatch(GemvBf16Dot{}, xb.data());
    }
#endif
    dispatch(GemvConvert<T>{}, x);
#else
    const T* w = static_cast<const T*>(W);
    for (int m = 0; m < M; ++m) {
      const float* xm = x + int64_t(m) * K;
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) {  // 4 weight rows side by side (4 streams), each x value loaded once
        float acc[4][16] = {};
        int64_t k = 0;
        for (; k + 16 <= K; k += 16)
          for (int r = 0; r < 4; ++r)
            for (int j = 0; j < 16; ++j) acc[r][j] += xm[k + j] * elem(w, (n + r) * K + k + j);
        for (int r = 0; r < 4; ++r) {
          float s = 0;
          for (float v : acc[r]) s += v;
          for (int64_t kk = k; kk < K; ++kk) s += xm[kk] * elem(w, (n + r) * K + kk);
          y[int64_t(m) * ldy + n + r] = s;
        }
      }
      for (; n < n1; ++n) y[int64_t(m) * ldy + n] = portable_dot(xm, w + n * K, K);
    }
#endif
  };
  switch (wt) {
    case DType::kF32: return run(float{});
    case DType::kF16: return run(F16Tag{});
    case DType::kBF16: return run(BF16Tag{});
  }
}

// Bytes of rows requested ahead of the copy (16 rows of 512 B), with the T2 hint (into L2): random
// rows are bound by the DRAM's random-access rate, not by the requests in flight
// (docs/performance.md, "Tuning choices").
constexpr int64_t kGatherAheadBytes = 8192;

namespace {
// Calls row(i, p) for i < n with p the i-th selected row, after requesting the rows kGatherAheadBytes
// ahead, one prefetch per 64-byte line.
template <class F>
inline void for_each_row_prefetched(const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                                    int64_t n, F&& row) {
  const auto* s = static_cast<const char*>(src);
  const int64_t ahead = std::max<int64_t>(1, kGatherAheadBytes / std::max<int64_t>(row_bytes, 1));
  auto request = [&](int64_t i) {
    const char* r = s + int64_t(idx[i]) * src_stride;
    for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(r + off, 0, 1);  // T2
  };
  for (int64_t i = 0; i < std::min(n, ahead); ++i) request(i);
  for (int64_t i = 0; i < n; ++i) {
    if (i + ahead < n) request(i + ahead);
    row(i, s + int64_t(idx[i]) * src_stride);
  }
}
}  // namespace

void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx, int64_t n) {
  auto* d = static_cast<char*>(dst);
  for_each_row_prefetched(src, row_bytes, src_stride, idx, n,
                          [&](int64_t i, const char* r) { std::memcpy(d + i * row_bytes, r, size_t(row_bytes)); });
}

float sum_rows(const float* src, int64_t row_floats, int64_t src_stride, const int32_t* idx, int64_t n) {
  float s = 0;
#if HG_AVX512
  FourSums sums;
  for_each_row_prefetched(src, row_floats * 4, src_stride * 4, idx, n, [&](int64_t, const char* r) {
    const auto* f = reinterpret_cast<const float*>(r);
    for (int64_t j = sums.add(f, row_floats); j < row_floats; ++j) s += f[j];
  });
  s += sums.total();
#else
  for_each_row_prefetched(src, row_floats * 4, src_stride * 4, idx, n, [&](int64_t, const char* r) {
    s += sum(reinterpret_cast<const float*>(r), row_floats);
  });
#endif
  return s;
}

// The Gumbel noise: 8 positions per step where AVX-512 is on, with the scalar definition's
// operations in its order (engine/backend/gumbel.h), so that every level gives the same bits.
#if HG_AVX512
namespace {
inline __m512d gumbel_uniform8(__m512i base, __m256i pos) {
  using namespace gumbel;
  __m512i x = _mm512_xor_si512(base, _mm512_mullo_epi64(_mm512_cvtepu32_epi64(pos), _mm512_set1_epi64(int64_t(kMixB))));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(int64_t(kMixC)));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 29));
  x = _mm512_mullo_epi64(x, _mm512_set1_epi64(int64_t(kMixB)));
  x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
  const __m512d d = _mm512_cvtepu64_pd(_mm512_srli_epi64(x, 11));
  return _mm512_mul_pd(_mm512_add_pd(d, _mm512_set1_pd(0.5)), _mm512_set1_pd(kTwoPowMinus53));
}

inline __m512d gumbel_log8(__m512d x) {
  using namespace gumbel;
  const __m512d m = _mm512_getmant_pd(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_src);
  // getexp is floor(log2 x); a mantissa folded below 1 belongs to the next exponent (frexp's e).
  const __mmask8 below = _mm512_cmp_pd_mask(m, _mm512_set1_pd(1.0), _CMP_LT_OQ);
  const __m512d e = _mm512_mask_add_pd(_mm512_getexp_pd(x), below, _mm512_getexp_pd(x), _mm512_set1_pd(1.0));
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d s = _mm512_div_pd(_mm512_sub_pd(m, one), _mm512_add_pd(m, one)), w = _mm512_mul_pd(s, s);
  __m512d p = _mm512_set1_pd(kAtanh[9]);
  for (int i = 8; i >= 0; --i) p = _mm512_fmadd_pd(p, w, _mm512_set1_pd(kAtanh[i]));
  const __m512d s2 = _mm512_add_pd(s, s);
  return _mm512_add_pd(_mm512_fmadd_pd(e, _mm512_set1_pd(kLn2Hi), s2),
                       _mm512_fmadd_pd(e, _mm512_set1_pd(kLn2Lo), _mm512_mul_pd(_mm512_mul_pd(s2, w), p)));
}
}  // namespace
#endif

void gumbel_noise(uint64_t base, const int32_t* pos, int64_t n, double* out) {
  int64_t i = 0;
#if HG_AVX512
  const __m512i vb = _mm512_set1_epi64(int64_t(base));
  const __m512d neg = _mm512_set1_pd(-0.0);
  for (; i + 8 <= n; i += 8) {
    const __m512d u = gumbel_uniform8(vb, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + i)));
    const __m512d l1 = _mm512_xor_pd(gumbel_log8(u), neg);  // −log u > 0
    _mm512_storeu_pd(out + i, _mm512_xor_pd(gumbel_log8(l1), neg));
  }
#endif
  for (; i < n; ++i) out[i] = gumbel::draw(base, pos[i]);
}

// Logit top-K (selectors/logit_topk.h has the rule): scores, a lower bound from a strided sample,
// the candidates that pass it, then the K-th score among them. No sort.
namespace {
// score[t] = max over h < G of logits[h * ld + t] for t in [t, n), from -inf (NaN logits leave it
// as it is), with -0 made +0 so that equal scores compare equal.
void top_k_scores(const float* logits, int G, int64_t ld, int32_t n, float* score) {
  int32_t t = 0;
#if HG_AVX512
  const __m512 zero = _mm512_setzero_ps();
  for (; t + 16 <= n; t += 16) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int h = 0; h < G; ++h) m = _mm512_max_ps(_mm512_loadu_ps(logits + int64_t(h) * ld + t), m);  // NaN: m
    _mm512_storeu_ps(score + t, _mm512_add_ps(m, zero));
  }
#endif
  for (; t < n; ++t) {
    float m = -INFINITY;
    for (int h = 0; h < G; ++h) m = m < logits[int64_t(h) * ld + t] ? logits[int64_t(h) * ld + t] : m;
    score[t] = m + 0.0f;
  }
}

// The positions t < n with score[t] ≥ lb, in order, into cand; returns how many.
int32_t top_k_at_least(const float* score, int32_t n, float lb, int32_t* cand) {
  int32_t c = 0, t = 0;
#if HG_AVX512
  // Branch-free: the passing lanes' positions compressed in a register and stored whole (cand has
  // 16 spare slots); a loop over the set bits mispredicts on fresh scores (5 ns per position
  // against 1 on data the predictor has learned).
  const __m512 b = _mm512_set1_ps(lb);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; t + 16 <= n; t += 16) {
    const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(score + t), b, _CMP_GE_OQ);
    _mm512_storeu_si512(cand + c, _mm512_maskz_compress_epi32(m, _mm512_add_epi32(lane, _mm512_set1_epi32(t))));
    c += __builtin_popcount(uint32_t(m));
  }
#endif
  for (; t < n; ++t) {  // branch-free: the few that pass are kept
    cand[c] = t;
    c += score[t] >= lb;
  }
  return c;
}
}  // namespace

int32_t logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, int32_t* out) {
  if (K <= 0 || n <= 0) return 0;
  if (K >= n) {
    for (int32_t t = 0; t < n; ++t) out[t] = t;
    return n;
  }
  thread_local std::vector<float> score, cs;
  thread_local std::vector<int32_t> cand;
  if (score.size() < size_t(n)) score.resize(size_t(n)), cand.resize(size_t(n) + 16), cs.resize(size_t(n));
  top_k_scores(logits, G, ld, n, score.data());
  // Bounds for the K-th score from an evenly strided sample (every fourth score or sparser, at most
  // 1024): its expected rank in the sample is K·sample/n; the sample's scores four standard
  // deviations of that rank (and two places) below and above it are the lower bound `lb` and the
  // upper bound `ub`. The positions at or above lb are the candidates; those above ub are among the
  // K for certain when fewer than K are, so the K-th score is found among the rest of the
  // candidates only (the band). A sample far from the whole fails a check below: then every
  // position is a candidate, or no candidate is certain.
  const int32_t sample = std::min<int32_t>(1024, n / 4);
  float lb = -INFINITY, ub = INFINITY;
  if (int64_t(K) * 4 < n && sample >= 64) {
    const double sk = double(K) * sample / n, sd = std::sqrt(sk * (1.0 - double(K) / n));
    const int64_t r_lb = std::min<int64_t>(sample, int64_t(std::ceil(sk + 4 * sd)) + 2);
    const int64_t r_ub = int64_t(std::floor(sk - 4 * sd)) - 2;  // < 1: no upper bound
    float* smp = cs.data();
    for (int32_t i = 0; i < sample; ++i) smp[i] = score[size_t(int64_t(i) * n / sample)];
    std::nth_element(smp, smp + (r_lb - 1), smp + sample, std::greater<float>());
    lb = smp[r_lb - 1];
    if (r_ub >= 1) {  // the r_ub-th largest, among the r_lb - 1 that precede lb
      std::nth_element(smp, smp + (r_ub - 1), smp + (r_lb - 1), std::greater<float>());
      ub = smp[r_ub - 1];
    }
  }
  int32_t c = 0;
  for (;;) {
    c = top_k_at_least(score.data(), n, lb, cand.data());
    if (c >= K) break;
    lb = -INFINITY;  // the sample misled: every position is a candidate
  }
  // The band (candidates at or below ub) into cs, branch-free; `above` counts the rest.
  int32_t above = 0, nb = 0;
  auto take_band = [&] {
    above = nb = 0;
    for (int32_t i = 0; i < c; ++i) {
      const float v = score[size_t(cand[size_t(i)])];
      cs[size_t(nb)] = v;
      nb += !(v > ub);
      above += v > ub;
    }
  };
  take_band();
  if (above >= K) {  // the sample misled: no candidate is certain
    ub = INFINITY;
    take_band();
  }
  // The K-th score T: the (K - above)-th largest of the band. Then, in position order, every
  // candidate above T and the first `ties` equal to it, compacted in place in cand (branch-free:
  // the keep decisions mispredict on fresh scores), then copied out.
  std::nth_element(cs.data(), cs.data() + (K - above - 1), cs.data() + nb, std::greater<float>());
  const float T = cs[size_t(K - above - 1)];
  int32_t ties = K, k = 0;
  for (int32_t i = 0; i < c; ++i) ties -= score[size_t(cand[size_t(i)])] > T;
  for (int32_t i = 0; i < c; ++i) {
    const int32_t t = cand[size_t(i)];
    const float v = score[size_t(t)];
    const bool eq = v == T, keep = v > T || (eq && ties > 0);
    cand[size_t(k)] = t;  // k ≤ i: position i was read above
    k += keep;
    ties -= eq && keep;
  }
  std::copy_n(cand.data(), k, out);
  return k;
}

}  // namespace

const KernelTable& kernel_table() {
#if HG_KERNEL_BF16
  // AVX512_BF16 adds the BF16 GEMV (`vdpbf16ps`) and the F32 → BF16 rounding to the AVX-512 level;
  // every other kernel is that level's, compiled once.
  static const KernelTable t = [] {
    KernelTable k = avx512::kernel_table();
    k.f32_to_bf16_row = f32_to_bf16_row;
    k.gemv = gemv;
    k.gemv_rounds_bf16_activations = gemv_rounds_bf16_activations;
    return k;
  }();
#else
  static const KernelTable t{
      dot, sum, sum_one_stream, rms_norm_row, layer_norm_row, swiglu, relu, add, max_value, exp_shift_sum,
      f32_to_bf16_row, bf16_to_f32_row, f16_to_f32_row, attention_group, group_logits, group_logit_max,
      gemv, gemv_rounds_bf16_activations, gather_rows, sum_rows, group_weighted_v, to_f32, gumbel_noise,
      logit_top_k,
  };
#endif
  return t;
}

}  // namespace hg::cpu::HG_KERNEL_NS

#if HG_KERNEL_AVX512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
