// The `ref` backend: scalar loops that accumulate in double. Slow and obviously correct; every
// fast kernel and whole forward passes are tested against it. Not for timing.
#include <cmath>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/error.h"

namespace hg {
namespace {

double weight_at(const Weight& w, int64_t i) { return element_at(w.dtype, w.as<char>(), i); }

class RefBackend final : public Backend {
 public:
  std::string_view name() const override { return "ref"; }

  void matmul(const float* x, int64_t M, const Weight& w, const float* bias, float* y) override {
    const int64_t N = w.rows(), K = w.cols();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = bias ? bias[n] : 0.0;
        for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * weight_at(w, n * K + k);
        y[m * N + n] = float(acc);
      }
  }

  void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) override {
    for (int64_t m = 0; m < M; ++m) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += double(x[m * n + i]) * x[m * n + i];
      const double r = 1.0 / std::sqrt(ss / double(n) + eps);
      for (int64_t i = 0; i < n; ++i) y[m * n + i] = float(x[m * n + i] * r * w[i]);
    }
  }

  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps,
                  float* y) override {
    for (int64_t m = 0; m < M; ++m) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < n; ++i) mean += x[m * n + i];
      mean /= double(n);
      for (int64_t i = 0; i < n; ++i) var += (x[m * n + i] - mean) * (x[m * n + i] - mean);
      var /= double(n);
      const double r = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < n; ++i) y[m * n + i] = float((x[m * n + i] - mean) * r * w[i] + (b ? b[i] : 0.0));
    }
  }

  void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const RopeTable& t) override {
    const int half = D / 2;
    for (int64_t m = 0; m < M; ++m)
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + (m * n_heads + h) * D;
        for (int i = 0; i < half; ++i) {
          const double a = double(pos[m]) * t.inv_freq[size_t(i)];
          const double c = std::cos(a), s = std::sin(a);
          const int i0 = t.style == RopeStyle::kInterleaved ? 2 * i : i;
          const int i1 = t.style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
          const double x0 = v[i0], x1 = v[i1];
          v[i0] = float(x0 * c - x1 * s);
          v[i1] = float(x0 * s + x1 * c);
        }
      }
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* y) override {
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i];
      y[i] = float(g / (1.0 + std::exp(-g)) * up[i]);
    }
  }

  void relu(float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0 ? x[i] : 0.0f;
  }

  void add(float* y, const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] = float(double(y[i]) + x[i]);
  }

  void embed(const Weight& table, const int32_t* ids, int64_t M, float* y) override {
    const int64_t d = table.cols();
    for (int64_t m = 0; m < M; ++m) {
      if (ids[m] < 0 || ids[m] >= table.rows()) throw InputError(fmt::format("token id {} out of range [0, {})", ids[m], table.rows()));
      for (int64_t i = 0; i < d; ++i) y[m * d + i] = float(weight_at(table, ids[m] * d + i));
    }
  }

  void attention(const AttentionArgs& a) override {
    const int group = a.H / a.H_kv;
    for (int r = 0; r < a.n_rows; ++r) {
      const AttnRow& row = a.rows[r];
      for (int h = 0; h < a.H; ++h) {
        const int g = h / group;
        const float* q = a.q + (int64_t(r) * a.H + h) * a.D;
        auto K = [&](int64_t i) { return element_at(a.kv_dtype, row.k, g * row.head_stride + i); };
        auto V = [&](int64_t i) { return element_at(a.kv_dtype, row.v, g * row.head_stride + i); };
        std::vector<double> s(static_cast<size_t>(row.n_keys));
        double mx = -INFINITY;
        for (int t = 0; t < row.n_keys; ++t) {
          double acc = 0;
          for (int d = 0; d < a.D; ++d) acc += double(q[d]) * K(int64_t(t) * a.D + d);
          s[size_t(t)] = acc * a.scale;
          mx = std::max(mx, s[size_t(t)]);
        }
        if (a.logits_out)  // before the exponent: the scaled logits
          for (int t = 0; t < row.n_keys; ++t) a.logits_out[(int64_t(r) * a.H + h) * a.tap_ld + t] = float(s[size_t(t)]);
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        if (a.probs_out)
          for (int t = 0; t < row.n_keys; ++t) a.probs_out[(int64_t(r) * a.H + h) * a.tap_ld + t] = float(s[size_t(t)] / sum);
        float* o = a.out + (int64_t(r) * a.H + h) * a.D;
        for (int d = 0; d < a.D; ++d) {
          double acc = 0;
          for (int t = 0; t < row.n_keys; ++t) acc += s[size_t(t)] * V(int64_t(t) * a.D + d);
          o[d] = row.n_keys > 0 ? float(acc / sum) : 0.0f;
        }
      }
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_ref_backend() { return std::make_unique<RefBackend>(); }

}  // namespace hg
