// The metered backend (metered_backend.h): forwards every op to the wrapped backend.
#include "engine/backend/metered_backend.h"

#include <algorithm>
#include <chrono>

namespace hg {

const std::array<DeviceCounts::Field, 9>& DeviceCounts::fields() {
  static const std::array<Field, 9> f = {{{&DeviceCounts::launches, "launches"},
                                          {&DeviceCounts::copies_h2d, "copies_h2d"},
                                          {&DeviceCounts::copies_d2h, "copies_d2h"},
                                          {&DeviceCounts::copies_d2d, "copies_d2d"},
                                          {&DeviceCounts::bytes_h2d, "bytes_h2d"},
                                          {&DeviceCounts::bytes_d2h, "bytes_d2h"},
                                          {&DeviceCounts::syncs, "syncs"},
                                          {&DeviceCounts::waits, "waits"},
                                          {&DeviceCounts::host_policy_elems, "host_policy_elems"}}};
  return f;
}

DeviceCounts DeviceCounts::operator-(const DeviceCounts& o) const {
  DeviceCounts d = *this;
  for (const Field& f : fields()) d.*f.member -= o.*f.member;
  return d;
}

DeviceCounts& DeviceCounts::operator+=(const DeviceCounts& o) {
  for (const Field& f : fields()) this->*f.member += o.*f.member;
  return *this;
}

void DeviceCounters::add(const DeviceCounts& calls) {
  const int64_t step = step_fn_ ? step_fn_() : -1;
  if (call_fn_ && (calls.launches || calls.copies())) call_fn_(calls.launches, calls.copies());
  const size_t i = size_t(std::max<int64_t>(step, -1) + 1);
  std::lock_guard<std::mutex> l(mu_);
  if (i >= by_step_.size()) by_step_.resize(i + 1);
  by_step_[i] += calls;
}

DeviceCounts DeviceCounters::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  DeviceCounts c;
  for (const auto& s : by_step_) c += s;
  return c;
}

DeviceCounts DeviceCounters::of_step(int64_t step) const {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t i = step + 1;
  return i < 0 || i >= int64_t(by_step_.size()) ? DeviceCounts{} : by_step_[size_t(i)];
}

void DeviceCounters::reset() {
  std::lock_guard<std::mutex> l(mu_);
  by_step_.clear();
}

void spend_microseconds(double us) {
  if (us <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(int64_t(us * 1e3));
  while (std::chrono::steady_clock::now() < until) {
  }
}

namespace {

class MeteredBackend final : public Backend {
 public:
  MeteredBackend(std::unique_ptr<Backend> inner, DeviceCounters* c, DeviceCosts costs)
      : in_(std::move(inner)), c_(*c), costs_(costs) {}

  std::string_view name() const override { return in_->name(); }
  bool host_memory() const override { return in_->host_memory(); }
  std::string device_name() const override { return in_->device_name(); }
  int64_t device_memory_bytes() const override { return in_->device_memory_bytes(); }

  void matmul(const float* x, int64_t M, const Weight& w, const float* bias, float* y) override {
    launch(), in_->matmul(x, M, w, bias, y);
  }
  void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) override {
    launch(), in_->rms_norm(x, w, M, n, eps, y);
  }
  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps,
                  float* y) override {
    launch(), in_->layer_norm(x, w, b, M, n, eps, y);
  }
  void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const RopeTable& t) override {
    launch(), in_->rope(x, M, n_heads, D, pos, t);
  }
  void swiglu(const float* gate, const float* up, int64_t n, float* y) override {
    launch(), in_->swiglu(gate, up, n, y);
  }
  void relu(float* x, int64_t n) override { launch(), in_->relu(x, n); }
  void add(float* y, const float* x, int64_t n) override { launch(), in_->add(y, x, n); }
  void embed(const Weight& table, const int32_t* ids, int64_t M, float* y) override {
    launch(), in_->embed(table, ids, M, y);
  }
  void attention(const AttentionArgs& a) override { launch(), in_->attention(a); }
  void convert_to_f32(const void* src, DType st, int64_t n, float* dst) override {
    launch(), in_->convert_to_f32(src, st, n, dst);
  }
  void write_kv(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst, int64_t head_stride,
                DType dt) override {
    launch(), in_->write_kv(src, n, H_kv, D, pos, dst, head_stride, dt);
  }
  void forget_weight(const Weight& w) override { in_->forget_weight(w); }

  void* alloc(size_t bytes) override { return in_->alloc(bytes); }
  void free(void* p) override { in_->free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { h2d(bytes), in_->upload(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override {
    d2h(bytes), in_->download(dst, src, bytes), sync();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    c_.add({.copies_d2d = 1}), spend_microseconds(costs_.copy_us), in_->copy(dst, src, bytes);
  }
  void upload_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) override {
    h2d(width * rows), in_->upload_2d(dst, dst_pitch, src, src_pitch, width, rows);
  }
  void download_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                   size_t rows) override {
    d2h(width * rows), in_->download_2d(dst, dst_pitch, src, src_pitch, width, rows), sync();
  }
  void synchronize() override { in_->synchronize(), sync(); }
  void* alloc_host(size_t bytes) override { return in_->alloc_host(bytes); }
  void free_host(void* p) override { in_->free_host(p); }
  void register_host(void* p, size_t bytes) override { in_->register_host(p, bytes); }
  void unregister_host(void* p) override { in_->unregister_host(p); }

  void group_logits(const float* q, int G, const void* K, int64_t n, int D, float scale, float* logits,
                    DType kt) override {
    launch(), in_->group_logits(q, G, K, n, D, scale, logits, kt);
  }
  void heads_logits(const float* q, int H, int H_kv, const void* K, int64_t k_ld, int64_t n, int D, float scale,
                    float* logits, DType kt) override {
    launch(), in_->heads_logits(q, H, H_kv, K, k_ld, n, D, scale, logits, kt);
  }
  void group_logit_max(const float* q, int G, const void* K, int64_t n, int D, float scale, float* score,
                       DType kt) override {
    launch(), in_->group_logit_max(q, G, K, n, D, scale, score, kt);
  }
  void softmax_rows(float* x, int64_t rows, int64_t n) override { launch(), in_->softmax_rows(x, rows, n); }
  void group_weighted_v(const float* p, int G, const void* V, int64_t n, int D, float* out, DType vt) override {
    launch(), in_->group_weighted_v(p, G, V, n, D, out, vt);
  }
  void merged_attention(const MergedAttention& a) override { launch(), in_->merged_attention(a); }
  // A scalar result reaches the host: a launch and a wait.
  float max_value(const float* x, int64_t n) override {
    launch();
    const float r = in_->max_value(x, n);
    sync();
    return r;
  }
  float exp_shift_sum(float* x, int64_t n, float shift) override {
    launch();
    const float r = in_->exp_shift_sum(x, n, shift);
    sync();
    return r;
  }
  void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                   int64_t n) override {
    launch(), in_->gather_rows(dst, src, row_bytes, src_stride, idx, n);
  }
  void copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n) override {
    launch(), in_->copy_rows(dst, src, row_bytes, n);
  }
  void accumulate_scores(const ScoreRows& a) override { launch(), in_->accumulate_scores(a); }
  void pick_evictions(const EvictionPick* picks, int64_t n, int32_t* out) override {
    launch(), in_->pick_evictions(picks, n, out);
  }
  void put_rows(void* const* dst, const void* src, int64_t row_bytes, int64_t n) override {
    launch(), in_->put_rows(dst, src, row_bytes, n);
  }
  void pool_scores(const ScorePool* items, int64_t n, int kernel, bool max) override {
    launch(), in_->pool_scores(items, n, kernel, max);
  }
  // Host arrays: policy work done on the host.
  void gumbel_noise(uint64_t stream, const int32_t* pos, int64_t n, double* out) override {
    c_.add({.host_policy_elems = n}), in_->gumbel_noise(stream, pos, n, out);
  }
  int32_t logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, int32_t* out) override {
    c_.add({.host_policy_elems = int64_t(G) * n});
    return in_->logit_top_k(logits, G, ld, n, K, out);
  }

 private:
  void launch() { c_.add({.launches = 1}), spend_microseconds(costs_.launch_us); }
  void h2d(size_t bytes) { c_.add({.copies_h2d = 1, .bytes_h2d = int64_t(bytes)}), spend_microseconds(costs_.copy_us); }
  void d2h(size_t bytes) { c_.add({.copies_d2h = 1, .bytes_d2h = int64_t(bytes)}), spend_microseconds(costs_.copy_us); }
  void sync() { c_.add({.syncs = 1}), spend_microseconds(costs_.sync_us); }

  std::unique_ptr<Backend> in_;
  DeviceCounters& c_;
  DeviceCosts costs_;
};

}  // namespace

std::unique_ptr<Backend> make_metered_backend(std::unique_ptr<Backend> inner, DeviceCounters* counters,
                                              DeviceCosts costs) {
  return std::make_unique<MeteredBackend>(std::move(inner), counters, costs);
}

}  // namespace hg
