// `hybridgen` — the method under study (arXiv 2604.18529) on the engine's runtime, composed of
// three parts: a ResidentRing (residency.h: each sequence's newest `gpu_kv_tokens` on the
// accelerator, older K and V in a PagedKvStore on dram/far), a CpuStage (cpu_stage.h: while layer
// i runs, layer i+1's speculative query, logits of the offloaded keys, selection of K per KV head,
// `pre` or `post`) and the FeedbackScheduler (scheduler.h, Algorithm 1: K and the mode from
// measured stage times). This class sequences them per layer and merges: the accelerator's
// resident logits and the CPU's in one softmax, then the value sums. The whole step, with each
// choice, is in docs/strategies.md, "HybridGen's step".
#pragma once
#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "baselines/common.h"
#include "baselines/hybridgen/cpu_stage.h"
#include "baselines/hybridgen/residency.h"
#include "baselines/hybridgen/scheduler.h"
#include "engine/kv/placement.h"

namespace hg {

class HybridGen final : public KvStrategy {
 public:
  HybridGen(const StrategyContext& ctx, const StrategyParams& p);
  std::string_view name() const override { return "hybridgen"; }
  // Prefill: every visible key. Decode: the resident ring and the K selected offloaded tokens
  // (their logits come from the CPU; their V rows are read on the accelerator).
  int64_t accel_attention_keys(const TokenRow& r) const override {
    if (r.pos < prompt_[size_t(r.seq)]) return int64_t(r.pos) + 1;
    const int64_t resident = std::min<int64_t>(r.pos + 1, int64_t(ring_.resident_tokens()) + 1);
    return resident + std::min<int64_t>(k_for(r), std::max<int64_t>(0, r.pos + 1 - resident));
  }

  // Decode: the resident ring on the accelerator, the K selected offloaded tokens by CPU logits.
  AttendedKeys attended_keys(const TokenRow& r) const override {
    const int64_t all = accel_attention_keys(r);
    if (r.pos < prompt_[size_t(r.seq)]) return {all, 0};
    const int64_t resident = std::min<int64_t>(r.pos + 1, int64_t(ring_.resident_tokens()) + 1);
    return {resident, all - resident};
  }
  // The ring, the offloaded keys and values and the selected V rows are all of kv_dtype.
  DType kv_dtype() const override { return kv_.dtype(); }
  std::map<std::string, std::string> effective_params() const override;
  static SchedulerConfig config(const StrategyParams& p) {
    SchedulerConfig c;
    c.adaptive_k = p.get("k") == "adaptive";
    const std::string m = p.get("mode");
    c.mode = m == "post"  ? SchedulerConfig::Mode::kPost
             : m == "pre" ? SchedulerConfig::Mode::kPre
                          : SchedulerConfig::Mode::kAdaptive;
    c.k_min = p.get_int("k_min");
    c.k_max = p.get_int("k_max");
    c.k_fixed = p.get_int("k_fixed");
    c.k_growth = p.get_float("k_growth");
    if (c.k_min < 1 || c.k_max < c.k_min || c.k_fixed < 1 || !(c.k_growth > 1))
      input_error("strategy hybridgen: need 1 <= k_min <= k_max, k_fixed >= 1 and k_growth > 1");
    return c;
  }

  void begin(const KvShape& shape, std::span<const int32_t> capacity,
             std::span<const int32_t> prompt_len) override;

  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override {
    ring_.append(layer, rows, k, v);
  }

  void prepare(int layer, std::span<const TokenRow> rows, const float* x) override;

  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override;

  void end_step() override;

  // The ring and the offloaded keys and values; the scheduler is the batch's.
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override;

  std::map<std::string, double> step_stats() const override { return last_; }

 private:
  // Queues the speculative stage of `layer` that prepare() held back, if any.
  void submit_deferred(int layer);
  size_t pidx(int layer, int seq) const { return size_t(layer) * size_t(B_) + size_t(seq); }
  // K for row r: the scheduler's (one for the batch), raised to r's own K_min where the batch's
  // contexts differ (the scheduler's K_min is its shortest context's); under the shared budget
  // exactly what the ring leaves of it, so that the attended fraction is the budget (the scheduler
  // then chooses the mode). The context is the row's tokens, itself included: a budget of 1.0
  // attends every one.
  int64_t k_for(const TokenRow& r) const {
    const int64_t k_min = k_min_for(int64_t(r.pos) + 1);
    return budget_ > 0 ? k_min : std::max<int64_t>(sched_.k(), k_min);
  }
  int32_t current_k(const TokenRow& r) const {
    return int32_t(std::min<int64_t>(k_for(r), ring_.offloaded(0, r.seq)));
  }
  // Decode rows: the CPU stage with the true query for rows no speculation covered, the resident
  // logits of every row, one wait for the layer's CPU stage, then each row's merged attention.
  void attend_decode(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& idx, const float* q,
                     float scale, float* out);
  // K_min for a context of `context` tokens from kv_ratio or the shared budget (0 without them: k_min in
  // tokens is the scheduler's alone).
  int64_t k_min_for(int64_t context) const;
  // Under a budget K is what the budget leaves (the scheduler may not grow it); else K_min.
  void set_k_min_for(int64_t context) {
    budget_ > 0 ? sched_.pin_k(k_min_for(context)) : sched_.set_k_min(k_min_for(context));
  }

  Backend& be_;
  Runtime& rt_;
  const Model* model_;
  KvElement kv_;
  int32_t gpu_kv_tokens_;  // the parameter; the accelerator's KV budget may lower the ring's R (begin)
  bool ring_given_ = false;  // the request set gpu_kv_tokens: the budget only shrinks the ring
  int32_t page_;           // page_tokens
  bool speculative_;
  bool query_on_accel_;  // query_on: accelerator
  std::unique_ptr<PlacementPolicy> placement_;
  int64_t dram_kv_bytes_;
  SchedulerConfig sched_cfg_;
  FeedbackScheduler sched_;
  double k_min_ratio_ = 0;  // > 0: k_min is this fraction of the current context
  double budget_ = 0;       // > 0: resident + k_min is this fraction of the current context
  ResidentRing ring_;
  CpuStage stage_;
  KvShape shape_;
  int B_ = 0;
  std::vector<int32_t> prompt_;
  std::vector<std::shared_ptr<CpuResult>> pending_;  // per (layer, seq): a speculative stage's result
  std::vector<std::function<void()>> deferred_;      // per layer: a speculative stage held back by prepare()
  BackendArray<float> resident_logits_;         // attend_decode(): [rows][H][ring slots], accelerator memory
  BackendArray<float> spec_x_, spec_h_;         // prepare() with query_on=accelerator: its scratch
  std::array<BackendArray<float>, 2> spec_in_;  // prepare(): the CPU stages' inputs per layer parity
  int32_t seen_pos_max_ = 0;
  bool in_step_ = false;
  Clock::time_point step_start_;
  double waited_ = 0;  // this step's wait for CPU results
  std::map<std::string, double> last_;
};

}  // namespace hg
