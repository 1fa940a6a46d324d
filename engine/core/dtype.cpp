// Scalar element conversions (reference-grade; hot paths use the CPU backend's SIMD versions), and
// row conversions between F32 and the 16-bit types; F32 → F16 rows use F16C where the build has it.
#include "engine/core/dtype.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace hg {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
  if (s == "f32") *out = DType::kF32;
  else if (s == "f16") *out = DType::kF16;
  else if (s == "bf16") *out = DType::kBF16;
  else return false;
  return true;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;                 // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                // overflow to inf (>= 65520)
  if (abs < 0x38800000u) {                                      // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;                         // < 2^-25 rounds to 0
    // value = m * 2^(e-150); an f16 subnormal unit is 2^-24, so the result is m >> (126 - e)
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t res = m >> shift;
    if (rem > half || (rem == half && (res & 1u))) ++res;
    return uint16_t(sign | res);
  }
  uint32_t res = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) ++res;
  return uint16_t(sign | res);
}

double element_at(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

void to_f32(DType from, const void* src, float* dst, size_t n) {
  switch (from) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kBF16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
  }
}

void from_f32(DType to, const float* src, void* dst, size_t n) {
  switch (to) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      size_t i = 0;
#if defined(__F16C__)
      // The hardware converter rounds to nearest even as f32_to_f16 does (DType tests hold them
      // equal); a NaN keeps its payload's top bits where f32_to_f16 returns 0x7e00.
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
  }
}

}  // namespace hg
