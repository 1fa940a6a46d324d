// The `cpu` backend: oneDNN matmul for projections (F32, or BF16 weights with activations
// converted to BF16 and F32 accumulation), AVX-512 kernels for the rest, OpenMP worker pool
// shared with oneDNN. Primitives are created once per (M, K, N, type) and cached.
#include <cmath>
#include <map>
#include <tuple>

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"

namespace hg {
namespace {

// Decode batches up to this many rows use cpu::gemv; larger ones oneDNN.
constexpr int64_t kGemvMaxRows = 4;
// The unit of the GEMV's row ranges (the blocks the loaders wrote).
constexpr int64_t kGemvRows = kWeightRowBlock;
// The fewest weight rows one GEMV call takes as threads come free (docs/performance.md, "Tuning
// choices"): fewer calls per matrix, each stream still long.
constexpr int64_t kGemvMinRowsPerCall = 2 * kGemvRows;
// F16 weights converted per prefill block: 64 MiB of F32. Larger blocks make larger GEMMs
// (docs/performance.md, "Tuning choices").
constexpr int64_t kF16BlockBytes = int64_t(64) << 20;
constexpr int kBatchHeads = 8;       // query heads per batched prefill group (compiled group sizes)

// cos and sin of pos · inv_freq[i] (as F32) for positions [0, kPositions), per thread, each row
// computed the first time a rotation asks for it: prefill rotates the same positions in every
// layer, and StreamingLLM re-rotates its kept keys at the same ranks every step. Keyed by the
// table's frequencies, not its address (another model's table can reuse an address).
// cos and sin of p · freq[i], i < h, as F32: one row of a rotation's angles.
void rope_angles_row(int32_t p, const double* freq, size_t h, float* cs, float* sn) {
  for (size_t i = 0; i < h; ++i) {
    const double a = double(p) * freq[i];
    cs[i] = float(std::cos(a));
    sn[i] = float(std::sin(a));
  }
}

class RopeAngles {
 public:
  void bind(const RopeTable& t, int half) {
    if (half == half_ && t.inv_freq == freq_) return;
    half_ = half, freq_ = t.inv_freq;
    have_.clear(), cs_.clear(), sn_.clear();
  }
  // The row of position p, or false when p is outside the cached range.
  bool lookup(int32_t p, const float*& cs, const float*& sn) {
    if (p < 0 || p >= kPositions) return false;
    const size_t h = size_t(half_), row = size_t(p) * h;
    if (have_.size() <= size_t(p)) have_.resize(size_t(p) + 1, 0), cs_.resize(row + h), sn_.resize(row + h);
    if (!have_[size_t(p)]) {
      rope_angles_row(p, freq_.data(), h, cs_.data() + row, sn_.data() + row);
      have_[size_t(p)] = 1;
    }
    cs = cs_.data() + row, sn = sn_.data() + row;
    return true;
  }

 private:
  static constexpr int32_t kPositions = 8192;  // at most 4 MiB per thread (D = 128)
  int half_ = -1;
  std::vector<double> freq_;
  std::vector<uint8_t> have_;
  std::vector<float> cs_, sn_;
};
thread_local RopeAngles rope_angles;

class CpuBackend final : public Backend {
 public:
  CpuBackend()
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_), bf16_matmul_(has_bf16_matmul(engine_)) {}
  std::string_view name() const override { return "cpu"; }

  void matmul(const float* x, int64_t M, const Weight& w, const float* bias, float* y) override {
    const int64_t N = w.rows(), K = w.cols();
    if (M <= kGemvMaxRows) {
      // Decode: our own streaming GEMV (F32/F16/BF16 weights, F32 accumulation; F32 activations,
      // rounded to BF16 for BF16 weights where the CPU has vdpbf16ps). Rows go to the threads as
      // they come free.
      const int64_t nblk = (N + kGemvRows - 1) / kGemvRows;
      parallel_ranges(nblk, kGemvMinRowsPerCall / kGemvRows, [&](int64_t b, int64_t e) {
        cpu::gemv(x, int(M), w.buf.data(), w.dtype, K, b * kGemvRows, std::min(N, e * kGemvRows), y, N);
      });
    } else if (w.dtype == DType::kF16 || (w.dtype == DType::kBF16 && !bf16_matmul_)) {
      // Prefill with 16-bit weights oneDNN 2.6 cannot multiply on this CPU (F16 always; BF16
      // without AVX-512): blocks of rows are converted to F32 and multiplied as F32; the
      // conversion is paid once per block per call, amortised over the M rows. BF16 weights take
      // activations rounded to BF16, as oneDNN's BF16 matmul does, so prefill's numerics do not
      // depend on the CPU beyond the summation order.
      if (w.dtype == DType::kBF16) {
        if (xr_.size() < size_t(M * K)) xr_.resize(size_t(M * K));
        parallel_chunks(M, [&](int64_t b, int64_t e) {
          for (int64_t i = b * K; i < e * K; ++i) xr_[size_t(i)] = bf16_to_f32(f32_to_bf16(x[i]));
        });
        x = xr_.data();
      }
      const int64_t block = std::clamp<int64_t>(kF16BlockBytes / (K * 4), 256, N);
      if (wf_.size() < size_t(block * K)) wf_.resize(size_t(block * K));
      auto* convert = w.dtype == DType::kF16 ? cpu::f16_to_f32_row : cpu::bf16_to_f32_row;
      for (int64_t n0 = 0; n0 < N; n0 += block) {
        const int64_t nb = std::min(block, N - n0);
        parallel_chunks(nb, [&](int64_t b, int64_t e) {
          convert(w.as<uint16_t>() + (n0 + b) * K, wf_.data() + b * K, (e - b) * K);
        });
        dnnl_matmul(x, M, wf_.data(), dnnl::memory::data_type::f32, K, nb, N, y + n0);
      }
    } else {
      dnnl_matmul(x, M, w.buf.data(), w.dtype == DType::kBF16 ? dnnl::memory::data_type::bf16
                                                              : dnnl::memory::data_type::f32,
                  K, N, N, y);
    }
    if (bias) {
      for (int64_t m = 0; m < M; ++m) cpu::add(y + m * N, bias, N);
    }
  }

  // y[M, N] (row stride ldy) = x[M, K] · W[N, K]ᵀ through a cached oneDNN primitive; BF16 weights
  // take BF16 activations (converted here) with F32 accumulation.
  void dnnl_matmul(const float* x, int64_t M, const void* wptr, dnnl::memory::data_type wt, int64_t K, int64_t N,
                   int64_t ldy, float* y) {
    using dt = dnnl::memory::data_type;
    // oneDNN partitions a primitive's work for the thread count at creation: part of the key.
    auto key = std::make_tuple(M, K, N, ldy, int(wt), num_threads());
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      dnnl::memory::desc src({M, K}, wt, dnnl::memory::format_tag::ab);
      dnnl::memory::desc wei({K, N}, wt, dnnl::memory::format_tag::ba);  // W[N, K] row-major
      dnnl::memory::desc dst({M, N}, dt::f32, dnnl::memory::dims{ldy, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), engine_);
      it = cache_.emplace(key, Prim{dnnl::matmul(pd), src, wei, dst}).first;
    }
    const void* src_ptr = x;
    if (wt == dt::bf16) {
      if (xb_.size() < size_t(M * K)) xb_.resize(size_t(M * K));
      parallel_chunks(M, [&](int64_t b, int64_t e) {
        cpu::f32_to_bf16_row(x + b * K, xb_.data() + b * K, (e - b) * K);
      });
      src_ptr = xb_.data();
    }
    dnnl::memory src_m(it->second.src, engine_, const_cast<void*>(src_ptr));
    dnnl::memory wei_m(it->second.wei, engine_, const_cast<void*>(wptr));
    dnnl::memory dst_m(it->second.dst, engine_, y);
    it->second.prim.execute(stream_, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}});
    stream_.wait();
  }

  void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) override {
    parallel_chunks(M, [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m) cpu::rms_norm_row(x + m * n, w, n, eps, y + m * n);
    });
  }

  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps,
                  float* y) override {
    parallel_chunks(M, [&](int64_t bb, int64_t e) {
      for (int64_t m = bb; m < e; ++m) cpu::layer_norm_row(x + m * n, w, b, n, eps, y + m * n);
    });
  }

  void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const RopeTable& t) override {
    const int half = D / 2;
    parallel_chunks(M, [&](int64_t b, int64_t e) {
      std::vector<float> row_cs(static_cast<size_t>(half)), row_sn(static_cast<size_t>(half));
      RopeAngles& angles = rope_angles;
      angles.bind(t, half);
      for (int64_t m = b; m < e; ++m) {
        const float *cs = row_cs.data(), *sn = row_sn.data();
        if (!angles.lookup(pos[m], cs, sn))
          rope_angles_row(pos[m], t.inv_freq.data(), size_t(half), row_cs.data(), row_sn.data());
        for (int h = 0; h < n_heads; ++h) {
          float* v = x + (m * n_heads + h) * D;
          if (t.style == RopeStyle::kHalf) {
            for (int i = 0; i < half; ++i) {
              const float x0 = v[i], x1 = v[i + half];
              v[i] = x0 * cs[size_t(i)] - x1 * sn[size_t(i)];
              v[i + half] = x0 * sn[size_t(i)] + x1 * cs[size_t(i)];
            }
          } else {
            for (int i = 0; i < half; ++i) {
              const float x0 = v[2 * i], x1 = v[2 * i + 1];
              v[2 * i] = x0 * cs[size_t(i)] - x1 * sn[size_t(i)];
              v[2 * i + 1] = x0 * sn[size_t(i)] + x1 * cs[size_t(i)];
            }
          }
        }
      }
    });
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* y) override {
    parallel_chunks((n + 1023) / 1024, [&](int64_t b, int64_t e) {
      cpu::swiglu(gate + b * 1024, up + b * 1024, std::min(n, e * 1024) - b * 1024, y + b * 1024);
    });
  }

  void relu(float* x, int64_t n) override { cpu::relu(x, n); }
  void add(float* y, const float* x, int64_t n) override { cpu::add(y, x, n); }

  void embed(const Weight& table, const int32_t* ids, int64_t M, float* y) override {
    const int64_t d = table.cols();
    for (int64_t m = 0; m < M; ++m) {
      if (ids[m] < 0 || ids[m] >= table.rows())
        throw InputError(fmt::format("token id {} out of range [0, {})", ids[m], table.rows()));
      const int64_t off = ids[m] * d;
      switch (table.dtype) {
        case DType::kF32: std::memcpy(y + m * d, table.as<float>() + off, size_t(d) * 4); break;
        case DType::kBF16: cpu::bf16_to_f32_row(table.as<uint16_t>() + off, y + m * d, d); break;
        case DType::kF16: cpu::f16_to_f32_row(table.as<uint16_t>() + off, y + m * d, d); break;
      }
    }
  }

  void attention(const AttentionArgs& a) override {
    const int G = a.H / a.H_kv;
    const int64_t n_tasks = int64_t(a.n_rows) * a.H_kv;
    int64_t max_keys = 0;
    for (int r = 0; r < a.n_rows; ++r) max_keys = std::max<int64_t>(max_keys, a.rows[r].n_keys);
    const int nt = num_threads();
    if (scratch_.size() < size_t(nt)) scratch_.resize(size_t(nt));
    // Flash-decoding split: with fewer (row, KV head) tasks than threads can keep busy and long
    // key ranges, each task's keys are cut into chunks on different threads and the partial
    // results merged by their log-sum-exp. Not with taps (they need one softmax per row).
    const int64_t splits = (!a.logits_out && !a.probs_out && n_tasks < 2 * nt && max_keys >= 2048)
                               ? std::min<int64_t>((2 * nt + n_tasks - 1) / n_tasks, max_keys / 1024)
                               : 1;
    if (splits > 1) {
      attention_split(a, G, splits, max_keys);
      return;
    }
    if (attention_batched(a, G, max_keys)) return;
    parallel_for(n_tasks, [&](int64_t task) {
      const int r = int(task / a.H_kv), g = int(task % a.H_kv);
      const AttnRow& row = a.rows[r];
      auto& s = scratch_[size_t(omp_get_thread_num())];
      if (s.size() < size_t(G * max_keys)) s.resize(size_t(G * max_keys));
      const int64_t off = int64_t(g) * row.head_stride * int64_t(dtype_size(a.kv_dtype));
      cpu::attention_group(a.q + (int64_t(r) * a.H + int64_t(g) * G) * a.D, static_cast<const char*>(row.k) + off,
                           static_cast<const char*>(row.v) + off, a.kv_dtype, row.n_keys, G, a.D, a.scale,
                           a.out + (int64_t(r) * a.H + int64_t(g) * G) * a.D, s.data(),
                           a.logits_out ? a.logits_out + (int64_t(r) * a.H + int64_t(g) * G) * a.tap_ld : nullptr,
                           a.probs_out ? a.probs_out + (int64_t(r) * a.H + int64_t(g) * G) * a.tap_ld : nullptr,
                           a.tap_ld);
    });
  }

  // Prefill: consecutive rows of one sequence (the same K and V) share every K/V read. Up to
  // kBatchHeads / G rows run as one group of R·G query heads, each masked to its own causal key
  // range. Not with taps, and not when no two neighbouring rows share a cache.
  bool attention_batched(const AttentionArgs& a, int G, int64_t max_keys) {
    if (a.logits_out || a.probs_out || a.n_rows < 2 || 2 * G > kBatchHeads) return false;
    const int R = kBatchHeads / G;
    auto same = [&](const AttnRow& x, const AttnRow& y) { return x.k == y.k && x.v == y.v && x.head_stride == y.head_stride; };
    blocks_.clear();
    for (int r = 0; r < a.n_rows;) {
      int c = 1;
      while (c < R && r + c < a.n_rows && same(a.rows[r + c], a.rows[r])) ++c;
      blocks_.emplace_back(r, c);
      r += c;
    }
    if (blocks_.size() == size_t(a.n_rows)) return false;
    const int nt = num_threads();
    if (batch_.size() < size_t(nt)) batch_.resize(size_t(nt));
    const int64_t es = int64_t(dtype_size(a.kv_dtype)), D = a.D;
    parallel_for(int64_t(blocks_.size()) * a.H_kv, [&](int64_t task) {
      const auto [r0, c] = blocks_[size_t(task / a.H_kv)];
      const int g = int(task % a.H_kv), GE = c * G;
      auto& buf = batch_[size_t(omp_get_thread_num())];
      buf.q.resize(size_t(GE * D));
      buf.out.resize(size_t(GE * D));
      buf.lim.resize(size_t(GE));
      int64_t n = 0;
      for (int j = 0; j < c; ++j)
        for (int h = 0; h < G; ++h) {
          const float* src = a.q + ((int64_t(r0) + j) * a.H + int64_t(g) * G + h) * D;
          std::copy(src, src + D, buf.q.data() + (j * G + h) * D);
          buf.lim[size_t(j * G + h)] = a.rows[r0 + j].n_keys;
          n = std::max<int64_t>(n, a.rows[r0 + j].n_keys);
        }
      auto& s = scratch_[size_t(omp_get_thread_num())];
      if (s.size() < size_t(GE * max_keys)) s.resize(size_t(GE * max_keys));
      const AttnRow& row = a.rows[r0];
      const int64_t off = int64_t(g) * row.head_stride * es;
      cpu::attention_group(buf.q.data(), static_cast<const char*>(row.k) + off, static_cast<const char*>(row.v) + off,
                           a.kv_dtype, n, GE, int(D), a.scale, buf.out.data(), s.data(), nullptr, nullptr, 0, nullptr,
                           buf.lim.data());
      for (int j = 0; j < c; ++j)
        std::copy(buf.out.data() + j * G * D, buf.out.data() + (j + 1) * G * D,
                  a.out + ((int64_t(r0) + j) * a.H + int64_t(g) * G) * D);
    });
    return true;
  }

  void attention_split(const AttentionArgs& a, int G, int64_t S, int64_t max_keys) {
    const int64_t n_tasks = int64_t(a.n_rows) * a.H_kv;
    const int64_t es = int64_t(dtype_size(a.kv_dtype));
    part_out_.resize(size_t(n_tasks * S * G * a.D));
    part_lse_.resize(size_t(n_tasks * S * G));
    const int64_t chunk_keys = (max_keys + S - 1) / S;
    parallel_for(n_tasks * S, [&](int64_t job) {
      const int64_t task = job / S, c = job % S;
      const int r = int(task / a.H_kv), g = int(task % a.H_kv);
      const AttnRow& row = a.rows[r];
      const int64_t t0 = row.n_keys * c / S, t1 = row.n_keys * (c + 1) / S;
      auto& s = scratch_[size_t(omp_get_thread_num())];
      if (s.size() < size_t(G * chunk_keys)) s.resize(size_t(G * chunk_keys));
      const int64_t off = (int64_t(g) * row.head_stride + t0 * a.D) * es;
      cpu::attention_group(a.q + (int64_t(r) * a.H + int64_t(g) * G) * a.D, static_cast<const char*>(row.k) + off,
                           static_cast<const char*>(row.v) + off, a.kv_dtype, t1 - t0, G, a.D, a.scale,
                           part_out_.data() + job * G * a.D, s.data(), nullptr, nullptr, 0,
                           part_lse_.data() + job * G);
    });
    parallel_for(n_tasks, [&](int64_t task) {
      const int r = int(task / a.H_kv), g = int(task % a.H_kv);
      for (int h = 0; h < G; ++h) {
        float M = -INFINITY;
        for (int64_t c = 0; c < S; ++c) M = std::max(M, part_lse_[size_t((task * S + c) * G + h)]);
        float* o = a.out + (int64_t(r) * a.H + int64_t(g) * G + h) * a.D;
        std::fill(o, o + a.D, 0.0f);
        float wsum = 0;
        for (int64_t c = 0; c < S; ++c) {
          const float lse = part_lse_[size_t((task * S + c) * G + h)];
          if (lse == -INFINITY) continue;
          const float w = std::exp(lse - M);
          wsum += w;
          const float* po = part_out_.data() + ((task * S + c) * G + h) * a.D;
          for (int d = 0; d < a.D; ++d) o[d] += w * po[d];
        }
        if (wsum > 0)
          for (int d = 0; d < a.D; ++d) o[d] /= wsum;
      }
    });
  }

  // Key blocks across the pool (each key row read once for the G heads).
  static int64_t key_blocks(int64_t n) {
    return std::max<int64_t>(1, std::min<int64_t>(num_threads() * 4, n / 256));
  }
  void group_logits(const float* q, int G, const void* K, int64_t n, int D, float scale, float* logits,
                    DType kt) override {
    const int64_t nb = key_blocks(n);
    parallel_for(nb,
                 [&](int64_t b) { cpu::group_logits(q, G, K, kt, n, n * b / nb, n * (b + 1) / nb, D, scale, logits); });
  }
  void heads_logits(const float* q, int H, int H_kv, const void* K, int64_t k_ld, int64_t n, int D, float scale,
                    float* logits, DType kt) override {
    HG_CHECK(H_kv > 0 && H % H_kv == 0);
    const int G = H / H_kv;
    const int64_t nb = key_blocks(n), es = int64_t(dtype_size(kt));
    parallel_for(int64_t(H_kv) * nb, [&](int64_t i) {
      const int64_t g = i / nb, b = i % nb;
      cpu::group_logits(q + g * G * D, G, static_cast<const char*>(K) + g * k_ld * D * es, kt, n, n * b / nb,
                        n * (b + 1) / nb, D, scale, logits + g * G * n);
    });
  }
  void group_logit_max(const float* q, int G, const void* K, int64_t n, int D, float scale, float* score,
                       DType kt) override {
    const int64_t nb = key_blocks(n);
    parallel_for(
        nb, [&](int64_t b) { cpu::group_logit_max(q, G, K, kt, n * b / nb, n * (b + 1) / nb, D, scale, score); });
  }

  void softmax_rows(float* x, int64_t rows, int64_t n) override {
    parallel_for(rows, [&](int64_t r) {
      float* v = x + r * n;
      float mx = -INFINITY;
      for (int64_t t = 0; t < n; ++t) mx = std::max(mx, v[t]);
      const float sum = cpu::exp_shift_sum(v, n, mx);
      const float inv = 1.0f / sum;
      for (int64_t t = 0; t < n; ++t) v[t] *= inv;
    });
  }

  void group_weighted_v(const float* p, int G, const void* V, int64_t n, int D, float* out, DType vt) override {
    cpu::group_weighted_v(p, G, V, vt, n, D, out);
  }
  void convert_to_f32(const void* src, DType st, int64_t n, float* dst) override { cpu::to_f32(src, st, dst, n); }
  float max_value(const float* x, int64_t n) override { return cpu::max_value(x, n); }
  float exp_shift_sum(float* x, int64_t n, float shift) override { return cpu::exp_shift_sum(x, n, shift); }
  void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                   int64_t n) override {
    cpu::gather_rows(dst, src, row_bytes, src_stride, idx, n);
  }
  void copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n) override {
    cpu::copy_rows(dst, src, row_bytes, n);
  }
  void gumbel_noise(uint64_t stream, const int32_t* pos, int64_t n, double* out) override {
    cpu::gumbel_noise(stream, pos, n, out);
  }
  int32_t logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, int32_t* out) override {
    return cpu::logit_top_k(logits, G, ld, n, K, out);
  }

 private:
  struct Prim {
    dnnl::matmul prim;
    dnnl::memory::desc src, wei, dst;
  };
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int, int>, Prim> cache_;
  std::vector<uint16_t> xb_;
  bool bf16_matmul_;       // oneDNN has a BF16 matmul for this CPU (AVX-512 and up)
  std::vector<float> wf_;  // 16-bit weight block converted for prefill
  std::vector<float> xr_;  // activations rounded to BF16 for converted BF16 weights

  static bool has_bf16_matmul(const dnnl::engine& eng) {
    using dt = dnnl::memory::data_type;
    try {
      dnnl::memory::desc src({2, 2}, dt::bf16, dnnl::memory::format_tag::ab);
      dnnl::memory::desc wei({2, 2}, dt::bf16, dnnl::memory::format_tag::ba);
      dnnl::memory::desc dst({2, 2}, dt::f32, dnnl::memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), eng);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }
  std::vector<std::vector<float>> scratch_;
  std::vector<float> part_out_, part_lse_;
  struct BatchBuf {
    std::vector<float> q, out;
    std::vector<int32_t> lim;
  };
  std::vector<BatchBuf> batch_;                 // per thread
  std::vector<std::pair<int, int>> blocks_;     // (first row, rows) sharing one K/V
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace hg
