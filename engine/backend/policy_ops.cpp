// The references of the policy ops (policy_ops.h): scalar loops over host memory, double
// accumulation where a sum is taken.
#include "engine/backend/policy_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "engine/backend/gumbel.h"
#include "engine/core/error.h"

namespace hg {
void PolicyOps::group_logits(const float* q, int G, const void* K, int64_t n, int D, float scale, float* logits,
                             DType kt) {
  HG_CHECK(host_memory());
  for (int h = 0; h < G; ++h)
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += double(q[int64_t(h) * D + d]) * element_at(kt, K, t * D + d);
      logits[int64_t(h) * n + t] = float(acc * scale);
    }
}

void PolicyOps::heads_logits(const float* q, int H, int H_kv, const void* K, int64_t k_ld, int64_t n, int D,
                             float scale, float* logits, DType kt) {
  HG_CHECK(host_memory() && H_kv > 0 && H % H_kv == 0);
  const int G = H / H_kv;
  const auto* k = static_cast<const char*>(K);
  for (int g = 0; g < H_kv; ++g)
    PolicyOps::group_logits(q + int64_t(g) * G * D, G, k + g * k_ld * D * int64_t(dtype_size(kt)), n, D, scale,
                            logits + int64_t(g) * G * n, kt);
}

void PolicyOps::softmax_rows(float* x, int64_t rows, int64_t n) {
  HG_CHECK(host_memory());
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * n;
    double mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, double(v[t]));
    std::vector<double> e(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) sum += (e[size_t(t)] = std::exp(double(v[t]) - mx));
    for (int64_t t = 0; t < n; ++t) v[t] = float(e[size_t(t)] / sum);
  }
}

void PolicyOps::group_weighted_v(const float* p, int G, const void* V, int64_t n, int D, float* out, DType vt) {
  HG_CHECK(host_memory());
  for (int h = 0; h < G; ++h)
    for (int d = 0; d < D; ++d) {
      double acc = 0;
      for (int64_t t = 0; t < n; ++t) acc += double(p[int64_t(h) * n + t]) * element_at(vt, V, t * D + d);
      out[int64_t(h) * D + d] = float(acc);
    }
}

void PolicyOps::group_logit_max(const float* q, int G, const void* K, int64_t n, int D, float scale,
                                float* score, DType kt) {
  HG_CHECK(host_memory());  // the scratch below is read on the host
  thread_local std::vector<float> lg;
  if (lg.size() < size_t(G) * size_t(n)) lg.resize(size_t(G) * size_t(n));
  group_logits(q, G, K, n, D, scale, lg.data(), kt);
  for (int64_t t = 0; t < n; ++t) {
    float m = -INFINITY;
    for (int h = 0; h < G; ++h) m = m < lg[size_t(h * n + t)] ? lg[size_t(h * n + t)] : m;
    score[t] = m;
  }
}

float PolicyOps::max_value(const float* x, int64_t n) {
  HG_CHECK(host_memory());
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > m) m = x[i];
  return m;
}

float PolicyOps::exp_shift_sum(float* x, int64_t n, float shift) {
  HG_CHECK(host_memory());
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (x[i] = float(std::exp(double(x[i]) - double(shift))));
  return float(s);
}

void PolicyOps::gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                          int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(static_cast<char*>(dst) + i * row_bytes, static_cast<const char*>(src) + int64_t(idx[i]) * src_stride,
                size_t(row_bytes));
}

void PolicyOps::copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst[i], src[i], size_t(row_bytes));
}

void PolicyOps::gumbel_noise(uint64_t stream, const int32_t* pos, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gumbel::draw(stream, pos[i]);
}

int32_t PolicyOps::logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, int32_t* out) {
  HG_CHECK(host_memory());
  if (K <= 0 || n <= 0) return 0;
  K = std::min(K, n);
  std::vector<std::pair<float, int32_t>> sc(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int h = 0; h < G; ++h) mx = std::max(mx, logits[int64_t(h) * ld + t]);
    sc[size_t(t)] = {-mx, t};
  }
  std::nth_element(sc.begin(), sc.begin() + (K - 1), sc.end());
  for (int32_t i = 0; i < K; ++i) out[i] = sc[size_t(i)].second;
  std::sort(out, out + K);
  return K;
}

void PolicyOps::accumulate_scores(const ScoreRows& a) {
  HG_CHECK(host_memory() && a.H_kv > 0 && a.H % a.H_kv == 0);
  const int G = a.H / a.H_kv;
  thread_local std::vector<int32_t> pos;
  thread_local std::vector<double> noise;
  thread_local std::vector<float> z;
  for (int64_t i = 0; i < a.n_rows; ++i) {
    const ScoreRows::Row& r = a.rows[i];
    const size_t n = size_t(std::max(r.n, 0));
    for (int g = 0; g < a.H_kv; ++g) {
      ScoreSlot* sl = r.slots + int64_t(g) * r.slot_ld;
      if (a.rule == ScoreRule::kGumbelSoftmax) {
        pos.resize(n), noise.resize(n), z.resize(n);
        for (size_t t = 0; t < n; ++t) pos[t] = sl[t].pos;
      }
      for (int h = 0; h < G; ++h) {
        const int head = g * G + h;
        const float* tap = a.taps + (i * a.H + head) * a.tap_ld;
        if (a.rule == ScoreRule::kSum) {
          for (size_t t = 0; t < n; ++t) sl[t].score += tap[t];
          continue;
        }
        // The backend's own noise, max and exp-sum (vectorised on the CPU), the sum in F64.
        gumbel_noise(gumbel::stream(a.seed, a.layer, 0, r.pos, head), pos.data(), int64_t(n), noise.data());
        for (size_t t = 0; t < n; ++t) z[t] = float((double(tap[t]) + noise[t]) / r.tau);
        const float mx = n > 0 ? max_value(z.data(), int64_t(n)) : 0.0f;
        const double inv = 1.0 / double(exp_shift_sum(z.data(), int64_t(n), mx));
        for (size_t t = 0; t < n; ++t) sl[t].score += double(z[t]) * inv;
      }
    }
  }
}

void PolicyOps::pick_evictions(const EvictionPick* picks, int64_t n_picks, int32_t* out) {
  HG_CHECK(host_memory());
  thread_local std::vector<int32_t> cand, newest;
  for (int64_t k = 0; k < n_picks; ++k) {
    const EvictionPick& p = picks[k];
    const ScoreSlot* sl = p.slots;
    if (p.count <= 0) continue;
    // Positions >= cut are the `recent` newest (positions within a head are distinct).
    int32_t cut = std::numeric_limits<int32_t>::min();
    if (p.recent > 0 && p.recent < p.n) {
      newest.resize(size_t(p.n));
      for (int32_t s = 0; s < p.n; ++s) newest[size_t(s)] = sl[s].pos;
      std::nth_element(newest.begin(), newest.begin() + (p.n - p.recent), newest.end());
      cut = newest[size_t(p.n - p.recent)];
    }
    const bool all_recent = p.recent >= p.n && p.recent > 0;
    cand.clear();
    for (int32_t s = 0; s < p.n; ++s)
      if (!all_recent && (p.recent <= 0 || sl[s].pos < cut)) cand.push_back(s);
    if (int32_t(cand.size()) < p.count)
      throw std::logic_error("pick_evictions: fewer tokens outside the recent window than must be evicted");
    const auto before = [&](int32_t x, int32_t y) {
      return sl[x].score < sl[y].score || (sl[x].score == sl[y].score && sl[x].pos < sl[y].pos);
    };
    std::nth_element(cand.begin(), cand.begin() + (p.count - 1), cand.end(), before);
    std::sort(cand.begin(), cand.begin() + p.count, before);
    std::copy_n(cand.begin(), p.count, out + p.at);
  }
}

void PolicyOps::pool_scores(const ScorePool* items, int64_t n_items, int kernel, bool max) {
  HG_CHECK(host_memory() && kernel >= 1);
  const int half = kernel / 2;
  thread_local std::vector<double> in;
  for (int64_t i = 0; i < n_items; ++i) {
    ScoreSlot* sl = items[i].slots;
    const int32_t n = items[i].n;
    in.resize(size_t(std::max(n, 0)));
    for (int32_t s = 0; s < n; ++s) in[size_t(s)] = sl[s].score;
    for (int32_t s = 0; s < n; ++s) {
      double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int32_t j = std::max(0, s - half); j <= std::min(n - 1, s + half); ++j)
        acc = max ? std::max(acc, in[size_t(j)]) : acc + in[size_t(j)];
      sl[s].score = max ? acc : acc / kernel;
    }
  }
}

void PolicyOps::put_rows(void* const* dst, const void* src, int64_t row_bytes, int64_t n) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst[i], static_cast<const char*>(src) + i * row_bytes, size_t(row_bytes));
}

void PolicyOps::merged_attention(const MergedAttention& a) {
  HG_CHECK(host_memory());
  const int G = a.H / a.H_kv, D = a.D;
  const int64_t es = int64_t(dtype_size(a.kv_dtype));
  auto rows = [es](const void* p, int64_t elems) { return static_cast<const char*>(p) + elems * es; };
  const int64_t n = a.na + a.nb;
  std::vector<float> u(size_t(G) * size_t(std::max<int64_t>(n, 1))),
      lb(size_t(G) * size_t(std::max<int64_t>(a.nb, 1)));
  std::vector<float> o2(size_t(G) * size_t(D));
  for (int g = 0; g < a.H_kv; ++g) {
    if (a.lb) std::copy_n(a.lb + int64_t(g) * G * a.nb, G * a.nb, lb.begin());
    else group_logits(a.q + int64_t(g) * G * D, G, rows(a.Kb, int64_t(g) * a.ld_b * D), a.nb, D, a.scale, lb.data(),
                      a.kv_dtype);
    for (int h = 0; h < G; ++h) {
      std::copy_n(a.la + (int64_t(g) * G + h) * a.na, a.na, u.begin() + int64_t(h) * n);
      std::copy_n(lb.begin() + int64_t(h) * a.nb, a.nb, u.begin() + int64_t(h) * n + a.na);
    }
    softmax_rows(u.data(), G, n);
    float* out = a.out + int64_t(g) * G * D;
    // Each part's probabilities as a dense [G, n_part] block: reuse lb for B, u's front for A.
    for (int h = 0; h < G; ++h)
      std::copy_n(u.begin() + int64_t(h) * n + a.na, a.nb, lb.begin() + int64_t(h) * a.nb);
    group_weighted_v(lb.data(), G, rows(a.Vb, int64_t(g) * a.ld_b * D), a.nb, D, out, a.kv_dtype);
    if (a.na > 0) {
      for (int h = 0; h < G; ++h)
        std::copy_n(u.begin() + int64_t(h) * n, a.na, u.begin() + int64_t(h) * a.na);
      group_weighted_v(u.data(), G, rows(a.Va, int64_t(g) * a.na * D), a.na, D, o2.data(), a.kv_dtype);
      for (size_t i = 0; i < o2.size(); ++i) out[i] += o2[i];
    }
  }
}

}  // namespace hg
