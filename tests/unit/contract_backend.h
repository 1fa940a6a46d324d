// ContractBackend: a backend that keeps to the device-memory contract of Backend
// (engine/backend/backend.h) on the host, for tests on machines without a GPU. It says it has no
// host memory, hands out memory of its own, computes with the CPU backend, and records every op
// argument that breaks the contract: a buffer that is not its memory, or one of the documented
// host-side arguments (weights, norm weights, biases, ids, positions, the attention rows array) that
// is. Thread-safe bookkeeping: a runtime's copy and CPU-worker threads call it too.
#pragma once
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"

namespace hg::test {

class ContractBackend final : public Backend {
 public:
  ~ContractBackend() override {
    for (auto& [p, n] : mem_) std::free(const_cast<char*>(p));
  }
  std::string_view name() const override { return "contract"; }
  bool host_memory() const override { return false; }
  void* alloc(size_t bytes) override {
    char* p = static_cast<char*>(std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64));
    std::lock_guard<std::mutex> l(mu_);
    mem_[p] = std::max<size_t>(bytes, 1);
    return p;
  }
  void free(void* p) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!mem_.erase(static_cast<const char*>(p)))
        violations_.push_back("free of memory this backend did not allocate");
    }
    std::free(p);
  }
  // Host memory it reads by DMA in gather_rows: alloc_host's and register_host's.
  void* alloc_host(size_t bytes) override {
    void* p = Backend::alloc(bytes);
    std::lock_guard<std::mutex> l(mu_);
    mapped_[static_cast<const char*>(p)] = std::max<size_t>(bytes, 1);
    return p;
  }
  void free_host(void* p) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      mapped_.erase(static_cast<const char*>(p));
    }
    Backend::free(p);
  }
  void register_host(void* p, size_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    mapped_[static_cast<const char*>(p)] = std::max<size_t>(bytes, 1);
  }
  void unregister_host(void* p) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!mapped_.erase(static_cast<const char*>(p))) violations_.push_back("unregister of memory never registered");
  }
  void upload(void* dst, const void* src, size_t n) override {
    dev(dst, n, "upload dst"), host(src, "upload src");
    std::memcpy(dst, src, n);
  }
  void download(void* dst, const void* src, size_t n) override {
    host(dst, "download dst"), dev(src, n, "download src");
    std::memcpy(dst, src, n);
  }
  void copy(void* dst, const void* src, size_t n) override {
    count("copy");
    dev(dst, n, "copy dst"), dev(src, n, "copy src");
    std::memmove(dst, src, n);
  }
  void matmul(const float* x, int64_t M, const Weight& w, const float* bias, float* y) override {
    count("matmul");
    dev(x, M * w.cols() * 4, "matmul x"), host(w.buf.data(), "matmul weight"), host(bias, "matmul bias");
    dev(y, M * w.rows() * 4, "matmul y");
    cpu_->matmul(x, M, w, bias, y);
  }
  void rms_norm(const float* x, const float* w, int64_t M, int64_t n, float eps, float* y) override {
    count("rms_norm");
    dev(x, M * n * 4, "rms_norm x"), host(w, "rms_norm w"), dev(y, M * n * 4, "rms_norm y");
    cpu_->rms_norm(x, w, M, n, eps, y);
  }
  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t n, float eps,
                  float* y) override {
    count("layer_norm");
    dev(x, M * n * 4, "layer_norm x"), host(w, "layer_norm w"), host(b, "layer_norm b"),
        dev(y, M * n * 4, "layer_norm y");
    cpu_->layer_norm(x, w, b, M, n, eps, y);
  }
  void rope(float* x, int64_t M, int n_heads, int D, const int32_t* pos, const RopeTable& t) override {
    count("rope");
    dev(x, M * n_heads * D * 4, "rope x"), host(pos, "rope pos");
    cpu_->rope(x, M, n_heads, D, pos, t);
  }
  void swiglu(const float* gate, const float* up, int64_t n, float* y) override {
    count("swiglu");
    dev(gate, n * 4, "swiglu gate"), dev(up, n * 4, "swiglu up"), dev(y, n * 4, "swiglu y");
    cpu_->swiglu(gate, up, n, y);
  }
  void relu(float* x, int64_t n) override {
    count("relu");
    dev(x, n * 4, "relu x");
    cpu_->relu(x, n);
  }
  void add(float* y, const float* x, int64_t n) override {
    count("add");
    dev(y, n * 4, "add y"), dev(x, n * 4, "add x");
    cpu_->add(y, x, n);
  }
  void embed(const Weight& table, const int32_t* ids, int64_t M, float* y) override {
    count("embed");
    host(table.buf.data(), "embed table"), host(ids, "embed ids"), dev(y, M * table.cols() * 4, "embed y");
    cpu_->embed(table, ids, M, y);
  }
  void attention(const AttentionArgs& a) override {
    count("attention");
    dev(a.q, int64_t(a.n_rows) * a.H * a.D * 4, "attention q"),
        dev(a.out, int64_t(a.n_rows) * a.H * a.D * 4, "attention out");
    host(a.rows, "attention rows array");
    for (int r = 0; r < a.n_rows; ++r) dev(a.rows[r].k, 1, "attention k"), dev(a.rows[r].v, 1, "attention v");
    const int64_t taps = int64_t(a.n_rows) * a.H * a.tap_ld * 4;
    if (a.logits_out) dev(a.logits_out, taps, "attention logits tap");
    if (a.probs_out) dev(a.probs_out, taps, "attention probs tap");
    cpu_->attention(a);
  }
  void group_logits(const float* q, int G, const void* K, int64_t n, int D, float scale, float* logits,
                    DType kt) override {
    dev(q, 4, "group_logits q"), dev(K, 2, "group_logits K"), dev(logits, 4, "group_logits out");
    cpu_->group_logits(q, G, K, n, D, scale, logits, kt);
  }
  void heads_logits(const float* q, int H, int H_kv, const void* K, int64_t k_ld, int64_t n, int D, float scale,
                    float* logits, DType kt) override {
    dev(q, 4, "heads_logits q"), dev(K, 2, "heads_logits K"), dev(logits, 4, "heads_logits out");
    cpu_->heads_logits(q, H, H_kv, K, k_ld, n, D, scale, logits, kt);
  }
  void softmax_rows(float* x, int64_t rows, int64_t n) override {
    dev(x, rows * n * 4, "softmax x");
    cpu_->softmax_rows(x, rows, n);
  }
  void group_weighted_v(const float* p, int G, const void* V, int64_t n, int D, float* out, DType vt) override {
    dev(p, 4, "weighted_v p"), dev(V, 2, "weighted_v V"), dev(out, 4, "weighted_v out");
    cpu_->group_weighted_v(p, G, V, n, D, out, vt);
  }
  void convert_to_f32(const void* src, DType st, int64_t n, float* dst) override {
    dev(src, n * int64_t(dtype_size(st)), "convert_to_f32 src"), dev(dst, n * 4, "convert_to_f32 dst");
    cpu_->convert_to_f32(src, st, n, dst);
  }
  void write_kv(const float* src, int64_t n, int H_kv, int D, const int32_t* pos, void* dst,
                int64_t head_stride, DType dt) override {
    dev(src, n * H_kv * D * 4, "write_kv src"), host(pos, "write_kv pos"), dev(dst, 1, "write_kv dst");
    write_kv_host(src, n, H_kv, D, pos, dst, head_stride, dt);
  }

  void upload_2d(void* dst, size_t dp, const void* src, size_t sp, size_t width, size_t rows) override {
    if (rows) dev(dst, int64_t(dp * (rows - 1) + width), "upload_2d dst"), host(src, "upload_2d src");
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dp, static_cast<const char*>(src) + r * sp, width);
  }
  void download_2d(void* dst, size_t dp, const void* src, size_t sp, size_t width, size_t rows) override {
    if (rows) host(dst, "download_2d dst"), dev(src, int64_t(sp * (rows - 1) + width), "download_2d src");
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dp, static_cast<const char*>(src) + r * sp, width);
  }
  void merged_attention(const MergedAttention& a) override {
    dev(a.q, int64_t(a.H) * a.D * 4, "merged q"), dev(a.out, int64_t(a.H) * a.D * 4, "merged out");
    const int64_t es = int64_t(dtype_size(a.kv_dtype));
    if (a.na)
      dev(a.la, int64_t(a.H) * a.na * 4, "merged la"),
          dev(a.Va, int64_t(a.H_kv) * a.na * a.D * es, "merged Va");
    dev(a.Kb, int64_t(a.H_kv) * a.ld_b * a.D * es, "merged Kb"),
        dev(a.Vb, int64_t(a.H_kv) * a.ld_b * a.D * es, "merged Vb");
    if (a.lb) dev(a.lb, int64_t(a.H) * a.nb * 4, "merged lb");
    cpu_->merged_attention(a);
  }

  float max_value(const float* x, int64_t n) override {
    if (n) dev(x, n * 4, "max_value x");
    return cpu_->max_value(x, n);
  }
  float exp_shift_sum(float* x, int64_t n, float shift) override {
    if (n) dev(x, n * 4, "exp_shift_sum x");
    return cpu_->exp_shift_sum(x, n, shift);
  }
  void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx,
                   int64_t n) override {
    if (n) {
      dev(dst, n * row_bytes, "gather_rows dst"), host(idx, "gather_rows idx");
      if (!owned(src, 1) && !within(mapped_, src, 1)) violate("gather_rows src is neither this backend's memory nor mapped host memory");
    }
    cpu_->gather_rows(dst, src, row_bytes, src_stride, idx, n);
    const bool from_host = !owned(src, 1);
    std::lock_guard<std::mutex> l(mu_);
    gathered_ += n * row_bytes;
    if (from_host) gathered_from_host_ += n * row_bytes;
  }
  void copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n) override {
    host(dst, "copy_rows dst list"), host(src, "copy_rows src list");
    int64_t from_host = 0;
    for (int64_t i = 0; i < n; ++i) {
      dev(dst[i], row_bytes, "copy_rows dst row");
      if (!owned(src[i], 1) && !within(mapped_, src[i], 1))
        violate("copy_rows src row is neither this backend's memory nor mapped host memory");
      from_host += owned(src[i], 1) ? 0 : row_bytes;
    }
    cpu_->copy_rows(dst, src, row_bytes, n);
    std::lock_guard<std::mutex> l(mu_);
    gathered_ += n * row_bytes;
    gathered_from_host_ += from_host;
  }
  void accumulate_scores(const ScoreRows& a) override {
    count("accumulate_scores");
    host(a.rows, "accumulate_scores rows");
    for (int64_t i = 0; i < a.n_rows; ++i) {
      const ScoreRows::Row& r = a.rows[i];
      dev(a.taps + i * a.H * a.tap_ld, int64_t(a.H) * a.tap_ld * 4, "accumulate_scores taps");
      if (r.n > 0) dev(r.slots, (int64_t(a.H_kv - 1) * r.slot_ld + r.n) * int64_t(sizeof(ScoreSlot)), "accumulate_scores slots");
    }
    cpu_->accumulate_scores(a);
  }
  void pick_evictions(const EvictionPick* picks, int64_t n, int32_t* out) override {
    count("pick_evictions");
    host(picks, "pick_evictions picks");
    for (int64_t k = 0; k < n; ++k) {
      dev(picks[k].slots, picks[k].n * int64_t(sizeof(ScoreSlot)), "pick_evictions slots");
      dev(out + picks[k].at, picks[k].count * 4, "pick_evictions out");
    }
    cpu_->pick_evictions(picks, n, out);
  }
  void pool_scores(const ScorePool* items, int64_t n, int kernel, bool max) override {
    count("pool_scores");
    host(items, "pool_scores items");
    for (int64_t i = 0; i < n; ++i)
      if (items[i].n > 0) dev(items[i].slots, items[i].n * int64_t(sizeof(ScoreSlot)), "pool_scores slots");
    cpu_->pool_scores(items, n, kernel, max);
  }
  void put_rows(void* const* dst, const void* src, int64_t row_bytes, int64_t n) override {
    host(dst, "put_rows dst list"), host(src, "put_rows src");
    for (int64_t i = 0; i < n; ++i) dev(dst[i], row_bytes, "put_rows dst row");
    cpu_->put_rows(dst, src, row_bytes, n);
  }
  // Bytes gathered in all, and those read from mapped host memory (DMA from dram or far).
  int64_t gathered_bytes() const {
    std::lock_guard<std::mutex> l(mu_);
    return gathered_;
  }
  int64_t gathered_from_host_bytes() const {
    std::lock_guard<std::mutex> l(mu_);
    return gathered_from_host_;
  }

  // Calls of each model op and attention (the kernels Decoder::forward launches).
  std::map<std::string, int64_t> calls() const {
    std::lock_guard<std::mutex> l(mu_);
    return calls_;
  }

  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> l(mu_);
    return violations_;
  }

 private:
  // Inside one allocation of this backend (the whole [p, p + n)).
  bool owned(const void* p, int64_t n) const { return within(mem_, p, n); }
  bool within(const std::map<const char*, size_t>& m, const void* p, int64_t n) const {
    std::lock_guard<std::mutex> l(mu_);
    const char* c = static_cast<const char*>(p);
    auto it = m.upper_bound(c);
    if (it == m.begin()) return false;
    --it;
    return c >= it->first && c + n <= it->first + it->second;
  }
  void dev(const void* p, int64_t n, const char* what) {
    if (p && !owned(p, n)) violate(std::string(what) + " is not this backend's memory");
  }
  void host(const void* p, const char* what) {
    if (p && owned(p, 1)) violate(std::string(what) + " is backend memory, expected a host array");
  }
  void count(const char* op) {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_[op];
  }
  void violate(std::string v) {
    std::lock_guard<std::mutex> l(mu_);
    violations_.push_back(std::move(v));
  }
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  std::map<const char*, size_t> mem_, mapped_;
  int64_t gathered_ = 0, gathered_from_host_ = 0;
  std::vector<std::string> violations_;
  std::map<std::string, int64_t> calls_;
  mutable std::mutex mu_;
};

// The configurations of the strategies beyond `full` which the device tests run: FlexGen with and
// without overlap, MoE-Lightning with one and two micro-batches, H2O, Keyformer and StreamingLLM
// (both KV homes; StreamingLLM's keys re-rotated or at their positions), SnapKV (both homes),
// InfiniGen, and HybridGen
// with a 6-token ring (V pages of 4 tokens, interleaved over two tiers or all on dram), K fixed at
// k_fixed (1000: every offloaded token, so exact), post selection with the true or speculative
// query and pre selection.
inline std::vector<std::pair<std::string, std::map<std::string, std::string>>> offloading_cases(
    const std::string& k_fixed) {
  auto hg = [&](std::map<std::string, std::string> extra) {
    std::map<std::string, std::string> p = {{"gpu_kv_tokens", "6"}, {"k", "fixed"},   {"k_fixed", k_fixed},
                                            {"placement", "interleave"}, {"page_tokens", "4"}};
    for (auto& [k, v] : extra) p[k] = v;
    return std::make_pair(std::string("hybridgen"), p);
  };
  return {{"flexgen", {{"overlap", "true"}}},
          {"flexgen", {{"overlap", "false"}}},
          {"moe_lightning", {{"micro_batches", "1"}}},
          {"moe_lightning", {{"micro_batches", "2"}}},
          hg({{"mode", "post"}, {"speculative_query", "false"}}),
          hg({{"mode", "post"}, {"speculative_query", "true"}}),
          hg({{"mode", "pre"}, {"speculative_query", "true"}}),
          hg({{"mode", "post"}, {"speculative_query", "true"}, {"query_on", "accelerator"}}),
          hg({{"mode", "post"}, {"placement", "dram-only"}}),
          // The eviction strategies with their KV in dram (sent every step) or on the accelerator,
          // budgets small enough to evict during the run.
          {"h2o", {{"heavy_tokens", "2"}, {"recent_tokens", "2"}, {"kv_home", "dram"}}},
          {"h2o", {{"heavy_tokens", "2"}, {"recent_tokens", "2"}, {"kv_home", "gpu"}}},
          {"keyformer", {{"kv_tokens", "4"}, {"kv_home", "dram"}}},
          {"keyformer", {{"kv_tokens", "4"}, {"kv_home", "gpu"}}},
          {"streamingllm", {{"sinks", "1"}, {"window", "3"}, {"positions", "cache"}, {"kv_home", "dram"}}},
          {"streamingllm", {{"sinks", "1"}, {"window", "3"}, {"positions", "cache"}, {"kv_home", "gpu"}}},
          {"streamingllm", {{"sinks", "1"}, {"window", "3"}, {"positions", "original"}, {"kv_home", "gpu"}}},
          {"snapkv", {{"window", "2"}, {"kv_tokens", "6"}, {"kv_home", "dram"}}},
          {"snapkv", {{"window", "2"}, {"kv_tokens", "6"}, {"kv_home", "gpu"}}},
          // InfiniGen speculating from layer 1: every token fetched when k_fixed is 1000 (exact),
          // else its alpha rule and cap.
          {"infinigen", k_fixed == "1000" ? std::map<std::string, std::string>{{"full_layers", "1"}, {"alpha", "1000"},
                                                                               {"max_kv_ratio", "1"}}
                                          : std::map<std::string, std::string>{{"full_layers", "1"}}}};
}

// "name k=v k=v …": a case's label in failure messages.
inline std::string case_label(const std::string& name, const std::map<std::string, std::string>& params) {
  std::string what = name;
  for (auto& [k, v] : params) what += " " + k + "=" + v;
  return what;
}

}  // namespace hg::test
