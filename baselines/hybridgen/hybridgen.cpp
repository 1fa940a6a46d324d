// `hybridgen` — the method under study (arXiv 2604.18529), on the engine's runtime.
//
// Residency: per layer and sequence the accelerator keeps the newest `gpu_kv_tokens` (R) tokens
// between steps (a ring on the `gpu` tier with one more slot for the token being generated);
// after each step the oldest resident tokens are offloaded so that R remain. The CPU side of a
// step is therefore fixed before the step starts, and the speculative CPU stage scores exactly the
// tokens the accelerator does not hold; older ones are evicted least-recently-generated to the CPU side: K to
// `dram` (row = position), V into pages whose tier the placement policy picks (`semantic`: V to
// `far` once dram is full; `interleave`; `dram-only`). The token mapper is positional: position
// < p − R (p the current position) lives on the CPU side, the rest in ring slot position mod (R+1).
// Logit parallelism: for layer i+1, while the accelerator runs layer i, a CPU worker builds a
// query from layer i's input with layer i+1's norm, W_q (+ bias) and RoPE at the current position
// (`speculative_query: true`), or waits for the true query (`false`, exact); layer 0 always uses
// its true query. Where the speculative query is projected is `query_on`: `cpu` (the paper's
// Figure 12: the accelerator sends layer i's input, and the CPU stage reads W_q from host memory)
// or `accelerator` (it projects with its own copy of the weights and sends the query; the CPU stage
// only scores keys). It computes q·kᵀ/√d for offloaded keys, selects tokens per KV head (`post`: all
// offloaded logits, top-K by the group's max logit; `pre`: sinks + most recent offloaded, logits
// only for those), and sends their logits and V rows (read from their tier, never touched by the
// CPU otherwise) to the accelerator. The accelerator computes logits of its resident tokens with
// the true query, concatenates both sets in token order, applies one softmax and aggregates V.
// The feedback scheduler (scheduler.h) sets K and the mode after each step from the measured
// stage times. Prefill attention is exact on the accelerator (offloaded prompt KV is copied back
// for it); the paper's method concerns decode.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>

#include "baselines/common.h"
#include "baselines/speculation.h"
#include "baselines/hybridgen/offloaded_kv.h"
#include "baselines/hybridgen/scheduler.h"
#include "engine/decoder/kv_store.h"
#include "engine/runtime/placement.h"
#include "selectors/logit_topk.h"
#include "selectors/sinks_recent.h"

namespace hg {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What the CPU stage hands the accelerator for one (layer, sequence).
// Per head, the selected positions are in tier order (the dram tier's, then the far tier's, each
// sorted), so that each tier's V rows form one block per head; logits follow the same order. The
// merged softmax and the value sum do not depend on the order.
struct CpuResult {
  int32_t k = 0;                      // tokens selected per KV head
  std::vector<std::vector<int32_t>> sel;       // [H_kv] positions in tier order
  std::vector<std::array<int32_t, 2>> n_tier;  // [H_kv] selected positions on dram, on far
  float* logits = nullptr;                     // gpu tier: [H_kv][G][k] (the layer parity's buffer)
  float* v = nullptr;                          // gpu tier: [H_kv][k][D]
  Event done;                         // CPU compute and both transfers finished
};

class HybridGen final : public KvStrategy {
 public:
  HybridGen(const StrategyContext& ctx, const StrategyParams& p)
      : be_(ctx.backend),
        rt_(require_runtime(ctx, "hybridgen")),
        model_(ctx.model),
        R_(int32_t(p.get_int("gpu_kv_tokens"))),
        page_(int32_t(p.get_int("page_tokens"))),
        speculative_(p.get_bool("speculative_query")),
        query_on_accel_(p.get("query_on") == "accelerator"),
        sinks_(int32_t(p.get_int("pre_sinks"))),
        placement_(make_placement(p.get("placement"), p.get_float("interleave_dram_ratio"))),
        dram_kv_bytes_(p.get_int("dram_kv_bytes")),
        sched_cfg_(config(p)),
        sched_(sched_cfg_),
        k_min_ratio_(p.get_float("kv_ratio")) {
    if (k_min_ratio_ < 0 || k_min_ratio_ > 1) input_error("strategy hybridgen: kv_ratio must be in [0, 1]");
    if (R_ < 1 || page_ < 1) input_error("strategy hybridgen: gpu_kv_tokens and page_tokens must be >= 1");
    if (speculative_ && !model_) input_error("strategy hybridgen: speculative_query needs the model's weights");
  }
  std::string_view name() const override { return "hybridgen"; }
  // Prefill: every visible key. Decode: the resident ring and the K selected offloaded tokens
  // (their logits come from the CPU; their V rows are read on the accelerator).
  int64_t accel_attention_keys(const TokenRow& r) const override {
    if (r.pos < prompt_[size_t(r.seq)]) return int64_t(r.pos) + 1;
    const int64_t resident = std::min<int64_t>(r.pos + 1, int64_t(R_) + 1);
    return resident + std::min<int64_t>(sched_.k(), std::max<int64_t>(0, r.pos + 1 - resident));
  }

  static SchedulerConfig config(const StrategyParams& p) {
    SchedulerConfig c;
    c.adaptive_k = p.get("k") == "adaptive";
    const std::string m = p.get("mode");
    c.mode = m == "post" ? SchedulerConfig::Mode::kPost : m == "pre" ? SchedulerConfig::Mode::kPre
                                                                     : SchedulerConfig::Mode::kAdaptive;
    c.k_min = p.get_int("k_min");
    c.k_max = p.get_int("k_max");
    c.k_fixed = p.get_int("k_fixed");
    c.k_growth = p.get_float("k_growth");
    if (c.k_min < 1 || c.k_max < c.k_min || c.k_fixed < 1 || !(c.k_growth > 1))
      input_error("strategy hybridgen: need 1 <= k_min <= k_max, k_fixed >= 1 and k_growth > 1");
    return c;
  }

  void begin(const KvShape& shape, std::span<const int32_t> capacity, std::span<const int32_t> prompt_len) override {
    shape_ = shape;
    B_ = int(capacity.size());
    prompt_.assign(prompt_len.begin(), prompt_len.end());
    cap_.assign(capacity.begin(), capacity.end());
    std::vector<int32_t> ring(static_cast<size_t>(B_)), off(static_cast<size_t>(B_));
    for (int b = 0; b < B_; ++b) {
      ring[size_t(b)] = std::min(R_ + 1, cap_[size_t(b)]);
      off[size_t(b)] = std::max(1, cap_[size_t(b)] - R_);
    }
    ring_.reset(shape, ring, &rt_.memory(), Tier::kGpu);
    const int64_t dram_avail = dram_kv_bytes_ > 0 ? dram_kv_bytes_ : rt_.memory().ledger().available(Tier::kDram);
    offloaded_kv_.reset(shape, off, page_, *placement_, dram_avail, rt_.memory());
    pending_.assign(size_t(shape.n_layers) * size_t(B_), nullptr);
    deferred_.assign(pending_.size(), nullptr);
    pool_.clear();
    pool_.resize(2 * size_t(B_));
    offloaded_.assign(pending_.size(), 0);
    last_pos_.assign(pending_.size(), -1);
    sched_ = FeedbackScheduler(sched_cfg_);
    if (k_min_ratio_ > 0) {
      const int32_t p0 = prompt_len.empty() ? 1 : *std::max_element(prompt_len.begin(), prompt_len.end());
      sched_.set_k_min(int64_t(std::floor(k_min_ratio_ * p0)));
    }
    t_cpu_ = t_tx_ = t_query_ = t_fixed_ = waited_ = 0;
    seen_pos_max_ = 0;
    in_step_ = false;
    last_ = {};
  }

  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override {
    const int Hkv = shape_.H_kv, D = shape_.D;
    // Offload tokens leaving the ring (oldest first), then write the new ones into it.
    // (Only long prefill chunks overflow the ring within one call; decode steps were trimmed by
    // the previous end_step.)
    std::vector<std::pair<int, int32_t>> leaving;
    for (auto& r : rows) {
      int32_t& off = offloaded_[pidx(layer, r.seq)];
      while (r.pos - R_ - 1 >= off) leaving.emplace_back(r.seq, off++);
      last_pos_[pidx(layer, r.seq)] = std::max(last_pos_[pidx(layer, r.seq)], r.pos);
    }
    if (!leaving.empty()) offload(layer, leaving, rows, k, v);
    // New rows into their ring slots (position mod R+1), through the accelerator's write_kv: one
    // call per run of rows of one sequence. Of a run longer than the ring only the last R+1 rows
    // stay (the earlier ones were offloaded above), so no two rows of a call share a slot.
    const int64_t row = int64_t(Hkv) * D;
    for (size_t i0 = 0; i0 < rows.size();) {
      size_t i1 = i0;
      int32_t last = rows[i0].pos;
      while (i1 < rows.size() && rows[i1].seq == rows[i0].seq) last = std::max(last, rows[i1++].pos);
      for (size_t i = i0; i < i1;) {  // sub-runs of rows that stay
        while (i < i1 && rows[i].pos <= last - (R_ + 1)) ++i;
        size_t j = i;
        slots_.clear();
        while (j < i1 && rows[j].pos > last - (R_ + 1)) slots_.push_back(rows[j++].pos % (R_ + 1));
        if (j > i) {
          const int seq = rows[i].seq;
          be_.write_kv(k + int64_t(i) * row, int64_t(j - i), Hkv, D, slots_.data(), ring_.k(layer, seq),
                       ring_.head_stride(seq), DType::kF32);
          be_.write_kv(v + int64_t(i) * row, int64_t(j - i), Hkv, D, slots_.data(), ring_.v(layer, seq),
                       ring_.head_stride(seq), DType::kF32);
        }
        i = j;
      }
      i0 = i1;
    }
  }

  void prepare(int layer, std::span<const TokenRow> rows, const float* x) override {
    if (!speculative_) return;
    std::vector<size_t> need;  // decode rows with offloaded tokens only
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].pos >= prompt_[size_t(rows[i].seq)] && offloaded_[pidx(layer, rows[i].seq)] > 0)
        need.push_back(i);
    if (need.empty()) return;
    // What each CPU stage starts from: the row of x, which it projects itself, or the query the
    // accelerator projected. Gathered in this layer parity's scratch in the accelerator's memory and
    // sent to the host by the transfer engine; the CPU stages wait for that transfer, the accelerator
    // does not. On a GPU, queueing the transfer waits for the work queued so far, which also frees
    // this layer parity's result buffers (their last reader was layer − 2's attention); the scratch's
    // next writer, prepare(layer + 2), comes after layer's attention waited for these stages.
    const int64_t d = model_->hp.d_model, n = query_on_accel_ ? int64_t(shape_.H) * shape_.D : d;
    const int64_t M = int64_t(need.size());
    BackendArray<float>& in_dev = spec_in_[size_t(layer % 2)];
    if (in_dev.size() < size_t(M * n)) in_dev = BackendArray<float>(be_, size_t(M * n));
    const auto t0 = Clock::now();
    if (query_on_accel_) {
      be_.synchronize();  // the work queued so far is not the projection's (t_query_ms)
      // Scratch in the accelerator's memory, kept between calls (a cudaMalloc/cudaFree per layer
      // would cost more than the projection).
      if (spec_x_.size() < size_t(M * d)) spec_x_ = BackendArray<float>(be_, size_t(M * d));
      if (spec_h_.size() < size_t(M * d)) spec_h_ = BackendArray<float>(be_, size_t(M * d));
      std::vector<int32_t> pos;
      for (size_t j = 0; j < need.size(); ++j) {
        be_.copy(spec_x_.data() + int64_t(j) * d, x + int64_t(need[j]) * d, size_t(d) * 4);
        pos.push_back(rows[need[j]].pos);
      }
      project_query(be_, layer, spec_x_.data(), M, pos.data(), spec_h_.data(), in_dev.data());
      add_accel_work(query_work(layer, M));
    } else {
      for (size_t j = 0; j < need.size(); ++j)
        be_.copy(in_dev.data() + int64_t(j) * d, x + int64_t(need[j]) * d, size_t(d) * 4);
    }
    auto from = std::make_shared<std::vector<float>>(size_t(M * n));
    const Event sent = rt_.transfers().run(
        Tier::kGpu, Tier::kDram, M * n * 4, [this, from, src = in_dev.data()] {
          be_.download(from->data(), src, from->size() * 4);
        }, {}, query_on_accel_ ? "speculative query to host" : "layer input to host");
    if (query_on_accel_) {
      std::lock_guard<std::mutex> l(mu_);
      t_query_ += since(t0);
    }
    for (size_t j = 0; j < need.size(); ++j) {
      const TokenRow r = rows[need[j]];
      auto res = std::make_shared<CpuResult>();
      pending_[pidx(layer, r.seq)] = res;
      const int32_t K = current_k(r), pre = sched_.pre();
      const std::string what = query_on_accel_ ? "hybridgen speculative logits, layer "
                                               : "hybridgen speculative q + logits, layer ";
      // The CPU queue runs stages in submission order. When the layer now running has no
      // speculation of its own, its CPU stage is submitted at its attention, after this call: this
      // stage then waits until that one is queued, so that it does not run ahead of the stage the
      // accelerator is about to wait for.
      const bool behind = layer > 0 && offloaded_[pidx(layer - 1, r.seq)] > 0 && !pending_[pidx(layer - 1, r.seq)];
      auto submit = [this, layer, r, what, from, j, n, sent, res, K, pre] {
        res->done = rt_.cpu().submit(
          what + std::to_string(layer), cpu_stage_work(layer, r, K, pre, !query_on_accel_), {sent},
          [this, layer, r, from, j, n, res, K, pre] {
            const float* in = from->data() + j * size_t(n);
            const auto t0 = Clock::now();
            std::vector<float> q;
            if (!query_on_accel_) {
              const int64_t d = model_->hp.d_model;
              std::vector<float> h(static_cast<size_t>(d));
              q.resize(size_t(shape_.H) * size_t(shape_.D));
              project_query(rt_.cpu_backend(), layer, in, 1, &r.pos, h.data(), q.data());
              const double measured = since(t0);
              std::lock_guard<std::mutex> l(mu_);
              t_query_ += measured;
              // The part of the CPU stage that does not scale with the tokens scored (the scheduler's
              // estimate of post mode from pre), on the stage clock when there is one.
              t_fixed_ += rt_.stage_seconds(StageKind::kCpuCompute, query_work(layer, 1, Tier::kDram), measured);
            }
            cpu_stage(layer, r, query_on_accel_ ? in : q.data(), K, pre, !query_on_accel_, *res, t0);
          });
      };
      if (behind) deferred_[pidx(layer, r.seq)] = std::move(submit);
      else submit();
    }
  }

  // Queues the speculative stage of (layer, seq) that prepare() held back, if any.
  void submit_deferred(int layer, int seq) {
    if (layer >= shape_.n_layers) return;
    auto& d = deferred_[pidx(layer, seq)];
    if (!d) return;
    auto f = std::move(d);
    d = nullptr;
    f();
  }

  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override {
    if (layer == 0 && !rows.empty() && rows[0].pos >= prompt_[size_t(rows[0].seq)] && !in_step_) {
      in_step_ = true;
      step_start_ = Clock::now();
    }
    std::vector<TokenRow> prefill, decode;
    std::vector<size_t> pi, di;
    for (size_t i = 0; i < rows.size(); ++i)
      (rows[i].pos < prompt_[size_t(rows[i].seq)] ? (prefill.push_back(rows[i]), pi) : (decode.push_back(rows[i]), di))
          .push_back(i);
    const int64_t hd = int64_t(shape_.H) * shape_.D;
    if (!prefill.empty()) attend_exact(layer, prefill, pi, q, scale, out);
    for (size_t j = 0; j < decode.size(); ++j) attend_hybrid(layer, decode[j], q + int64_t(di[j]) * hd, scale, out + int64_t(di[j]) * hd);
  }

  void end_step() override {
    // Trim every ring back to the R newest tokens.
    for (int l = 0; l < shape_.n_layers; ++l) {
      std::vector<std::pair<int, int32_t>> leaving;
      for (int b = 0; b < B_; ++b) {
        int32_t& off = offloaded_[pidx(l, b)];
        while (last_pos_[pidx(l, b)] - R_ + 1 > off) leaving.emplace_back(b, off++);
      }
      if (!leaving.empty()) offload(l, leaving, {}, nullptr, nullptr);
    }
    if (!in_step_) return;
    in_step_ = false;
    // The accelerator's own time this step (its wait for CPU results excluded); modeled from the
    // forward's work when the runtime has a stage clock.
    const double t_gpu = rt_.stage_clock() ? rt_.stage_seconds(StageKind::kAccelCompute, current_accel_work(), 0)
                                           : std::max(0.0, since(step_start_) - waited_);
    int64_t n_off = 0;
    for (int b = 0; b < B_; ++b) n_off = std::max<int64_t>(n_off, offloaded_[pidx(0, b)]);
    double t_cpu, t_tx, t_query, t_fixed;
    {
      std::lock_guard<std::mutex> l(mu_);
      t_cpu = t_cpu_;
      t_tx = t_tx_;
      t_query = t_query_;
      t_fixed = t_fixed_;
      t_cpu_ = t_tx_ = t_query_ = t_fixed_ = 0;
    }
    // The accelerator's stage excludes the time it waited for CPU results; that wait is the part
    // of the CPU stage (plus transfers) the pipeline did not hide.
    const double hidden = t_cpu + t_tx > 0 ? std::clamp(1.0 - waited_ / (t_cpu + t_tx), 0.0, 1.0) : 1.0;
    last_ = {{"K", double(sched_.k())},        {"mode_pre", sched_.pre() ? 1.0 : 0.0},
             {"t_cpu_ms", t_cpu * 1e3},        {"t_tx_ms", t_tx * 1e3},
             {"t_gpu_ms", t_gpu * 1e3},        {"wait_ms", waited_ * 1e3},
             {"cpu_hidden_pct", 100 * hidden}, {"t_query_ms", t_query * 1e3}};
    if (k_min_ratio_ > 0) sched_.set_k_min(int64_t(std::floor(k_min_ratio_ * double(seen_pos_max_ + 1))));
    sched_.update(t_cpu, t_tx, t_gpu, n_off, t_fixed);
    waited_ = 0;
    last_["tokens_gpu"] = double(std::min<int64_t>(R_, seen_pos_max_ + 1));
    last_["tokens_offloaded"] = double(n_off);
    // K as the scheduler set it, and the tokens a CPU stage selects with it (no more than offloaded).
    last_["K_effective"] = double(std::min<int64_t>(int64_t(last_["K"]), n_off));
    last_["v_pages_far"] = double(offloaded_kv_.far_value_pages());
  }

  std::map<std::string, double> step_stats() const override { return last_; }

 private:
  size_t pidx(int layer, int seq) const { return size_t(layer) * size_t(B_) + size_t(seq); }
  int32_t current_k(const TokenRow& r) const {
    return int32_t(std::min<int64_t>(sched_.k(), offloaded_[pidx(0, r.seq)]));
  }
  float* vrow(int layer, int seq, int g, int32_t pos) { return offloaded_kv_.value(layer, seq, g, pos); }
  Tier vtier(int layer, int seq, int32_t pos) const { return offloaded_kv_.value_tier(layer, seq, pos); }

  // Moves (seq, pos) tokens from the ring to the CPU side: K → dram, V → its page's tier.
  void offload(int layer, const std::vector<std::pair<int, int32_t>>& leaving, std::span<const TokenRow> rows,
               const float* k, const float* v) {
    const int Hkv = shape_.H_kv, D = shape_.D;
    const int64_t row = int64_t(Hkv) * D * 4;
    std::array<int64_t, kNumTiers> kbytes{}, vbytes{};
    for (auto& [seq, pos] : leaving) {
      vrow(layer, seq, 0, pos);  // allocates the V page on its tier on first use
      vbytes[size_t(vtier(layer, seq, pos))] += row;
      kbytes[size_t(offloaded_kv_.key_tier(layer, seq, pos))] += row;
    }
    // The token leaving may be one of this call's own rows (prefill chunks longer than the ring):
    // it is then read from k/v, else from its ring slot. On a device both are device memory: the
    // transfer's body downloads what it needs (the call's rows once; a ring slot per token, or the
    // whole ring when many tokens leave it at once).
    struct Source {
      const float* base;
      int64_t head_stride;  // floats between the token's KV heads
    };
    struct Staging {  // host copies the sources point into
      std::vector<float> rows, slots;
      std::map<int, std::vector<float>> ring;  // per sequence
    };
    auto sources = [this, layer, &leaving, rows, Hkv, D](bool key, const float* kv, Staging& st) {
      std::map<std::pair<int, int32_t>, size_t> in_call;
      for (size_t i = 0; i < rows.size(); ++i) in_call[{rows[i].seq, rows[i].pos}] = i;
      const bool host = be_.host_memory();
      const float* call = nullptr;
      int64_t from_ring = 0;
      for (auto& [seq, pos] : leaving) from_ring += !in_call.count({seq, pos});
      std::vector<Source> out;
      out.reserve(leaving.size());
      for (auto& [seq, pos] : leaving) {
        const float* ring_dev = key ? ring_.k(layer, seq) : ring_.v(layer, seq);
        const int64_t hs = ring_.head_stride(seq), slot = pos % (R_ + 1);
        if (auto it = in_call.find({seq, pos}); it != in_call.end()) {
          if (!call) call = host_view(be_, kv, rows.size() * size_t(Hkv) * size_t(D), st.rows);
          out.push_back({call + int64_t(it->second) * Hkv * D, D});
        } else if (host) {
          out.push_back({ring_dev + slot * D, hs});
        } else if (from_ring > 32) {
          auto& r = st.ring[seq];
          if (r.empty()) {
            r.resize(size_t(Hkv) * size_t(hs));
            be_.download(r.data(), ring_dev, r.size() * 4);
          }
          out.push_back({r.data() + slot * D, hs});
        } else {
          out.push_back({nullptr, D});  // downloaded below, one strided copy per token
        }
      }
      if (!host && from_ring <= 32) {
        size_t m = 0;
        for (auto& o : out) m += o.base == nullptr;
        st.slots.resize(m * size_t(Hkv) * size_t(D));
        size_t j = 0;
        for (size_t t = 0; t < leaving.size(); ++t) {
          if (out[t].base) continue;
          auto [seq, pos] = leaving[t];
          const float* ring_dev = key ? ring_.k(layer, seq) : ring_.v(layer, seq);
          float* dst = st.slots.data() + j++ * size_t(Hkv) * size_t(D);
          be_.download_2d(dst, size_t(D) * 4, ring_dev + int64_t(pos % (R_ + 1)) * D,
                          size_t(ring_.head_stride(seq)) * 4, size_t(D) * 4, size_t(Hkv));
          out[t].base = dst;
        }
      }
      return out;
    };
    std::vector<Event> ev;
    // K, then V: one body per destination tier; the second reuses the first's downloads.
    Staging kst;
    std::vector<Source> ksrc;
    for (Tier t : {Tier::kDram, Tier::kFar})
      if (kbytes[size_t(t)] > 0)
        ev.push_back(rt_.transfers().run(
            Tier::kGpu, t, kbytes[size_t(t)],
            [&, t] {
              if (ksrc.empty()) ksrc = sources(true, k, kst);
              for (size_t i = 0; i < leaving.size(); ++i) {
                auto [seq, pos] = leaving[i];
                if (offloaded_kv_.key_tier(layer, seq, pos) == t)
                  for (int g = 0; g < Hkv; ++g)
                    std::memcpy(offloaded_kv_.key(layer, seq, g, pos), ksrc[i].base + g * ksrc[i].head_stride,
                                size_t(D) * 4);
              }
            },
            {}, "offload K"));
    Staging vst;
    std::vector<Source> vsrc;
    for (Tier t : {Tier::kDram, Tier::kFar})
      if (vbytes[size_t(t)] > 0)
        ev.push_back(rt_.transfers().run(
            Tier::kGpu, t, vbytes[size_t(t)],
            [&, t] {
              if (vsrc.empty()) vsrc = sources(false, v, vst);
              for (size_t i = 0; i < leaving.size(); ++i) {
                auto [seq, pos] = leaving[i];
                if (vtier(layer, seq, pos) == t)
                  for (int g = 0; g < Hkv; ++g)
                    std::memcpy(vrow(layer, seq, g, pos), vsrc[i].base + g * vsrc[i].head_stride,
                                size_t(D) * 4);
              }
            },
            {}, "offload V"));
    for (auto& e : ev) e.wait();  // the ring slots are reused right after
  }

  // Prefill rows: exact attention on the accelerator over [0, pos]; offloaded prompt KV is
  // copied back from the CPU side for it.
  void attend_exact(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& idx, const float* q,
                    float scale, float* out) {
    const int Hkv = shape_.H_kv, D = shape_.D;
    const int64_t hd = int64_t(shape_.H) * D;
    const int32_t R1 = R_ + 1;
    std::map<int32_t, int32_t> last;
    for (auto& r : rows) last[r.seq] = std::max(last[r.seq], r.pos);
    for (auto& [seq_, maxpos] : last) {
      const int32_t seq = seq_;  // a plain variable: lambdas below capture it
      const int32_t n = maxpos + 1, n_off = offloaded_[pidx(layer, seq)];
      Allocation kb = rt_.memory().allocate(Tier::kGpu, int64_t(Hkv) * n * D * 4);
      Allocation vb = rt_.memory().allocate(Tier::kGpu, int64_t(Hkv) * n * D * 4);
      const size_t pitch = size_t(n) * size_t(D) * 4;
      if (n_off > 0) {
        for (Tier t : {Tier::kDram, Tier::kFar}) {
          const int32_t rows = offloaded_kv_.key_rows_before(t, layer, seq, n_off);
          if (rows == 0) continue;
          rt_.transfers()
              .run(
                  t, Tier::kGpu, int64_t(rows) * Hkv * D * 4,
                  [&, t] {
                    // Each run of the tier's rows, one strided copy of all heads.
                    offloaded_kv_.key_runs(layer, seq, 0, n_off, [&](Tier rt, int32_t row, int32_t pos, int32_t len) {
                      if (rt != t) return;
                      be_.upload_2d(kb.as<float>() + int64_t(pos) * D, pitch,
                                    offloaded_kv_.keys(t, layer, seq, 0) + int64_t(row) * D,
                                    size_t(offloaded_kv_.key_head_stride(t, layer, seq)) * 4,
                                    size_t(len) * size_t(D) * 4, size_t(Hkv));
                    });
                  },
                  {}, "prefill K back")
              .wait();
        }
        for (Tier t : {Tier::kDram, Tier::kFar}) {
          int64_t bytes = 0;
          for (int32_t p = 0; p < n_off; ++p) bytes += vtier(layer, seq, p) == t ? int64_t(Hkv) * D * 4 : 0;
          if (bytes == 0) continue;
          rt_.transfers()
              .run(
                  t, Tier::kGpu, bytes,
                  [&, t] {
                    // The tier's pages, each one strided copy of all heads (a page is [H_kv][page][D];
                    // a page lies in one tier).
                    for (int32_t p0 = 0; p0 < n_off;) {
                      const int32_t p1 = std::min(n_off, (p0 / page_ + 1) * page_);
                      if (vtier(layer, seq, p0) == t)
                        be_.upload_2d(vb.as<float>() + int64_t(p0) * D, pitch, vrow(layer, seq, 0, p0),
                                      size_t(page_) * size_t(D) * 4, size_t(p1 - p0) * size_t(D) * 4,
                                      size_t(Hkv));
                      p0 = p1;
                    }
                  },
                  {}, "prefill V back")
              .wait();
        }
      }
      // Resident positions [n_off, n) sit in ring slots p mod (R+1): at most two runs of slots.
      for (int32_t p0 = n_off; p0 < n;) {
        const int32_t s0 = p0 % R1, len = std::min(n - p0, R1 - s0);
        for (int g = 0; g < Hkv; ++g) {
          const int64_t src = g * ring_.head_stride(seq) + int64_t(s0) * D, dst = (int64_t(g) * n + p0) * D;
          be_.copy(kb.as<float>() + dst, ring_.k(layer, seq) + src, size_t(len) * size_t(D) * 4);
          be_.copy(vb.as<float>() + dst, ring_.v(layer, seq) + src, size_t(len) * size_t(D) * 4);
        }
        p0 += len;
      }
      std::vector<AttnRow> ar;
      std::vector<size_t> where;
      for (size_t i = 0; i < rows.size(); ++i)
        if (rows[i].seq == seq) {
          ar.push_back(AttnRow{kb.as<float>(), vb.as<float>(), int64_t(n) * D, rows[i].pos + 1});
          where.push_back(idx[i]);
        }
      // This sequence's query rows gathered, attended, and scattered back (accelerator memory).
      BackendArray<float> qs(be_, where.size() * size_t(hd)), os(be_, where.size() * size_t(hd));
      for (size_t j = 0; j < where.size(); ++j)
        be_.copy(qs.data() + int64_t(j) * hd, q + int64_t(where[j]) * hd, size_t(hd) * 4);
      be_.attention(attention_args(shape_, ar, qs.data(), scale, os.data()));
      for (size_t j = 0; j < where.size(); ++j)
        be_.copy(out + int64_t(where[j]) * hd, os.data() + int64_t(j) * hd, size_t(hd) * 4);
      be_.synchronize();  // kb, vb, qs and os are freed at the end of this scope
    }
    seen_pos_max_ = std::max(seen_pos_max_, last.rbegin()->second);
  }

  // The speculative query of `layer` for M rows of the previous layer's input x: this layer's
  // norm, W_q (+ bias) and RoPE at each row's position, on `b` (the CPU backend, or the
  // accelerator's); h is [M, d_model] scratch, q [M, H·D], both in b's memory.
  void project_query(Backend& b, int layer, const float* x, int64_t M, const int32_t* pos, float* h,
                     float* q) {
    speculative_query(b, *model_, layer, layer, x, M, pos, shape_.rope, h, q);
  }

  // The projection's work for the modeled clock: W_q read once from the memory it runs next to
  // (host DRAM for the CPU stage, the gpu tier on the accelerator), 2·rows·cols FLOPs per row.
  StageWork query_work(int layer, int64_t M, Tier where = Tier::kGpu) const {
    const Weight& wq = model_->layers[size_t(layer)][Slot::kWq];
    StageWork w;
    w.flops = 2.0 * double(wq.rows()) * double(wq.cols()) * double(M);
    w.bytes[size_t(where)] = int64_t(wq.bytes());
    return w;
  }

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
  StageWork cpu_stage_work(int layer, const TokenRow& r, int32_t K, bool pre, bool project) const {
    const int Hkv = shape_.H_kv, D = shape_.D;
    const int32_t n_off = offloaded_[pidx(layer, r.seq)], k = std::min(K, n_off);
    const int64_t keys = pre ? k : int64_t(n_off) + k;
    StageWork w;
    w.flops = 2.0 * double(shape_.H) * D * double(keys);
    const int64_t key_bytes = int64_t(Hkv) * D * 4;
    if (!pre) {
      for (Tier t : {Tier::kDram, Tier::kFar}) {
        const int32_t n_t = offloaded_kv_.key_rows_before(t, layer, r.seq, n_off);
        w.bytes[size_t(t)] += key_bytes * (n_t + std::llround(double(k) * n_t / std::max(1, n_off)));
      }
    } else {
      const auto [s, r0] = pre_runs(k, n_off);
      for (auto [a, b] : {std::pair{0, s}, std::pair{r0, n_off}})
        offloaded_kv_.key_runs(layer, r.seq, a, b, [&](Tier t, int32_t, int32_t, int32_t len) {
          w.bytes[size_t(t)] += key_bytes * len;
          w.rows[size_t(t)] += Hkv;
        });
    }
    if (project) {
      const StageWork q = query_work(layer, 1, Tier::kDram);
      w.flops += q.flops;
      w.bytes[size_t(Tier::kDram)] += q.bytes[size_t(Tier::kDram)];
    }
    return w;
  }
  // Pre mode's selection of K of n_off offloaded positions: sinks [0, s) and the most recent
  // [r0, n_off), as StreamingLLM keeps them.
  std::pair<int32_t, int32_t> pre_runs(int32_t K, int32_t n_off) const {
    const SinksAndRecent sel = sinks_and_recent(n_off, K, sinks_);
    return {sel.sinks, sel.recent};
  }

  // project: this stage projected its own query (its time, t0 on, includes that).
  void cpu_stage(int layer, const TokenRow& r, const float* q, int32_t K, bool pre, bool project, CpuResult& res,
                 Clock::time_point t0) {
    const StageWork work = cpu_stage_work(layer, r, K, pre, project);
    const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
    const int32_t n_off = offloaded_[pidx(layer, r.seq)];
    const float scale = 1.0f / std::sqrt(float(D));
    K = std::min(K, n_off);
    res.k = K;
    res.sel.assign(size_t(Hkv), {});
    res.n_tier.assign(size_t(Hkv), {0, 0});
    result_buffers(layer, r.seq, K, res);
    std::vector<float> lg_sel(size_t(Hkv) * size_t(G) * size_t(K));
    Backend& cb = rt_.cpu_backend();
    // This worker thread's scratch, grown (and zeroed) only when a stage needs more; the kernels
    // overwrite what they use. lg: [G, K] logits of one KV head's selected positions. Post mode
    // also: score, one per offloaded position; kg, the K selected key rows.
    thread_local std::vector<float> lg, score, kg;
    thread_local std::vector<int32_t> far_rows;
    if (lg.size() < size_t(G) * size_t(K)) lg.resize(size_t(G) * size_t(K));
    if (!pre && score.size() < size_t(n_off)) score.resize(size_t(n_off));
    if (kg.size() < size_t(K) * size_t(D)) kg.resize(size_t(K) * size_t(D));
    const int32_t n_dram = offloaded_kv_.key_rows_before(Tier::kDram, layer, r.seq, n_off);
    for (int g = 0; g < Hkv; ++g) {
      const float* qg = q + int64_t(g) * G * D;
      const float* Kd = offloaded_kv_.keys(Tier::kDram, layer, r.seq, g);
      const float* Kf = offloaded_kv_.keys(Tier::kFar, layer, r.seq, g);
      auto& sel = res.sel[size_t(g)];
      // Logit of query head h for the i-th selected position: [G, s] then [G, K − s] (pre mode's
      // two runs, sinks and most recent; post mode has s = 0).
      int32_t s = 0;
      if (!pre) {
        // post: every offloaded position scored by the group's max logit, top-K by score; then the
        // logits of the K selected. The scores are the max of the very logits group_logits gives
        // (bit for bit), so the selection is the one over all [G, n_off] logits, and only one
        // float per position is written instead of G (BM_GroupLogitsStage, max:1).
        // Each tier's keys in one pass: scores [dram rows | far rows].
        if (n_dram > 0) cb.group_logit_max(qg, G, Kd, n_dram, D, scale, score.data());
        if (n_off > n_dram) cb.group_logit_max(qg, G, Kf, n_off - n_dram, D, scale, score.data() + n_dram);
        logit_top_k(score.data(), 1, n_off, n_off, K, sel);
        // The selected keys gathered tier by tier, then their logits; the selection back to positions.
        const auto on_dram = std::stable_partition(sel.begin(), sel.end(), [&](int32_t i) { return i < n_dram; });
        const int32_t sd = int32_t(on_dram - sel.begin());
        far_rows.assign(on_dram, sel.end());
        for (auto& i : far_rows) i -= n_dram;
        cb.gather_rows(kg.data(), Kd, int64_t(D) * 4, int64_t(D) * 4, sel.data(), sd);
        cb.gather_rows(kg.data() + int64_t(sd) * D, Kf, int64_t(D) * 4, int64_t(D) * 4, far_rows.data(), K - sd);
        cb.group_logits(qg, G, kg.data(), K, D, scale, lg.data());
        for (int32_t i = 0; i < K; ++i)
          sel[size_t(i)] = i < sd ? offloaded_kv_.key_position(Tier::kDram, layer, r.seq, sel[size_t(i)])
                                  : offloaded_kv_.key_position(Tier::kFar, layer, r.seq, far_rows[size_t(i - sd)]);
      } else {  // pre: position heuristic first (sinks + most recent offloaded), logits only for those
        int32_t r0;
        std::tie(s, r0) = pre_runs(K, n_off);
        for (int32_t t = 0; t < s; ++t) sel.push_back(t);
        for (int32_t t = r0; t < n_off; ++t) sel.push_back(t);
        HG_CHECK(int32_t(sel.size()) == K);
        // A run whose keys are consecutive rows of one tier is scored where it lies; one that spans
        // tiers (interleaved pages) is gathered first, a copy per run of rows.
        const auto score_run = [&](int32_t a, int32_t len, float* out) {
          int runs = 0;
          const float* at = nullptr;
          offloaded_kv_.key_runs(layer, r.seq, a, a + len, [&](Tier t, int32_t row, int32_t, int32_t) {
            at = (t == Tier::kDram ? Kd : Kf) + int64_t(row) * D;
            ++runs;
          });
          if (runs > 1) {
            const int32_t zero = 0;
            offloaded_kv_.key_runs(layer, r.seq, a, a + len, [&](Tier t, int32_t row, int32_t pos, int32_t n) {
              cb.gather_rows(kg.data() + int64_t(pos - a) * D, (t == Tier::kDram ? Kd : Kf) + int64_t(row) * D,
                             int64_t(n) * D * 4, 0, &zero, 1);
            });
            at = kg.data();
          }
          cb.group_logits(qg, G, at, len, D, scale, out);
        };
        if (s > 0) score_run(0, s, lg.data());
        if (K > s) score_run(r0, K - s, lg.data() + int64_t(G) * s);
      }
      const auto logit = [&](int h, size_t c) {
        return c < size_t(s) ? lg[size_t(h) * size_t(s) + c]
                             : lg[size_t(G) * size_t(s) + size_t(h) * size_t(K - s) + (c - size_t(s))];
      };
      // Tier order (dram, then far), each part still sorted.
      std::vector<size_t> order(sel.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_partition(order.begin(), order.end(),
                            [&](size_t i) { return vtier(layer, r.seq, sel[i]) == Tier::kDram; });
      std::vector<int32_t> sorted(sel.size());
      for (size_t i = 0; i < order.size(); ++i) {
        sorted[i] = sel[order[i]];
        res.n_tier[size_t(g)][vtier(layer, r.seq, sorted[i]) == Tier::kDram ? 0 : 1]++;
        for (int h = 0; h < G; ++h) lg_sel[(size_t(g) * G + size_t(h)) * size_t(K) + i] = logit(h, order[i]);
      }
      sel = std::move(sorted);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      t_cpu_ += rt_.stage_seconds(StageKind::kCpuCompute, work, since(t0));
    }
    // Logits (dram → gpu) and the selected V rows (their tier → gpu).
    std::vector<Event> ev;
    const int64_t lbytes = int64_t(lg_sel.size()) * 4;
    ev.push_back(rt_.transfers().run(Tier::kDram, Tier::kGpu, lbytes, [this, &res, lg = std::move(lg_sel)] {
      const auto t = Clock::now();
      be_.upload(res.logits, lg.data(), lg.size() * 4);
      add_tx(transfer_seconds(Tier::kDram, int64_t(lg.size()) * 4, 0, since(t)));
    }, {}, "cpu logits to gpu"));
    // The selected V rows go from their tier to res.v on the gpu tier in one gather per run of
    // positions within a page. On a device the accelerator reads them by DMA from pinned dram or
    // mapped far memory (Backend::gather_rows); the CPU copies nothing.
    for (int ti = 0; ti < 2; ++ti) {
      const Tier tier = ti == 0 ? Tier::kDram : Tier::kFar;
      int64_t bytes = 0, runs = 0;  // runs of consecutive selected positions within one page
      for (int g = 0; g < Hkv; ++g) {
        const auto& sel = res.sel[size_t(g)];
        const int32_t b = ti == 0 ? 0 : res.n_tier[size_t(g)][0], e = b + res.n_tier[size_t(g)][size_t(ti)];
        bytes += int64_t(e - b) * D * 4;
        for (int32_t i = b; i < e; ++i)
          runs += i == b || sel[size_t(i)] != sel[size_t(i) - 1] + 1 ||
                  sel[size_t(i)] / page_ != sel[size_t(i) - 1] / page_;
      }
      if (bytes == 0) continue;
      ev.push_back(rt_.transfers().run_gather(
          tier, Tier::kGpu, bytes, runs,
          [this, &res, layer, r, ti, K, D, Hkv, tier, bytes, runs] {
            const auto t = Clock::now();
            // Each head's rows of this tier are one block of res.v; its positions are sorted.
            std::vector<int32_t> in_page;
            for (int g = 0; g < Hkv; ++g) {
              const auto& sel = res.sel[size_t(g)];
              const int32_t b = ti == 0 ? 0 : res.n_tier[size_t(g)][0],
                            e = b + res.n_tier[size_t(g)][size_t(ti)];
              float* block = res.v + (int64_t(g) * K + b) * D;
              for (int32_t i = b; i < e;) {
                const int32_t page = sel[size_t(i)] / page_;
                int32_t j = i;
                in_page.clear();
                for (; j < e && sel[size_t(j)] / page_ == page; ++j)
                  in_page.push_back(sel[size_t(j)] % page_);
                be_.gather_rows(block + int64_t(i - b) * D, vrow(layer, r.seq, g, page * page_), int64_t(D) * 4,
                                int64_t(D) * 4, in_page.data(), j - i);
                i = j;
              }
            }
            be_.synchronize();  // the attention reading res.v runs on another thread's stream
            add_tx(transfer_seconds(tier, bytes, runs, since(t)));
          },
          {}, "selected V to gpu"));
    }
    for (auto& e : ev) e.wait();
  }

  // The result buffers of `layer`'s CPU stage: one pair per layer parity and sequence on the gpu tier (the
  // stage for layer l+1 fills its pair while the accelerator reads layer l's), grown to K tokens as needed.
  // Safe to overwrite: the pair's last reader, layer l−1's merged attention, finished before this stage was
  // submitted (see prepare() and attend_hybrid()).
  void result_buffers(int layer, int seq, int32_t K, CpuResult& res) {
    const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
    const int64_t lbytes = std::max<int64_t>(4, int64_t(Hkv) * G * K * 4),
                  vbytes = std::max<int64_t>(4, int64_t(Hkv) * K * D * 4);
    std::lock_guard<std::mutex> l(pool_mu_);
    ResultPool& p = pool_[size_t(layer % 2) * size_t(B_) + size_t(seq)];
    grow_allocation(rt_.memory(), Tier::kGpu, p.logits, lbytes);
    grow_allocation(rt_.memory(), Tier::kGpu, p.v, vbytes);
    res.logits = p.logits.as<float>();
    res.v = p.v.as<float>();
  }

  // A transfer's time for the scheduler: measured, or modeled on the runtime's stage clock.
  double transfer_seconds(Tier src, int64_t bytes, int64_t rows, double measured_s) const {
    StageWork w;
    w.src = src, w.dst = Tier::kGpu, w.transfer_bytes = bytes, w.rows[size_t(src)] = rows;
    return rt_.stage_seconds(StageKind::kTransfer, w, measured_s);
  }

  void add_tx(double s) {
    std::lock_guard<std::mutex> l(mu_);
    t_tx_ += s;
  }

  void attend_hybrid(int layer, const TokenRow& r, const float* q, float scale, float* out) {
    const int Hkv = shape_.H_kv, D = shape_.D;
    const int32_t R1 = R_ + 1, n = r.pos + 1, n_off = offloaded_[pidx(layer, r.seq)], n_res = n - n_off,
                  used = std::min(n, R1);
    // The ring holds exactly the resident tokens: all of them before any offload, afterwards the
    // R trimmed by the last end_step plus this step's token.
    HG_CHECK(n_res == used);
    seen_pos_max_ = std::max(seen_pos_max_, r.pos);
    std::shared_ptr<CpuResult> res;
    submit_deferred(layer, r.seq);  // normally queued already, after the previous layer's stage
    if (n_off > 0) {
      res = pending_[pidx(layer, r.seq)];
      pending_[pidx(layer, r.seq)] = nullptr;
      if (!res) {  // no speculation for this layer: the CPU stage runs now with the true query
        res = std::make_shared<CpuResult>();
        // The true query to the host (q stays valid: this call waits for the stage below); queueing
        // the transfer on a GPU also waits for the work queued so far.
        auto qt = std::make_shared<std::vector<float>>(size_t(shape_.H) * size_t(D));
        const Event sent = rt_.transfers().run(
            Tier::kGpu, Tier::kDram, int64_t(qt->size()) * 4,
            [this, qt, q] { be_.download(qt->data(), q, qt->size() * 4); }, {}, "query to host");
        const int32_t K = current_k(r);
        const bool pre = sched_.pre();
        res->done = rt_.cpu().submit("hybridgen logits, layer " + std::to_string(layer),
                                     cpu_stage_work(layer, r, K, pre, false), {sent},
                                     [this, layer, r, qt, res, K, pre] {
                                       cpu_stage(layer, r, qt->data(), K, pre, false, *res, Clock::now());
                                     });
      }
    }
    submit_deferred(layer + 1, r.seq);
    // The accelerator's logits of its resident tokens (true query) while the CPU stage finishes.
    const int G = shape_.H / Hkv;
    if (resident_logits_.size() < size_t(shape_.H) * size_t(used))
      resident_logits_ = BackendArray<float>(be_, size_t(shape_.H) * size_t(R1));
    for (int g = 0; g < Hkv; ++g)
      be_.group_logits(q + int64_t(g) * G * D, G, ring_.k(layer, r.seq) + g * ring_.head_stride(r.seq), used, D,
                       scale, resident_logits_.data() + int64_t(g) * G * used);
    if (res) {
      const auto t0 = Clock::now();
      res->done.wait();
      waited_ += since(t0);
    }
    // One softmax over the CPU's logits of the selected offloaded tokens and those resident
    // logits, then both value sums.
    Backend::MergedAttention m;
    m.H = shape_.H, m.H_kv = Hkv, m.D = D, m.scale = scale, m.q = q, m.lb = resident_logits_.data();
    if (res) m.la = res->logits, m.Va = res->v, m.na = res->k;
    m.Kb = ring_.k(layer, r.seq), m.Vb = ring_.v(layer, r.seq), m.ld_b = ring_.head_stride(r.seq) / D,
    m.nb = used;
    m.out = out;
    be_.merged_attention(m);
  }

  Backend& be_;
  Runtime& rt_;
  const Model* model_;
  int32_t R_, page_;
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
  OffloadedKv offloaded_kv_;
  std::vector<std::shared_ptr<CpuResult>> pending_;
  std::vector<std::function<void()>> deferred_;  // per (layer, seq): a speculative stage held back by prepare()
  struct ResultPool {
    Allocation logits, v;
  };
  std::vector<ResultPool> pool_;  // per layer parity and sequence (result_buffers)
  std::mutex pool_mu_;
  std::vector<int32_t> slots_;                 // append() scratch: ring slots of a run of rows
  BackendArray<float> resident_logits_;  // attend_hybrid(): [H, used] in the accelerator's memory
  BackendArray<float> spec_x_, spec_h_;  // prepare() with query_on=accelerator: its scratch
  std::array<BackendArray<float>, 2> spec_in_;  // prepare(): the CPU stages' inputs per layer parity
  std::vector<int32_t> offloaded_, last_pos_;  // per (layer, seq): tokens on the CPU side; newest position
  int32_t seen_pos_max_ = 0;
  double k_min_ratio_ = 0;  // > 0: k_min is this fraction of the current context
  bool in_step_ = false;
  Clock::time_point step_start_;
  std::mutex mu_;
  double t_fixed_ = 0;  // the CPU stages' query projections this step (inside t_cpu_)
  double t_cpu_ = 0, t_tx_ = 0, t_query_ = 0,
         waited_ = 0;  // t_query_: the speculative queries' projections (part of t_cpu_, or with
                       // query_on=accelerator of the accelerator's stage)
  std::map<std::string, double> last_;
};

}  // namespace

StrategyInfo hybridgen_info() {
  using T = ParamSpec::Type;
  // clang-format off
  return {"hybridgen",
          "CPU logits for offloaded keys of the next layer while the accelerator works; merged softmax; feedback "
          "scheduler; semantic K/V mapping (HybridGen)",
          {{"gpu_kv_tokens", T::kInt, "1024", "tokens", "newest tokens resident on the accelerator per layer", {}},
           {"placement", T::kEnum, "semantic", "", "tiers of offloaded V pages", {"semantic", "interleave", "dram-only"}},
           {"interleave_dram_ratio", T::kFloat, "0.5", "ratio", "interleave: fraction of pages in dram", {}},
           {"dram_kv_bytes", T::kInt, "0", "bytes", "dram available to offloaded KV (0: what the dram tier has)", {}},
           {"page_tokens", T::kInt, "64", "tokens", "tokens per V page", {}},
           {"speculative_query", T::kBool, "true", "", "CPU logits for layer i+1 from layer i's input", {}},
           {"query_on", T::kEnum, "cpu", "", "speculative query projected by the CPU stage (the paper) or the accelerator",
            {"cpu", "accelerator"}},
           {"k", T::kEnum, "adaptive", "", "token count K: adapted by the scheduler or fixed", {"adaptive", "fixed"}},
           {"mode", T::kEnum, "adaptive", "", "selection: switched by the scheduler, or fixed post/pre", {"adaptive", "post", "pre"}},
           {"k_min", T::kInt, "128", "tokens", "lower bound of K (accuracy threshold)", {}},
           {"kv_ratio", T::kFloat, "0", "ratio", "instead of k_min: K_min is this fraction of the current context (0: k_min)", {}},
           {"k_max", T::kInt, "4096", "tokens", "upper bound of K", {}},
           {"k_fixed", T::kInt, "128", "tokens", "K when k=fixed", {}},
           {"k_growth", T::kFloat, "2.0", "", "factor by which the scheduler raises or lowers K", {}},
           {"pre_sinks", T::kInt, "4", "tokens", "pre mode: first tokens always selected (rest: most recent)", {}}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<HybridGen>(c, p); },
          /*runs_on_cuda=*/true};
  // clang-format on
}

}  // namespace hg
