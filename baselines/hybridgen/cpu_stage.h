// HybridGen's CPU stage: for a layer's decode rows, one CPU task that takes the rows' queries (or
// projects the speculative ones), computes the logits of each row's offloaded keys, selects K per
// KV head (`post`: top-K of every offloaded key's group-max logit; `pre`: sinks and most recent
// first, logits only for those), and sends the selected logits and V rows to the accelerator. It
// sums its measured (or, with a stage clock, modeled) times for the scheduler.
#pragma once
#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "baselines/common.h"
#include "baselines/hybridgen/residency.h"

namespace hg {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What the CPU stage hands the accelerator for one (layer, sequence).
// Per head, the selected positions are in position order, and so are their logits and V rows:
// the value sum adds them in the oracle's order whatever tiers their pages lie on. Each tier's rows
// reach res.v in one copy_rows per layer and tier.
struct CpuResult {
  int32_t k = 0;                               // tokens selected per KV head
  std::vector<std::vector<int32_t>> sel;       // [H_kv] positions, increasing
  std::vector<std::array<int32_t, 2>> n_tier;  // [H_kv] selected positions on dram, on far
  float* logits = nullptr;                     // gpu tier: [H_kv][G][k] (the layer parity's buffer)
  char* v = nullptr;                           // gpu tier: [H_kv][k][D] of kv_dtype
  Event done;                                  // CPU compute and both transfers finished
  std::vector<Event> arrived;                  // the transfers of logits and V rows (set before done)
};

class CpuStage {
 public:
  CpuStage(Backend& be, Runtime& rt, const Model* model, const KvElement& kv, int32_t sinks,
           ResidentRing& ring)
      : be_(be), rt_(rt), model_(model), kv_(kv), sinks_(sinks), ring_(ring) {}
  void reset(const KvShape& shape, int batch);

  // A row of a layer's stage: its token, K, and the result its attention waits for.
  struct Row {
    TokenRow r;
    int32_t K = 0;
    std::shared_ptr<CpuResult> res;
  };
  using Queries = std::shared_ptr<std::vector<float>>;
  // The result (layer, seq) fills this step, reused between steps (its vectors keep their
  // capacity): its last reader, the layer's attention of the step before, finished before the
  // next stage for it is submitted.
  std::shared_ptr<CpuResult> fresh_result(int layer, int seq);
  // One CPU task for all of a layer's rows, after `sent`: query() gives the host queries (row j's
  // at j·H·D; it runs the batched speculative projection when there is one, `project` rows of
  // it), then each row's logits and selection, then one transfer of every row's logits and one
  // gather of their V rows per tier. Every row's result shares the task's events.
  void submit(int layer, const std::string& what, std::vector<Row> rows, bool pre, int64_t project,
              Event sent, std::function<Queries()> query);

  // The speculative query of `layer` for M rows of the previous layer's input x: this layer's
  // norm, W_q (+ bias) and RoPE at each row's position, on `b` (the CPU backend, or the
  // accelerator's); h is [M, d_model] scratch, q [M, H·D], both in b's memory.
  void project_query(Backend& b, int layer, const float* x, int64_t M, const int32_t* pos, float* h,
                     float* q) const;
  // The projection's work for the modeled clock: W_q read once from the memory it runs next to
  // (host DRAM for the CPU stage, the gpu tier on the accelerator), 2·rows·cols FLOPs per row.
  StageWork query_work(int layer, int64_t M, Tier where = Tier::kGpu) const;

  // Seconds summed since the last take(): the stages' compute (cpu) and transfers (tx), the
  // speculative projections (query: part of cpu, or of the accelerator's stage with
  // query_on=accelerator), and the part of cpu that does not scale with the tokens scored (fixed).
  struct Times {
    double cpu = 0, tx = 0, query = 0, fixed = 0;
  };
  Times take_times();
  void add_query_seconds(double query, double fixed);

 private:
  // The stage's work for the modeled clock: logits of all H query heads over the keys it reads
  // from DRAM. Post: every offloaded key, streamed, then the K selected keys once more (their
  // logits, recomputed after the selection; rows the same stage has just streamed, so no row cost).
  // Pre: the K keys of the position heuristic, two runs (sinks, most recent) per KV head. A stage
  // that projects its own speculative query (`query_on: cpu`) also reads W_q from host memory
  // (most of the stage on an H200 host: docs/performance.md, "Known GPU limits").
  // Keys are charged to the tier that holds them: post streams each tier's offloaded keys and reads
  // its share of the K selected again; pre reads the heuristic's runs, one gathered row per run of
  // consecutive rows of one tier and KV head.
  // project: rows of the layer's batched speculative query this stage is charged (0: none).
  StageWork work(int layer, const TokenRow& r, int32_t K, bool pre, int64_t project) const;
  // Pre mode's selection of K of n_off offloaded positions: sinks [0, s) and the most recent
  // [r0, n_off), as StreamingLLM keeps them.
  std::pair<int32_t, int32_t> pre_runs(int32_t K, int32_t n_off) const;
  // Row r's logits over its offloaded keys and its selection: res.k, res.sel, res.n_tier and the
  // result buffers; the selected logits in lg_sel ([H_kv][G][K], for the transfer).
  void select(int layer, const TokenRow& r, const float* q, int32_t K, bool pre, CpuResult& res,
              std::vector<float>& lg_sel);
  // The transfers of a layer stage's results to the gpu tier; returns when they arrived.
  std::vector<Event> send_results(int layer, const std::vector<Row>& rows,
                                  std::vector<std::vector<float>> lg);
  // The result buffers of `layer`'s stage: one pair per layer parity and sequence on the gpu tier
  // (the stage for layer l+1 fills its pair while the accelerator reads layer l's), grown to K
  // tokens as needed. Safe to overwrite: the pair's last reader, layer l−1's merged attention,
  // finished before this stage was submitted.
  void result_buffers(int layer, int seq, int32_t K, CpuResult& res);
  // f(b, e) for each maximal run sel[b, e) of selected positions whose V pages lie on tier t.
  template <typename F>
  void tier_segments(int layer, int seq, const std::vector<int32_t>& sel, Tier t, F&& f) const {
    ValueTierCursor vtier(ring_, layer, seq);  // sel is in increasing order
    for (int32_t b = 0, n = int32_t(sel.size()); b < n;) {
      int32_t e = b;
      while (e < n && vtier.at(sel[size_t(e)]) == t) ++e;
      if (e > b)
        f(b, e), b = e;
      else
        ++b;
    }
  }
  // A transfer's time for the scheduler: measured, or modeled on the runtime's stage clock.
  double transfer_seconds(Tier src, int64_t bytes, int64_t rows, double measured_s) const;
  void add_tx(double s);

  Backend& be_;
  Runtime& rt_;
  const Model* model_;
  const KvElement& kv_;
  int32_t sinks_;
  ResidentRing& ring_;
  KvShape shape_;
  int B_ = 0;
  std::vector<std::shared_ptr<CpuResult>> results_;  // per (layer, seq)
  struct ResultPool {
    Allocation logits, v;
  };
  std::vector<ResultPool> pool_;  // per layer parity and sequence (result_buffers)
  std::mutex pool_mu_;
  std::mutex mu_;  // times_
  Times times_;
};

}  // namespace hg
