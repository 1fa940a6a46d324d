// CPU kernels. Maths in the header; here the AVX-512 and portable implementations.
#include "engine/backend/cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define HG_AVX512 1
#endif

#include "engine/core/dtype.h"

namespace hg::cpu {

// Storage tags for 16-bit KV elements (both are uint16_t in memory).
struct F16Tag {
  uint16_t bits;
};
struct BF16Tag {
  uint16_t bits;
};

#if HG_AVX512
namespace {
inline __mmask16 tail_mask(int64_t r) { return __mmask16((1u << r) - 1u); }

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
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
#endif
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
  for (; i < n; ++i) y[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
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
  for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

void f32_to_bf16_row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
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
  for (; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

void group_logits(const float* q, int G, const float* K, int64_t n, int64_t t0, int64_t t1, int D, float scale,
                  float* logits) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* k = K + t * D;
    for (int h = 0; h < G; ++h) logits[h * n + t] = dot(q + int64_t(h) * D, k, D) * scale;
  }
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
template <typename T>
inline float elem(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return p[i];
  else if constexpr (std::is_same_v<T, F16Tag>) return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  else return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
}

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
  float s = 0;
  for (int i = 0; i < D; ++i) s += q[i] * elem(k, i);
  return s;
#endif
}

template <typename T>
void weighted_v_kv(const float* p, int G, const T* V, int64_t n, int D, float* out) {
  std::fill(out, out + int64_t(G) * D, 0.0f);
#if HG_AVX512
  const int nb = (D + 15) / 16;
  const __mmask16 last = (D % 16) ? tail_mask(D % 16) : __mmask16(0xffff);
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
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < G; ++h)
      for (int d = 0; d < D; ++d) out[int64_t(h) * D + d] += p[h * n + t] * elem(V, t * D + d);
#endif
}

template <typename T>
void attention_group_t(const float* q, const T* K, const T* V, int64_t n_keys, int G, int D, float scale, float* out,
                       float* scratch, float* logits_out, float* probs_out, int64_t tap_ld, float* lse_out) {
  if (n_keys <= 0) {
    std::fill(out, out + int64_t(G) * D, 0.0f);
    if (lse_out) std::fill(lse_out, lse_out + G, -INFINITY);
    return;
  }
  // scratch[h * n_keys + t] = scale * q_h · k_t (each K row read once for the G heads); then
  // softmax per h; out_h = Σ_t p_h[t] v_t (each V row read once).
  for (int64_t t = 0; t < n_keys; ++t) {
    const T* k = K + t * D;
    for (int h = 0; h < G; ++h) scratch[h * n_keys + t] = dot_kv(q + int64_t(h) * D, k, D) * scale;
  }
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
}  // namespace

void group_weighted_v(const float* p, int G, const float* V, int64_t n, int D, float* out) {
  weighted_v_kv(p, G, V, n, D, out);
}

void attention_group(const float* q, const void* K, const void* V, DType kv, int64_t n_keys, int G, int D, float scale,
                     float* out, float* scratch, float* logits_out, float* probs_out, int64_t tap_ld, float* lse_out) {
  switch (kv) {
    case DType::kF32:
      return attention_group_t(q, static_cast<const float*>(K), static_cast<const float*>(V), n_keys, G, D, scale, out,
                               scratch, logits_out, probs_out, tap_ld, lse_out);
    case DType::kF16:
      return attention_group_t(q, static_cast<const F16Tag*>(K), static_cast<const F16Tag*>(V), n_keys, G, D, scale,
                               out, scratch, logits_out, probs_out, tap_ld, lse_out);
    case DType::kBF16:
      return attention_group_t(q, static_cast<const BF16Tag*>(K), static_cast<const BF16Tag*>(V), n_keys, G, D, scale,
                               out, scratch, logits_out, probs_out, tap_ld, lse_out);
  }
}

}  // namespace hg::cpu
