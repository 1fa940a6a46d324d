// `hybridgen` — the method under study (arXiv 2604.18529) on the engine's runtime. The accelerator
// keeps each sequence's newest `gpu_kv_tokens` in a ring; older K and V live in a PagedKvStore on
// dram/far. While layer i runs, a CPU stage projects layer i+1's speculative query, scores the
// offloaded keys and selects K per KV head (`pre` or `post`); the accelerator merges those logits
// with its resident ones in one softmax and aggregates V; the feedback scheduler (scheduler.h,
// Algorithm 1) sets K and the mode from measured stage times. Parts: hybridgen.cpp (set-up, merge,
// end of step), residency.cpp (ring, offload, prefill), cpu_stage.cpp (the CPU stage and its
// transfers). The whole step, with each choice, is in docs/strategies.md, "HybridGen's step".
#pragma once
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <atomic>
#include <string>
#include <vector>

#include "baselines/common.h"
#include "engine/kv/paged_kv_store.h"
#include "baselines/hybridgen/scheduler.h"
#include "baselines/speculation.h"
#include "engine/kv/kv_store.h"
#include "engine/kv/placement.h"
#include "selectors/logit_topk.h"
#include "selectors/sinks_recent.h"

namespace hg {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What the CPU stage hands the accelerator for one (layer, sequence).
// Per head, the selected positions are in tier order (the dram tier's, then the far tier's, each
// sorted), so that each tier's V rows form one block per head; logits follow the same order. The
// merged softmax and the value sum do not depend on the order.
struct CpuResult {
  int32_t k = 0;                               // tokens selected per KV head
  std::vector<std::vector<int32_t>> sel;       // [H_kv] positions in tier order
  std::vector<std::array<int32_t, 2>> n_tier;  // [H_kv] selected positions on dram, on far
  float* logits = nullptr;                     // gpu tier: [H_kv][G][k] (the layer parity's buffer)
  char* v = nullptr;                           // gpu tier: [H_kv][k][D] of kv_dtype
  Event done;                                  // CPU compute and both transfers finished
  std::vector<Event> arrived;                  // the transfers of logits and V rows (set before done)
};

class HybridGen final : public KvStrategy {
 public:
  HybridGen(const StrategyContext& ctx, const StrategyParams& p);
  std::string_view name() const override { return "hybridgen"; }
  // Prefill: every visible key. Decode: the resident ring and the K selected offloaded tokens
  // (their logits come from the CPU; their V rows are read on the accelerator).
  int64_t accel_attention_keys(const TokenRow& r) const override {
    if (r.pos < prompt_[size_t(r.seq)]) return int64_t(r.pos) + 1;
    const int64_t resident = std::min<int64_t>(r.pos + 1, int64_t(resident_tokens_) + 1);
    return resident + std::min<int64_t>(k_for(r), std::max<int64_t>(0, r.pos + 1 - resident));
  }

  // Decode: the resident ring on the accelerator, the K selected offloaded tokens by CPU logits.
  AttendedKeys attended_keys(const TokenRow& r) const override {
    const int64_t all = accel_attention_keys(r);
    if (r.pos < prompt_[size_t(r.seq)]) return {all, 0};
    const int64_t resident = std::min<int64_t>(r.pos + 1, int64_t(resident_tokens_) + 1);
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

  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override;

  void prepare(int layer, std::span<const TokenRow> rows, const float* x) override;

  // Queues the speculative stage of `layer` that prepare() held back, if any.
  void submit_deferred(int layer);

  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override;

  void end_step() override;

  // The ring and the offloaded keys and values; the scheduler is the batch's.
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override;

  std::map<std::string, double> step_stats() const override { return last_; }

 private:
  size_t pidx(int layer, int seq) const { return size_t(layer) * size_t(B_) + size_t(seq); }
  // K for row r: the scheduler's (one for the batch), raised to r's own K_min where the batch's
  // contexts differ (the scheduler's K_min is its shortest context's).
  int64_t k_for(const TokenRow& r) const { return std::max<int64_t>(sched_.k(), k_min_for(r.pos)); }
  int32_t current_k(const TokenRow& r) const {
    return int32_t(std::min<int64_t>(k_for(r), offloaded_[pidx(0, r.seq)]));
  }
  char* vrow(int layer, int seq, int g, int32_t pos) { return offloaded_kv_.value(layer, seq, g, pos); }
  // Byte address of element `elems` of a KV array of kv_dtype.
  template <class P>
  auto at(P* p, int64_t elems) const {
    using C = std::conditional_t<std::is_const_v<P>, const char, char>;
    return reinterpret_cast<C*>(p) + kv_.bytes(elems);
  }
  Tier vtier(int layer, int seq, int32_t pos) const { return offloaded_kv_.value_tier(layer, seq, pos); }

  // Moves (seq, pos) tokens from the ring to the CPU side: K → dram, V → its page's tier.
  void offload(int layer, const std::vector<std::pair<int, int32_t>>& leaving, std::span<const TokenRow> rows,
               const float* k, const float* v);

  // Prefill rows: exact attention on the accelerator over [0, pos]; offloaded prompt KV is
  // copied back from the CPU side for it.
  void attend_exact(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& idx,
                    const float* q, float scale, float* out);

  // The speculative query of `layer` for M rows of the previous layer's input x: this layer's
  // norm, W_q (+ bias) and RoPE at each row's position, on `b` (the CPU backend, or the
  // accelerator's); h is [M, d_model] scratch, q [M, H·D], both in b's memory.
  void project_query(Backend& b, int layer, const float* x, int64_t M, const int32_t* pos, float* h,
                     float* q);

  // The projection's work for the modeled clock: W_q read once from the memory it runs next to
  // (host DRAM for the CPU stage, the gpu tier on the accelerator), 2·rows·cols FLOPs per row.
  StageWork query_work(int layer, int64_t M, Tier where = Tier::kGpu) const;

  // Logits of offloaded keys, selection, and the transfers of logits and V rows to the accelerator.
  // The CPU stage's work for the modeled clock: logits of all H query heads over the keys it reads
  // from DRAM. Post: every offloaded key, streamed, then the K selected keys once more (their
  // logits, recomputed after the selection; rows the same stage has just streamed, so no row cost).
  // Pre: the K keys of the position heuristic, two runs (sinks, most recent) per KV head. A stage
  // that projects its own speculative query (`query_on: cpu`) also reads W_q from host memory
  // (most of the stage on an H200 host: docs/performance.md, "Known GPU limits").
  // Keys are charged to the tier that holds them: post streams each tier's offloaded keys and reads
  // its share of the K selected again; pre reads the heuristic's runs, one gathered row per run of
  // consecutive rows of one tier and KV head.
  // project: rows of the layer's batched speculative query this stage is charged (0: none).
  StageWork cpu_stage_work(int layer, const TokenRow& r, int32_t K, bool pre, int64_t project) const;
  // Pre mode's selection of K of n_off offloaded positions: sinks [0, s) and the most recent
  // [r0, n_off), as StreamingLLM keeps them.
  std::pair<int32_t, int32_t> pre_runs(int32_t K, int32_t n_off) const;

  // A row of a layer's CPU stage: its token, K, and the result its attention waits for.
  struct StageRow {
    TokenRow r;
    int32_t K = 0;
    std::shared_ptr<CpuResult> res;
  };
  using Queries = std::shared_ptr<std::vector<float>>;
  // One CPU task for all of a layer's rows, after `sent`: query() gives the host queries (row j's
  // at j·H·D; it runs the batched speculative projection when there is one, `project` rows of
  // it), then each row's logits and selection, then one transfer of every row's logits and one
  // gather of their V rows per tier. Every row's result shares the task's events.
  void submit_cpu_stage(int layer, const std::string& what, std::vector<StageRow> rows, bool pre, int64_t project,
                        Event sent, std::function<Queries()> query);
  // Row r's logits over its offloaded keys and its selection: res.k, res.sel, res.n_tier and the
  // result buffers; the selected logits in lg_sel ([H_kv][G][K], for the transfer).
  void cpu_select(int layer, const TokenRow& r, const float* q, int32_t K, bool pre, CpuResult& res,
                  std::vector<float>& lg_sel);
  // The transfers of a layer stage's results to the gpu tier; returns when they arrived.
  std::vector<Event> send_results(int layer, const std::vector<StageRow>& rows, std::vector<std::vector<float>> lg);

  // The result buffers of `layer`'s CPU stage: one pair per layer parity and sequence on the gpu tier (the
  // stage for layer l+1 fills its pair while the accelerator reads layer l's), grown to K tokens as needed.
  // Safe to overwrite: the pair's last reader, layer l−1's merged attention, finished before this stage was
  // submitted (see prepare() and attend_hybrid()).
  void result_buffers(int layer, int seq, int32_t K, CpuResult& res);

  // A transfer's time for the scheduler: measured, or modeled on the runtime's stage clock.
  double transfer_seconds(Tier src, int64_t bytes, int64_t rows, double measured_s) const;

  void add_tx(double s);

  // Decode rows: the CPU stage with the true query for rows no speculation covered, the resident
  // logits of every row, one wait for the layer's CPU stage, then each row's merged attention.
  void attend_decode(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& idx, const float* q,
                     float scale, float* out);

  Backend& be_;
  Runtime& rt_;
  const Model* model_;
  int32_t resident_tokens_;  // the newest tokens kept on the accelerator between steps (this run's)
  int32_t gpu_kv_tokens_;    // the parameter; the accelerator's KV budget may lower it (begin)
  int32_t page_;             // page_tokens
  bool speculative_;
  bool query_on_accel_;  // query_on: accelerator
  int32_t sinks_;
  std::unique_ptr<PlacementPolicy> placement_;
  int64_t dram_kv_bytes_;
  SchedulerConfig sched_cfg_;
  FeedbackScheduler sched_;
  KvShape shape_;
  int B_ = 0;
  std::vector<int32_t> prompt_, cap_;
  KvStore ring_;
  PagedKvStore offloaded_kv_;
  std::vector<std::shared_ptr<CpuResult>> pending_;
  // Per (layer, seq): the result its CPU stage fills each step, reused (its vectors keep their
  // capacity). Its last reader, the layer's attention of the step before, finished before the next
  // stage for it is submitted.
  std::vector<std::shared_ptr<CpuResult>> results_;
  std::shared_ptr<CpuResult> fresh_result(int layer, int seq) {
    auto& r = results_[pidx(layer, seq)];
    if (!r) r = std::make_shared<CpuResult>();
    r->done = Event{};
    r->arrived.clear();
    return r;
  }
  std::vector<std::function<void()>> deferred_;  // per layer: a speculative stage held back by prepare()
  struct ResultPool {
    Allocation logits, v;
  };
  std::vector<ResultPool> pool_;  // per layer parity and sequence (result_buffers)
  std::mutex pool_mu_;
  std::vector<int32_t> slots_;                  // append() scratch: ring slots of a run of rows
  const float* new_k_ = nullptr;                // this layer's appended rows (the decoder's, valid until attend)
  const float* new_v_ = nullptr;
  BackendArray<float> resident_logits_;         // attend_decode(): [rows][H][ring slots], accelerator memory
  BackendArray<float> spec_x_, spec_h_;         // prepare() with query_on=accelerator: its scratch
  std::array<BackendArray<float>, 2> spec_in_;  // prepare(): the CPU stages' inputs per layer parity
  std::vector<int32_t> offloaded_, last_pos_;   // per (layer, seq): tokens on the CPU side; newest position
  int32_t seen_pos_max_ = 0;
  double k_min_ratio_ = 0;  // > 0: k_min is this fraction of the current context
  double budget_ = 0;       // > 0: resident + k_min is this fraction of the current context
  KvElement kv_;
  // K_min for a context of `context` tokens from kv_ratio or the shared budget (0 without them: k_min in
  // tokens is the scheduler's alone).
  int64_t k_min_for(int64_t context) const;
  void set_k_min_for(int64_t context) { sched_.set_k_min(k_min_for(context)); }
  bool in_step_ = false;
  Clock::time_point step_start_;
  std::mutex mu_;
  double t_fixed_ = 0;  // the CPU stages' query projections this step (inside t_cpu_)
  double t_cpu_ = 0, t_tx_ = 0, t_query_ = 0,
         waited_ = 0;  // t_query_: the speculative queries' projections (part of t_cpu_, or with
                       // query_on=accelerator of the accelerator's stage)
  std::map<std::string, double> last_;
};

}  // namespace hg
