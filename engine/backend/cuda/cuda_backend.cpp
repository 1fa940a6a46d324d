// The `cuda` backend: the Backend interface on device 0 through the kernels of cuda_kernels.cu.
// Buffers are device memory (see Backend's memory contract). Model-owned host arrays — Weight
// objects, norm weights, biases, RoPE tables — are uploaded on first use and cached by their host
// address for the backend's lifetime (the model outlives the run). Small host arguments (ids,
// positions) go through a growing device scratch. All work is on the calling thread's stream;
// download() waits for it. Compiled only when CUDA is (engine/CMakeLists.txt).
//
// Scope: F32, F16 and BF16 KV caches (read as F32, F32 accumulation); flash decoding per query row,
// every row of a prefill chunk in one pair of launches. Every registered strategy runs on it and
// keeps to the memory contract above (StrategyInfo::runs_on_cuda, checked by the CUDA tests).
#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/core/error.h"

namespace hg {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend() { cuda::device_info(&name_, &memory_); }
  ~CudaBackend() override {
    for (auto& [host, dev] : cache_) cuda::dev_free(dev);
    for (auto* s : {&ids_, &pos_[0].buf, &pos_[1].buf, &xh_})
      if (s->p) cuda::dev_free(s->p);
  }
  std::string_view name() const override { return "cuda"; }
  bool host_memory() const override { return false; }
  std::string device_name() const override { return name_; }
  int64_t device_memory_bytes() const override { return memory_; }

  void* alloc(size_t bytes) override { return cuda::dev_alloc(std::max<size_t>(bytes, 1)); }
  void free(void* p) override { cuda::dev_free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { cuda::h2d(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { cuda::d2h(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { cuda::d2d(dst, src, bytes); }
  void upload_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) override {
    cuda::h2d_2d(dst, dst_pitch, src, src_pitch, width, rows);
  }
  void download_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                   size_t rows) override {
    cuda::d2h_2d(dst, dst_pitch, src, src_pitch, width, rows);
  }
  void synchronize() override { cuda::synchronize(); }
  void forget_weight(const Weight& w) override {
    auto it = cache_.find(w.buf.data());
    if (it == cache_.end()) return;
    cuda::synchronize();  // queued work may still read it
    cuda::dev_free(it->second);
    cache_.erase(it);
  }
  void* alloc_host(size_t bytes) override { return cuda::host_alloc_pinned(std::max<size_t>(bytes, 1)); }
  void free_host(void* p) override { cuda::host_free_pinned(p); }
  void register_host(void* p, size_t bytes) override { cuda::host_register(p, bytes); }
  void unregister_host(void* p) override { cuda::host_unregister(p); }

  void matmul(const float* x, int64_t M, const Weight& w, const float* bias, float* y) override {
    const int64_t N = w.rows(), K = w.cols();
    void* xh = w.dtype == DType::kF32 ? nullptr : scratch(xh_, size_t(M * K) * 2);
    cuda::gemm(x, M, cached(w), w.dtype, N, K, bias ? cached(bias, size_t(N) * 4) : nullptr, y, xh);
  }
  void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) override {
    cuda::rms_norm(x, cached(w, size_t(n) * 4), M, n, eps, y);
  }
  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps,
                  float* y) override {
    cuda::layer_norm(x, cached(w, size_t(n) * 4), b ? cached(b, size_t(n) * 4) : nullptr, M, n, eps, y);
  }
  void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const RopeTable& t) override {
    auto it = cache_.find(&t);
    if (it == cache_.end()) {
      std::vector<float> f(t.inv_freq.begin(), t.inv_freq.end());
      void* d = cuda::dev_alloc(f.size() * 4);
      cuda::h2d(d, f.data(), f.size() * 4);
      it = cache_.emplace(&t, d).first;
    }
    cuda::rope(x, M, n_heads, D, upload_positions(pos, M), static_cast<const float*>(it->second),
               t.style == RopeStyle::kInterleaved);
  }
  void swiglu(const float* gate, const float* up, int64_t n, float* y) override { cuda::swiglu(gate, up, n, y); }
  void relu(float* x, int64_t n) override { cuda::relu(x, n); }
  void add(float* y, const float* x, int64_t n) override { cuda::add(y, x, n); }
  void embed(const Weight& table, const int32_t* ids, int64_t M, float* y) override {
    for (int64_t m = 0; m < M; ++m)
      if (ids[m] < 0 || ids[m] >= table.rows())
        throw InputError(fmt::format("token id {} out of range [0, {})", ids[m], table.rows()));
    cuda::embed(cached(table), table.dtype, table.cols(), upload_ids(ids, M), M, y);
  }

  void attention(const AttentionArgs& a) override {
    if (a.logits_out || a.probs_out) return attention_with_taps(a);
    rows_.resize(size_t(a.n_rows));
    for (int r = 0; r < a.n_rows; ++r) {
      const AttnRow& row = a.rows[r];
      rows_[size_t(r)] = cuda::AttnRowDev{a.q + int64_t(r) * a.H * a.D,
                                          row.k,
                                          row.v,
                                          a.out + int64_t(r) * a.H * a.D,
                                          row.head_stride / a.D,
                                          row.n_keys};
    }
    cuda::attention_rows(rows_.data(), a.n_rows, a.H, a.H_kv, a.D, a.scale, a.kv_dtype);
  }
  void group_logits(const float* q, int G, const void* K, int64_t n, int D, float scale, float* logits,
                    DType kt) override {
    cuda::attention_logits(q, K, kt, n, n, G, 1, D, scale, logits);
  }
  void heads_logits(const float* q, int H, int H_kv, const void* K, int64_t k_ld, int64_t n, int D, float scale,
                    float* logits, DType kt) override {
    cuda::attention_logits(q, K, kt, k_ld, n, H, H_kv, D, scale, logits, n);
  }
  void softmax_rows(float* x, int64_t rows, int64_t n) override { cuda::softmax_rows(x, rows, n); }
  // These three keep their scratch per thread (the copy queue's thread gathers too).
  float max_value(const float* x, int64_t n) override { return cuda::max_value(x, n); }
  float exp_shift_sum(float* x, int64_t n, float shift) override { return cuda::exp_shift_sum(x, n, shift); }
  void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                   int64_t n) override {
    cuda::gather_rows_host_idx(dst, src, row_bytes, src_stride, idx, n);
  }
  void copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n) override {
    cuda::copy_rows_host_ptrs(dst, src, row_bytes, n);
  }
  void accumulate_scores(const ScoreRows& a) override {
    static_assert(sizeof(cuda::ScoreSlotDev) == sizeof(ScoreSlot) && sizeof(cuda::ScoreRowDev) == sizeof(ScoreRows::Row));
    cuda::accumulate_scores(a.rule == ScoreRule::kSum ? 0 : 1, a.H, a.H_kv, a.taps, a.tap_ld, a.seed, a.layer,
                            reinterpret_cast<const cuda::ScoreRowDev*>(a.rows), a.n_rows);
  }
  void pick_evictions(const EvictionPick* picks, int64_t n, int32_t* out) override {
    static_assert(sizeof(cuda::EvictionPickDev) == sizeof(EvictionPick));
    cuda::pick_evictions(reinterpret_cast<const cuda::EvictionPickDev*>(picks), n, out);
  }
  void put_rows(void* const* dst, const void* src, int64_t row_bytes, int64_t n) override {
    cuda::put_rows(dst, src, row_bytes, n);
  }
  void pool_scores(const ScorePool* items, int64_t n, int kernel, bool max) override {
    static_assert(sizeof(cuda::ScorePoolDev) == sizeof(ScorePool));
    cuda::pool_scores(reinterpret_cast<const cuda::ScorePoolDev*>(items), n, kernel, max);
  }
  void group_weighted_v(const float* p, int G, const void* V, int64_t n, int D, float* out, DType vt) override {
    cuda::weighted_v_sum(p, V, vt, n, n, G, 1, D, out);
  }
  void convert_to_f32(const void* src, DType st, int64_t n, float* dst) override {
    if (st == DType::kF32) copy(dst, src, size_t(n) * 4);
    else cuda::to_f32(src, st, n, dst);
  }
  void merged_attention(const MergedAttention& a) override {
    cuda::merged_attention(a.q, a.H, a.H_kv, a.D, a.scale, a.la, a.Va, a.na, a.Kb, a.Vb, a.ld_b, a.nb, a.lb,
                           a.out, a.kv_dtype);
  }
  void write_kv(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst, int64_t head_stride,
                DType dt) override {
    cuda::kv_write(src, n, H_kv, D, upload_positions(pos, n), dst, head_stride, dt);
  }

 private:
  // Attention whose caller reads the scaled logits or the probabilities (H2O's and Keyformer's
  // scores): per row, the logits, their softmax and the weighted V sum as three kernels, writing
  // the taps (rows tap_ld floats apart) on the way.
  void attention_with_taps(const AttentionArgs& a) {
    const int64_t tap = int64_t(a.H) * a.tap_ld;
    float* work = (a.logits_out && a.probs_out) ? nullptr : static_cast<float*>(scratch(taps_, size_t(tap) * 4));
    for (int r = 0; r < a.n_rows; ++r) {
      const AttnRow& row = a.rows[r];
      const int64_t ld = row.head_stride / a.D, n = row.n_keys;
      const float* q = a.q + int64_t(r) * a.H * a.D;
      float* logits = a.logits_out ? a.logits_out + r * tap : work;
      float* probs = a.probs_out ? a.probs_out + r * tap : work;
      cuda::attention_logits(q, row.k, a.kv_dtype, ld, n, a.H, a.H_kv, a.D, a.scale, logits, a.tap_ld);
      if (probs != logits)
        cuda::d2d_2d(probs, size_t(a.tap_ld) * 4, logits, size_t(a.tap_ld) * 4, size_t(n) * 4, size_t(a.H));
      cuda::softmax_rows_ld(probs, a.H, n, a.tap_ld);
      cuda::weighted_v_sum(probs, row.v, a.kv_dtype, ld, n, a.H, a.H_kv, a.D, a.out + int64_t(r) * a.H * a.D,
                           a.tap_ld);
    }
  }
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  // A device scratch of at least `bytes`, grown (never shrunk) as needed. Growing waits for the
  // stream first: work queued earlier may still read the old buffer.
  void* scratch(Scratch& s, size_t bytes) {
    if (s.bytes < bytes) {
      cuda::synchronize();
      if (s.p) cuda::dev_free(s.p);
      s.bytes = std::max(bytes, 2 * s.bytes);
      s.p = cuda::dev_alloc(s.bytes);
    }
    return s.p;
  }
  // ids/positions to the device. The copy is on the same stream, so it runs after the kernels that
  // read the previous contents; h2d waits for it, so the host array may change afterwards.
  const int32_t* upload_ids(const int32_t* host, int64_t n) {
    void* d = scratch(ids_, size_t(std::max<int64_t>(n, 1)) * 4);
    cuda::h2d(d, host, size_t(n) * 4);
    return static_cast<const int32_t*>(d);
  }
  // Positions (RoPE, KV rows, ring slots) to the device. A decode step passes the same positions
  // to every layer's RoPE and KV writes, so the last two position arrays are kept on the device
  // and reused while their contents match: one waiting copy per step instead of four per layer
  // (two arrays: HybridGen writes ring slots between the RoPE calls).
  const int32_t* upload_positions(const int32_t* host, int64_t n) {
    for (auto& e : pos_)
      if (e.buf.p && e.host.size() == size_t(n) && std::equal(host, host + n, e.host.begin())) {
        e.used = ++pos_clock_;
        return static_cast<const int32_t*>(e.buf.p);
      }
    PosEntry& e = pos_[0].used <= pos_[1].used ? pos_[0] : pos_[1];  // the least recently used
    void* d = scratch(e.buf, size_t(std::max<int64_t>(n, 1)) * 4);
    cuda::h2d(d, host, size_t(n) * 4);
    e.host.assign(host, host + n);
    e.used = ++pos_clock_;
    return static_cast<const int32_t*>(d);
  }
  const void* cached(const Weight& w) { return cached(w.buf.data(), w.buf.bytes()); }
  const float* cached(const float* host, size_t bytes) {
    return static_cast<const float*>(cached(static_cast<const void*>(host), bytes));
  }
  const void* cached(const void* host, size_t bytes) {
    auto it = cache_.find(host);
    if (it != cache_.end()) return it->second;
    void* d = cuda::dev_alloc(bytes);
    cuda::h2d(d, host, bytes);
    return cache_.emplace(host, d).first->second;
  }

  std::string name_;
  int64_t memory_ = 0;
  std::unordered_map<const void*, void*> cache_;  // host address → device copy
  Scratch ids_, xh_, taps_;
  std::vector<cuda::AttnRowDev> rows_;  // attention()'s row descriptors
  struct PosEntry {
    Scratch buf;
    std::vector<int32_t> host;  // what buf holds
    uint64_t used = 0;
  };
  std::array<PosEntry, 2> pos_;
  uint64_t pos_clock_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace hg
