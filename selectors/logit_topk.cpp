#include "selectors/logit_topk.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <utility>

#include <immintrin.h>

#include "engine/core/cpu_features.h"

namespace hg {
namespace {

bool all_or_none(int32_t n, int32_t K, std::vector<int32_t>& out) {
  out.clear();
  if (K <= 0 || n <= 0) return true;
  if (K < n) return false;
  out.resize(size_t(n));
  std::iota(out.begin(), out.end(), 0);
  return true;
}

// score[t] = max over h < G of logits[h * ld + t] for t in [t, n), starting from -inf (NaN logits
// leave it as it is), with -0 made +0 so that equal scores compare equal.
void scores_from(const float* logits, int G, int64_t ld, int32_t t, int32_t n, float* score) {
  for (; t < n; ++t) {
    float m = -INFINITY;
    for (int h = 0; h < G; ++h) m = m < logits[int64_t(h) * ld + t] ? logits[int64_t(h) * ld + t] : m;
    score[t] = m + 0.0f;
  }
}

__attribute__((target("avx512f"))) void scores_avx512(const float* logits, int G, int64_t ld, int32_t n,
                                                      float* score) {
  int32_t t = 0;
  const __m512 zero = _mm512_setzero_ps();
  for (; t + 16 <= n; t += 16) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int h = 0; h < G; ++h)
      m = _mm512_max_ps(_mm512_loadu_ps(logits + int64_t(h) * ld + t), m);  // NaN: m
    _mm512_storeu_ps(score + t, _mm512_add_ps(m, zero));
  }
  scores_from(logits, G, ld, t, n, score);
}

// The positions t in [t, n) with score[t] ≥ lb, in order, into cand from c on; returns the new count.
int32_t at_least_from(const float* score, int32_t t, int32_t n, float lb, int32_t* cand, int32_t c) {
  for (; t < n; ++t) {  // branch-free: the few that pass are kept
    cand[c] = t;
    c += score[t] >= lb;
  }
  return c;
}

__attribute__((target("avx512f"))) int32_t at_least_avx512(const float* score, int32_t n, float lb, int32_t* cand) {
  int32_t c = 0, t = 0;
  const __m512 b = _mm512_set1_ps(lb);
  for (; t + 16 <= n; t += 16) {
    for (uint32_t m = _mm512_cmp_ps_mask(_mm512_loadu_ps(score + t), b, _CMP_GE_OQ); m != 0; m &= m - 1)
      cand[c++] = t + __builtin_ctz(m);
  }
  return at_least_from(score, t, n, lb, cand, c);
}

// The AVX-512 versions where the CPU kernels run at that level (engine/core/cpu_features.h).
void scores(const float* logits, int G, int64_t ld, int32_t n, float* score) {
  if (active_cpu_isa() >= CpuIsa::kAvx512) return scores_avx512(logits, G, ld, n, score);
  scores_from(logits, G, ld, 0, n, score);
}

// The positions t < n with score[t] ≥ lb, in order, into cand; returns how many.
int32_t at_least(const float* score, int32_t n, float lb, int32_t* cand) {
  if (active_cpu_isa() >= CpuIsa::kAvx512) return at_least_avx512(score, n, lb, cand);
  return at_least_from(score, 0, n, lb, cand, 0);
}

}  // namespace

void logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, std::vector<int32_t>& out) {
  if (all_or_none(n, K, out)) return;
  thread_local std::vector<float> score, cs;
  thread_local std::vector<int32_t> cand;
  if (score.size() < size_t(n)) score.resize(size_t(n)), cand.resize(size_t(n)), cs.resize(size_t(n));
  scores(logits, G, ld, n, score.data());
  // A lower bound for the K-th score from an evenly strided sample, chosen so that about 2K scores
  // pass it: the sample's r-th largest. Only the positions that pass are candidates; the K-th score
  // among them is the K-th overall whenever at least K pass, which holds but for a sample far from
  // the whole (then every position is a candidate).
  constexpr int32_t kSample = 1024;
  float lb = -INFINITY;
  if (int64_t(K) * 4 < n && n > 4 * kSample) {
    const int64_t r = (int64_t(2) * K * kSample + n - 1) / n + 2;  // about 2K scores pass
    float* smp = cs.data();
    for (int32_t i = 0; i < kSample; ++i) smp[i] = score[size_t(int64_t(i) * n / kSample)];
    std::nth_element(smp, smp + (r - 1), smp + kSample, std::greater<float>());
    lb = smp[r - 1];
  }
  int32_t c = 0;
  for (;;) {
    c = at_least(score.data(), n, lb, cand.data());
    if (c >= K) break;
    lb = -INFINITY;  // the sample misled: every position is a candidate
  }
  // The K-th score T among the candidates; then, in position order, every candidate above T and the
  // first `ties` equal to it.
  for (int32_t i = 0; i < c; ++i) cs[size_t(i)] = score[size_t(cand[size_t(i)])];
  std::nth_element(cs.data(), cs.data() + (K - 1), cs.data() + c, std::greater<float>());
  const float T = cs[size_t(K - 1)];
  int32_t ties = K;
  for (int32_t i = 0; i < c; ++i) ties -= score[size_t(cand[size_t(i)])] > T;
  out.reserve(size_t(K));
  for (int32_t i = 0; i < c; ++i) {
    const int32_t t = cand[size_t(i)];
    const float v = score[size_t(t)];
    if (v > T || (v == T && ties > 0)) {
      ties -= v == T;
      out.push_back(t);
    }
  }
}

void logit_top_k_reference(const float* logits, int G, int64_t ld, int32_t n, int32_t K,
                           std::vector<int32_t>& out) {
  if (all_or_none(n, K, out)) return;
  std::vector<std::pair<float, int32_t>> sc(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    float mx = -INFINITY;
    for (int h = 0; h < G; ++h) mx = std::max(mx, logits[int64_t(h) * ld + t]);
    sc[size_t(t)] = {-mx, t};
  }
  std::nth_element(sc.begin(), sc.begin() + K, sc.end());
  for (int32_t i = 0; i < K; ++i) out.push_back(sc[size_t(i)].second);
  std::sort(out.begin(), out.end());
}

}  // namespace hg
