// Element types of weights and KV, and scalar conversions between them (portable bit code; the
// CPU backend has vectorised versions). F16 is IEEE binary16, BF16 the top half of an F32.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace hg {

enum class DType : uint8_t { kF32, kF16, kBF16 };

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// Parses "f32", "f16", "bf16"; returns false when unknown.
bool parse_dtype(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of type `from` at src into F32 at dst.
void to_f32(DType from, const void* src, float* dst, size_t n);
// Element i of an array of type t, as a double (the references' reads).
double element_at(DType t, const void* p, int64_t i);
// Converts n F32 values into `to` at dst.
void from_f32(DType to, const float* src, void* dst, size_t n);

}  // namespace hg
