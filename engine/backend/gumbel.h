// Gumbel(0, 1) noise as a pure function of its inputs (Keyformer's score noise): one stream per
// (seed, layer, sequence, query row, head), one draw per key position, −log(−log u) with u a hash of
// (stream, position). This is the scalar definition: the reference policy op runs it, and the CPU
// kernels' vector path (hg::cpu::gumbel_noise) gives its bits, with the same operations in the same
// order (tests/unit/test_keyformer.cpp checks both, and the logarithm against std::log). The
// functions compile for CUDA devices too (the device's frexp and fma are exact, so its bits agree).
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HG_GUMBEL_FN __host__ __device__ inline
#else
#define HG_GUMBEL_FN inline
#endif
// The atanh series' coefficients 1/3, 1/5, …, 1/21 (kAtanh below).
#define HG_GUMBEL_ATANH \
  1.0 / 3, 1.0 / 5, 1.0 / 7, 1.0 / 9, 1.0 / 11, 1.0 / 13, 1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21

namespace hg::gumbel {

inline constexpr uint64_t kMixA = 0x9e3779b97f4a7c15ull, kMixB = 0xbf58476d1ce4e5b9ull,
                          kMixC = 0x94d049bb133111ebull;
inline constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;  // hi·e exact
inline constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;
// atanh series: log m = 2s + 2s·w·(1/3 + w/5 + … + w⁹/21), w = s², |s| ≤ 0.2; the first term left
// out (w¹⁰/23) is below 2^-58 of the sum.
inline constexpr double kAtanh[10] = {HG_GUMBEL_ATANH};

// The stream of (seed, layer, seq, row, head): each field mixed in by a multiply-xorshift round, so
// no two tuples share a stream for any field sizes.
HG_GUMBEL_FN uint64_t stream(uint64_t seed, int layer, int seq, int row, int head) {
  uint64_t x = seed * kMixA;
  const uint64_t fields[4] = {uint64_t(uint32_t(layer)), uint64_t(uint32_t(seq)), uint64_t(uint32_t(row)),
                              uint64_t(uint32_t(head))};
  for (uint64_t f : fields) {
    x = (x ^ f) * kMixB;
    x ^= x >> 29;
  }
  return x;
}

// u in (0, 1) from (stream, pos): 53 bits of a splitmix-style hash.
HG_GUMBEL_FN double uniform(uint64_t base, int32_t pos) {
  uint64_t x = base ^ uint64_t(uint32_t(pos)) * kMixB;
  x ^= x >> 31;
  x *= kMixC;
  x ^= x >> 29;
  x *= kMixB;
  x ^= x >> 32;
  return (double(x >> 11) + 0.5) * kTwoPowMinus53;
}

// log x for a positive normal x: x = m · 2^e with m in [0.75, 1.5), s = (m − 1)/(m + 1).
HG_GUMBEL_FN double log_positive(double x) {
  constexpr double c[10] = {HG_GUMBEL_ATANH};
  int ex = 0;
  const double fr = ::frexp(x, &ex);  // [0.5, 1)
  const double m = fr < 0.75 ? 2.0 * fr : fr;
  const double e = double(fr < 0.75 ? ex - 1 : ex);
  const double s = (m - 1.0) / (m + 1.0), w = s * s;
  double p = c[9];
  for (int i = 8; i >= 0; --i) p = ::fma(p, w, c[i]);
  const double s2 = s + s;
  return ::fma(e, kLn2Hi, s2) + ::fma(e, kLn2Lo, s2 * w * p);
}

// The draw of key position `pos` in stream `base`.
HG_GUMBEL_FN double draw(uint64_t base, int32_t pos) { return -log_positive(-log_positive(uniform(base, pos))); }

}  // namespace hg::gumbel
