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
// its true query. It computes q·kᵀ/√d for offloaded keys, selects tokens per KV head (`post`: all
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
#include <mutex>

#include "baselines/common.h"
#include "baselines/hybridgen/scheduler.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/decoder/kv_store.h"
#include "engine/runtime/placement.h"

namespace hg {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What the CPU stage hands the accelerator for one (layer, sequence).
struct CpuResult {
  int32_t k = 0;                      // tokens selected per KV head
  std::vector<std::vector<int32_t>> sel;  // [H_kv] sorted positions
  Allocation logits;                  // gpu tier: [H_kv][G][k]
  Allocation v;                       // gpu tier: [H_kv][k][D]
  Event done;                         // CPU compute and both transfers finished
};

class HybridGen final : public KvStrategy {
 public:
  HybridGen(const StrategyContext& ctx, const StrategyParams& p)
      : be_(ctx.backend), rt_(require_runtime(ctx, "hybridgen")), model_(ctx.model),
        R_(int32_t(p.get_int("gpu_kv_tokens"))), page_(int32_t(p.get_int("page_tokens"))),
        speculative_(p.get_bool("speculative_query")), sinks_(int32_t(p.get_int("pre_sinks"))),
        placement_(make_placement(p.get("placement"), p.get_float("interleave_dram_ratio"))),
        dram_kv_bytes_(p.get_int("dram_kv_bytes")), sched_cfg_(config(p)), sched_(sched_cfg_) {
    if (R_ < 1 || page_ < 1) input_error("strategy hybridgen: gpu_kv_tokens and page_tokens must be >= 1");
    if (speculative_ && !model_) input_error("strategy hybridgen: speculative_query needs the model's weights");
  }
  std::string_view name() const override { return "hybridgen"; }

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
    int64_t pages = 0, k_bytes = 0;
    max_pages_ = 0;
    for (int b = 0; b < B_; ++b) {
      ring[size_t(b)] = std::min(R_ + 1, cap_[size_t(b)]);
      off[size_t(b)] = std::max(1, cap_[size_t(b)] - R_);
      max_pages_ = std::max<int64_t>(max_pages_, (off[size_t(b)] + page_ - 1) / page_);
      k_bytes += int64_t(shape.n_layers) * shape.H_kv * off[size_t(b)] * shape.D * 4;
    }
    pages = max_pages_ * shape.n_layers * B_;
    ring_.reset(shape, ring, &rt_.memory(), Tier::kGpu);
    kcpu_.reset(shape, off, &rt_.memory(), Tier::kDram);
    const int64_t page_bytes = int64_t(shape.H_kv) * page_ * shape.D * 4;
    const int64_t dram_avail = dram_kv_bytes_ > 0 ? dram_kv_bytes_ : rt_.memory().ledger().available(Tier::kDram) + k_bytes;
    placement_->plan(PlacementPlan{pages, page_bytes, dram_avail - k_bytes + pages * page_bytes > 0 ? dram_avail : 0});
    // Semantic mapping's plan counts K pages as n_pages·page_bytes; our K is a flat store of the
    // same size (one K row per V row), so the arithmetic matches.
    vpages_.clear();
    vpages_.resize(size_t(shape.n_layers) * size_t(B_) * size_t(max_pages_));
    far_pages_ = 0;
    pending_.assign(size_t(shape.n_layers) * size_t(B_), nullptr);
    offloaded_.assign(pending_.size(), 0);
    last_pos_.assign(pending_.size(), -1);
    sched_ = FeedbackScheduler(sched_cfg_);
    t_cpu_ = t_tx_ = waited_ = 0;
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
    for (size_t i = 0; i < rows.size(); ++i) {
      const TokenRow r = rows[i];
      const int32_t slot = r.pos % (R_ + 1);
      for (int g = 0; g < Hkv; ++g) {
        std::memcpy(ring_.k(layer, r.seq) + g * ring_.head_stride(r.seq) + int64_t(slot) * D,
                    k + (int64_t(i) * Hkv + g) * D, size_t(D) * 4);
        std::memcpy(ring_.v(layer, r.seq) + g * ring_.head_stride(r.seq) + int64_t(slot) * D,
                    v + (int64_t(i) * Hkv + g) * D, size_t(D) * 4);
      }
    }
  }

  void prepare(int layer, std::span<const TokenRow> rows, const float* x) override {
    if (!speculative_) return;
    const int64_t d = model_->hp.d_model;
    for (size_t i = 0; i < rows.size(); ++i) {
      const TokenRow r = rows[i];
      if (r.pos < prompt_[size_t(r.seq)] || offloaded_[pidx(layer, r.seq)] == 0) continue;  // decode rows with offloaded tokens only
      std::vector<float> xr(x + int64_t(i) * d, x + int64_t(i + 1) * d);
      auto res = std::make_shared<CpuResult>();
      pending_[pidx(layer, r.seq)] = res;
      const int32_t K = current_k(r), pre = sched_.pre();
      res->done = rt_.cpu().submit("hybridgen speculative q + logits, layer " + std::to_string(layer),
                                   cpu_stage_work(layer, r, K, pre), {},
                                   [this, layer, r, xr = std::move(xr), res, K, pre] {
                                     const auto t0 = Clock::now();
                                     const std::vector<float> q = speculative_query(layer, r, xr.data());
                                     cpu_stage(layer, r, q.data(), K, pre, *res, t0);
                                   });
    }
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
    const double t_gpu = std::max(0.0, since(step_start_) - waited_);
    int64_t n_off = 0;
    for (int b = 0; b < B_; ++b) n_off = std::max<int64_t>(n_off, offloaded_[pidx(0, b)]);
    double t_cpu, t_tx;
    {
      std::lock_guard<std::mutex> l(mu_);
      t_cpu = t_cpu_;
      t_tx = t_tx_;
      t_cpu_ = t_tx_ = 0;
    }
    // The accelerator's stage excludes the time it waited for CPU results; that wait is the part
    // of the CPU stage (plus transfers) the pipeline did not hide.
    const double hidden = t_cpu + t_tx > 0 ? std::clamp(1.0 - waited_ / (t_cpu + t_tx), 0.0, 1.0) : 1.0;
    last_ = {{"K", double(sched_.k())},       {"mode_pre", sched_.pre() ? 1.0 : 0.0}, {"t_cpu_ms", t_cpu * 1e3},
             {"t_tx_ms", t_tx * 1e3},         {"t_gpu_ms", t_gpu * 1e3},              {"wait_ms", waited_ * 1e3},
             {"cpu_hidden_pct", 100 * hidden}};
    sched_.update(t_cpu, t_tx, t_gpu, n_off);
    waited_ = 0;
    last_["tokens_gpu"] = double(std::min<int64_t>(R_, seen_pos_max_ + 1));
    last_["tokens_offloaded"] = double(n_off);
    last_["v_pages_far"] = double(far_pages_);
  }

  std::map<std::string, double> step_stats() const override { return last_; }

 private:
  size_t pidx(int layer, int seq) const { return size_t(layer) * size_t(B_) + size_t(seq); }
  int32_t current_k(const TokenRow& r) const {
    return int32_t(std::min<int64_t>(sched_.k(), offloaded_[pidx(0, r.seq)]));
  }
  float* vrow(int layer, int seq, int g, int32_t pos) {
    Allocation& pg = vpages_[(size_t(layer) * size_t(B_) + size_t(seq)) * size_t(max_pages_) + size_t(pos / page_)];
    return pg.as<float>() + (int64_t(g) * page_ + pos % page_) * shape_.D;
  }
  Tier vtier(int layer, int seq, int32_t pos) const {
    // Pages are numbered position-major across layers and sequences, so early tokens of every
    // layer claim dram before later ones.
    const int64_t page = int64_t(pos / page_) * shape_.n_layers * B_ + int64_t(layer) * B_ + seq;
    return placement_->place(KvKind::kValue, page);
  }

  // Moves (seq, pos) tokens from the ring to the CPU side: K → dram, V → its page's tier.
  void offload(int layer, const std::vector<std::pair<int, int32_t>>& leaving, std::span<const TokenRow> rows,
               const float* k, const float* v) {
    const int Hkv = shape_.H_kv, D = shape_.D;
    const int64_t row = int64_t(Hkv) * D * 4;
    std::array<int64_t, kNumTiers> vbytes{};
    for (auto& [seq, pos] : leaving) {
      Allocation& pg = vpages_[(size_t(layer) * size_t(B_) + size_t(seq)) * size_t(max_pages_) + size_t(pos / page_)];
      const Tier t = vtier(layer, seq, pos);
      if (pg.empty()) {
        pg = rt_.memory().allocate(t, int64_t(Hkv) * page_ * D * 4);
        far_pages_ += t == Tier::kFar;
      }
      vbytes[size_t(t)] += row;
    }
    // The token leaving may be one of this call's own rows (prefill chunks longer than the ring):
    // read it from the ring, where earlier rows of this call were written... or from k/v.
    auto src_row = [&](int seq, int32_t pos, int g, bool key) -> const float* {
      for (size_t i = 0; i < rows.size(); ++i)
        if (rows[i].seq == seq && rows[i].pos == pos) return (key ? k : v) + (int64_t(i) * Hkv + g) * D;
      return (key ? ring_.k(layer, seq) : ring_.v(layer, seq)) + g * ring_.head_stride(seq) + int64_t(pos % (R_ + 1)) * D;
    };
    std::vector<Event> ev;
    ev.push_back(rt_.transfers().run(Tier::kGpu, Tier::kDram, int64_t(leaving.size()) * row, [&] {
      for (auto& [seq, pos] : leaving)
        for (int g = 0; g < Hkv; ++g)
          std::memcpy(kcpu_.k(layer, seq) + g * kcpu_.head_stride(seq) + int64_t(pos) * D, src_row(seq, pos, g, true),
                      size_t(D) * 4);
    }, {}, "offload K"));
    for (Tier t : {Tier::kDram, Tier::kFar})
      if (vbytes[size_t(t)] > 0)
        ev.push_back(rt_.transfers().run(Tier::kGpu, t, vbytes[size_t(t)], [&, t] {
          for (auto& [seq, pos] : leaving)
            if (vtier(layer, seq, pos) == t)
              for (int g = 0; g < Hkv; ++g) std::memcpy(vrow(layer, seq, g, pos), src_row(seq, pos, g, false), size_t(D) * 4);
        }, {}, "offload V"));
    for (auto& e : ev) e.wait();  // the ring slots are reused right after
  }

  // Prefill rows: exact attention on the accelerator over [0, pos]; offloaded prompt KV is
  // copied back from the CPU side for it.
  void attend_exact(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& idx, const float* q,
                    float scale, float* out) {
    const int Hkv = shape_.H_kv, D = shape_.D;
    const int64_t hd = int64_t(shape_.H) * D;
    std::map<int32_t, int32_t> last;
    for (auto& r : rows) last[r.seq] = std::max(last[r.seq], r.pos);
    for (auto& [seq, maxpos] : last) {
      const int32_t n = maxpos + 1, n_off = offloaded_[pidx(layer, seq)];
      Allocation kb = rt_.memory().allocate(Tier::kGpu, int64_t(Hkv) * n * D * 4);
      Allocation vb = rt_.memory().allocate(Tier::kGpu, int64_t(Hkv) * n * D * 4);
      if (n_off > 0) {
        rt_.transfers().run(Tier::kDram, Tier::kGpu, int64_t(n_off) * Hkv * D * 4, [&] {
          for (int g = 0; g < Hkv; ++g)
            std::memcpy(kb.as<float>() + int64_t(g) * n * D, kcpu_.k(layer, seq) + g * kcpu_.head_stride(seq),
                        size_t(n_off) * D * 4);
        }, {}, "prefill K back").wait();
        for (Tier t : {Tier::kDram, Tier::kFar}) {
          int64_t bytes = 0;
          for (int32_t p = 0; p < n_off; ++p) bytes += vtier(layer, seq, p) == t ? int64_t(Hkv) * D * 4 : 0;
          if (bytes == 0) continue;
          rt_.transfers().run(t, Tier::kGpu, bytes, [&, t] {
            for (int32_t p = 0; p < n_off; ++p)
              if (vtier(layer, seq, p) == t)
                for (int g = 0; g < Hkv; ++g)
                  std::memcpy(vb.as<float>() + (int64_t(g) * n + p) * D, vrow(layer, seq, g, p), size_t(D) * 4);
          }, {}, "prefill V back").wait();
        }
      }
      for (int32_t p = n_off; p < n; ++p)
        for (int g = 0; g < Hkv; ++g) {
          std::memcpy(kb.as<float>() + (int64_t(g) * n + p) * D, ring_.k(layer, seq) + g * ring_.head_stride(seq) + int64_t(p % (R_ + 1)) * D, size_t(D) * 4);
          std::memcpy(vb.as<float>() + (int64_t(g) * n + p) * D, ring_.v(layer, seq) + g * ring_.head_stride(seq) + int64_t(p % (R_ + 1)) * D, size_t(D) * 4);
        }
      std::vector<AttnRow> ar;
      std::vector<float> qs, os;
      std::vector<size_t> where;
      for (size_t i = 0; i < rows.size(); ++i)
        if (rows[i].seq == seq) {
          ar.push_back(AttnRow{kb.as<float>(), vb.as<float>(), int64_t(n) * D, rows[i].pos + 1});
          qs.insert(qs.end(), q + int64_t(idx[i]) * hd, q + int64_t(idx[i] + 1) * hd);
          where.push_back(idx[i]);
        }
      os.resize(qs.size());
      be_.attention(attention_args(shape_, ar, qs.data(), scale, os.data()));
      for (size_t j = 0; j < where.size(); ++j) std::copy(os.begin() + int64_t(j) * hd, os.begin() + int64_t(j + 1) * hd, out + int64_t(where[j]) * hd);
    }
    seen_pos_max_ = std::max(seen_pos_max_, last.rbegin()->second);
  }

  std::vector<float> speculative_query(int layer, const TokenRow& r, const float* x) {
    const Model& m = *model_;
    const LayerWeights& w = m.layers[size_t(layer)];
    const int64_t d = m.hp.d_model;
    std::vector<float> h(static_cast<size_t>(d)), q(size_t(m.hp.n_heads) * size_t(m.hp.head_dim));
    Backend& cb = rt_.cpu_backend();
    if (m.traits.norm == NormKind::kRms) cb.rms_norm(x, w[Slot::kAttnNorm].f32(), 1, d, m.hp.norm_eps, h.data());
    else cb.layer_norm(x, w[Slot::kAttnNorm].f32(), w[Slot::kAttnNormB].f32(), 1, d, m.hp.norm_eps, h.data());
    cb.matmul(h.data(), 1, w[Slot::kWq], w[Slot::kBq].empty() ? nullptr : w[Slot::kBq].f32(), q.data());
    if (shape_.rope) cb.rope(q.data(), 1, m.hp.n_heads, m.hp.head_dim, &r.pos, *shape_.rope);
    return q;
  }

  // Logits of offloaded keys, selection, and the transfers of logits and V rows to the accelerator.
  // The CPU stage's work for the modeled clock: logits of all H query heads over the keys it reads
  // from DRAM. Post: every offloaded key, streamed. Pre: the K keys of the position heuristic, two
  // runs (sinks, most recent) per KV head. (The speculative query's projection is not counted.)
  StageWork cpu_stage_work(int layer, const TokenRow& r, int32_t K, bool pre) const {
    const int Hkv = shape_.H_kv, D = shape_.D;
    const int64_t n_off = offloaded_[pidx(layer, r.seq)], keys = pre ? std::min<int64_t>(K, n_off) : n_off;
    StageWork w;
    w.flops = 2.0 * double(shape_.H) * D * double(keys);
    w.bytes[size_t(Tier::kDram)] = int64_t(Hkv) * keys * D * 4;
    if (pre) w.rows[size_t(Tier::kDram)] = int64_t(2) * Hkv;
    return w;
  }

  void cpu_stage(int layer, const TokenRow& r, const float* q, int32_t K, bool pre, CpuResult& res, Clock::time_point t0) {
    const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
    const int32_t n_off = offloaded_[pidx(layer, r.seq)];
    const float scale = 1.0f / std::sqrt(float(D));
    K = std::min(K, n_off);
    res.k = K;
    res.sel.assign(size_t(Hkv), {});
    res.logits = rt_.memory().allocate(Tier::kGpu, std::max<int64_t>(1, int64_t(Hkv) * G * K * 4));
    res.v = rt_.memory().allocate(Tier::kGpu, std::max<int64_t>(1, int64_t(Hkv) * K * D * 4));
    std::vector<float> lg_sel(size_t(Hkv) * size_t(G) * size_t(K));
    Backend& cb = rt_.cpu_backend();
    for (int g = 0; g < Hkv; ++g) {
      const float* qg = q + int64_t(g) * G * D;
      const float* Kg = kcpu_.k(layer, r.seq) + g * kcpu_.head_stride(r.seq);
      auto& sel = res.sel[size_t(g)];
      if (!pre) {  // post: all offloaded logits, top-K by the group's max logit
        std::vector<float> lg(size_t(G) * size_t(n_off));
        cb.group_logits(qg, G, Kg, n_off, D, scale, lg.data());
        std::vector<std::pair<float, int32_t>> sc(static_cast<size_t>(n_off));
        for (int32_t t = 0; t < n_off; ++t) {
          float mx = -INFINITY;
          for (int h = 0; h < G; ++h) mx = std::max(mx, lg[size_t(h) * size_t(n_off) + size_t(t)]);
          sc[size_t(t)] = {-mx, t};
        }
        std::nth_element(sc.begin(), sc.begin() + K, sc.end());
        for (int32_t i = 0; i < K; ++i) sel.push_back(sc[size_t(i)].second);
        std::sort(sel.begin(), sel.end());
        for (int h = 0; h < G; ++h)
          for (int32_t i = 0; i < K; ++i)
            lg_sel[(size_t(g) * G + size_t(h)) * size_t(K) + size_t(i)] = lg[size_t(h) * size_t(n_off) + size_t(sel[size_t(i)])];
      } else {  // pre: position heuristic first (sinks + most recent offloaded), logits only for those
        const int32_t s = std::min(sinks_, K);
        for (int32_t t = 0; t < s; ++t) sel.push_back(t);
        for (int32_t t = std::max(s, n_off - (K - s)); t < n_off; ++t) sel.push_back(t);
        std::vector<float> kg(size_t(K) * size_t(D)), lg(size_t(G) * size_t(K));
        cpu::gather_rows(kg.data(), Kg, int64_t(D) * 4, int64_t(D) * 4, sel.data(), K);
        cb.group_logits(qg, G, kg.data(), K, D, scale, lg.data());
        std::copy(lg.begin(), lg.end(), lg_sel.begin() + int64_t(g) * G * K);
      }
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      t_cpu_ += since(t0);
    }
    // Logits (dram → gpu) and the selected V rows (their tier → gpu).
    std::vector<Event> ev;
    const int64_t lbytes = int64_t(lg_sel.size()) * 4;
    ev.push_back(rt_.transfers().run(Tier::kDram, Tier::kGpu, lbytes, [this, &res, lg = std::move(lg_sel)] {
      const auto t = Clock::now();
      std::copy(lg.begin(), lg.end(), res.logits.as<float>());
      add_tx(since(t));
    }, {}, "cpu logits to gpu"));
    for (Tier tier : {Tier::kDram, Tier::kFar}) {
      int64_t bytes = 0, runs = 0;  // runs of consecutive selected positions within one page
      for (int g = 0; g < Hkv; ++g) {
        const auto& sel = res.sel[size_t(g)];
        for (size_t i = 0; i < sel.size(); ++i) {
          if (vtier(layer, r.seq, sel[i]) != tier) continue;
          bytes += int64_t(D) * 4;
          runs += i == 0 || sel[i] != sel[i - 1] + 1 || sel[i] / page_ != sel[i - 1] / page_ ||
                  vtier(layer, r.seq, sel[i - 1]) != tier;
        }
      }
      if (bytes == 0) continue;
      ev.push_back(rt_.transfers().run_gather(tier, Tier::kGpu, bytes, runs, [this, &res, layer, r, tier, K, D, Hkv] {
        const auto t = Clock::now();
        // Selected positions are sorted: each run of them within one page (one tier) is one gather
        // from that page's rows of head g.
        std::vector<int32_t> in_page;
        for (int g = 0; g < Hkv; ++g) {
          const auto& sel = res.sel[size_t(g)];
          for (int32_t i = 0; i < K;) {
            const int32_t page = sel[size_t(i)] / page_;
            int32_t j = i;
            in_page.clear();
            for (; j < K && sel[size_t(j)] / page_ == page; ++j) in_page.push_back(sel[size_t(j)] % page_);
            if (vtier(layer, r.seq, sel[size_t(i)]) == tier)
              cpu::gather_rows(res.v.as<float>() + (int64_t(g) * K + i) * D, vrow(layer, r.seq, g, page * page_),
                               int64_t(D) * 4, int64_t(D) * 4, in_page.data(), j - i);
            i = j;
          }
        }
        add_tx(since(t));
      }, {}, "selected V to gpu"));
    }
    for (auto& e : ev) e.wait();
  }

  void add_tx(double s) {
    std::lock_guard<std::mutex> l(mu_);
    t_tx_ += s;
  }

  void attend_hybrid(int layer, const TokenRow& r, const float* q, float scale, float* out) {
    const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
    const int32_t R1 = R_ + 1, n = r.pos + 1, n_off = offloaded_[pidx(layer, r.seq)], n_res = n - n_off,
                  used = std::min(n, R1);
    seen_pos_max_ = std::max(seen_pos_max_, r.pos);
    std::shared_ptr<CpuResult> res;
    if (n_off > 0) {
      res = pending_[pidx(layer, r.seq)];
      pending_[pidx(layer, r.seq)] = nullptr;
      if (!res) {  // no speculation for this layer: the CPU stage runs now with the true query
        res = std::make_shared<CpuResult>();
        std::vector<float> qt(q, q + int64_t(shape_.H) * D);
        const int32_t K = current_k(r);
        const bool pre = sched_.pre();
        res->done = rt_.cpu().submit("hybridgen logits, layer " + std::to_string(layer),
                                     cpu_stage_work(layer, r, K, pre), {},
                                     [this, layer, r, qt = std::move(qt), res, K, pre] {
                                       cpu_stage(layer, r, qt.data(), K, pre, *res, Clock::now());
                                     });
      }
    }
    // Accelerator: resident logits (slot order) with the true query, meanwhile the CPU works.
    std::vector<float> lres(size_t(G) * size_t(used)), u, pslot(size_t(G) * size_t(used)), o1(size_t(G) * size_t(D)),
        o2(size_t(G) * size_t(D));
    std::vector<std::vector<float>> lres_all(static_cast<size_t>(Hkv));
    for (int g = 0; g < Hkv; ++g) {
      lres_all[size_t(g)].resize(size_t(G) * size_t(used));
      be_.group_logits(q + int64_t(g) * G * D, G, ring_.k(layer, r.seq) + g * ring_.head_stride(r.seq), used, D, scale,
                       lres_all[size_t(g)].data());
    }
    if (res) {
      const auto t0 = Clock::now();
      res->done.wait();
      waited_ += since(t0);
    }
    const int32_t K = res ? res->k : 0;
    for (int g = 0; g < Hkv; ++g) {
      // Token order: selected offloaded positions (sorted, all < n_off), then n_off .. n-1.
      u.assign(size_t(G) * size_t(K + n_res), 0.0f);
      for (int h = 0; h < G; ++h) {
        float* uh = u.data() + size_t(h) * size_t(K + n_res);
        for (int32_t i = 0; i < K; ++i) uh[i] = res->logits.as<float>()[(size_t(g) * G + size_t(h)) * size_t(K) + size_t(i)];
        for (int32_t j = 0; j < n_res; ++j) uh[K + j] = lres_all[size_t(g)][size_t(h) * size_t(used) + size_t((n_off + j) % R1)];
      }
      be_.softmax_rows(u.data(), G, K + n_res);
      // Value aggregation: selected V rows (gathered) + resident V (ring, slot order).
      std::fill(pslot.begin(), pslot.end(), 0.0f);
      std::vector<float> psel(size_t(G) * size_t(std::max(K, 1)));
      for (int h = 0; h < G; ++h) {
        const float* uh = u.data() + size_t(h) * size_t(K + n_res);
        for (int32_t i = 0; i < K; ++i) psel[size_t(h) * size_t(K) + size_t(i)] = uh[i];
        for (int32_t j = 0; j < n_res; ++j) pslot[size_t(h) * size_t(used) + size_t((n_off + j) % R1)] = uh[K + j];
      }
      be_.group_weighted_v(pslot.data(), G, ring_.v(layer, r.seq) + g * ring_.head_stride(r.seq), used, D, o1.data());
      if (K > 0) {
        be_.group_weighted_v(psel.data(), G, res->v.as<float>() + int64_t(g) * K * D, K, D, o2.data());
        for (size_t i = 0; i < o1.size(); ++i) o1[i] += o2[i];
      }
      std::copy(o1.begin(), o1.end(), out + int64_t(g) * G * D);
    }
  }

  Backend& be_;
  Runtime& rt_;
  const Model* model_;
  int32_t R_, page_;
  bool speculative_;
  int32_t sinks_;
  std::unique_ptr<PlacementPolicy> placement_;
  int64_t dram_kv_bytes_;
  SchedulerConfig sched_cfg_;
  FeedbackScheduler sched_;
  KvShape shape_;
  int B_ = 0;
  std::vector<int32_t> prompt_, cap_;
  KvStore ring_, kcpu_;
  int64_t max_pages_ = 0, far_pages_ = 0;
  std::vector<Allocation> vpages_;
  std::vector<std::shared_ptr<CpuResult>> pending_;
  std::vector<int32_t> offloaded_, last_pos_;  // per (layer, seq): tokens on the CPU side; newest position
  int32_t seen_pos_max_ = 0;
  bool in_step_ = false;
  Clock::time_point step_start_;
  std::mutex mu_;
  double t_cpu_ = 0, t_tx_ = 0, waited_ = 0;
  std::map<std::string, double> last_;
};

}  // namespace

StrategyInfo hybridgen_info() {
  using T = ParamSpec::Type;
  return {"hybridgen",
          "CPU logits for offloaded keys of the next layer while the accelerator works; merged softmax; feedback "
          "scheduler; semantic K/V mapping (HybridGen)",
          {{"gpu_kv_tokens", T::kInt, "1024", "tokens", "newest tokens resident on the accelerator per layer", {}},
           {"placement", T::kEnum, "semantic", "", "tiers of offloaded V pages", {"semantic", "interleave", "dram-only"}},
           {"interleave_dram_ratio", T::kFloat, "0.5", "ratio", "interleave: fraction of pages in dram", {}},
           {"dram_kv_bytes", T::kInt, "0", "bytes", "dram available to offloaded KV (0: what the dram tier has)", {}},
           {"page_tokens", T::kInt, "64", "tokens", "tokens per V page", {}},
           {"speculative_query", T::kBool, "true", "", "CPU logits for layer i+1 from layer i's input", {}},
           {"k", T::kEnum, "adaptive", "", "token count K: adapted by the scheduler or fixed", {"adaptive", "fixed"}},
           {"mode", T::kEnum, "adaptive", "", "selection: switched by the scheduler, or fixed post/pre", {"adaptive", "post", "pre"}},
           {"k_min", T::kInt, "128", "tokens", "lower bound of K (accuracy threshold)", {}},
           {"k_max", T::kInt, "4096", "tokens", "upper bound of K", {}},
           {"k_fixed", T::kInt, "128", "tokens", "K when k=fixed", {}},
           {"k_growth", T::kFloat, "2.0", "", "factor by which the scheduler raises or lowers K", {}},
           {"pre_sinks", T::kInt, "4", "tokens", "pre mode: first tokens always selected (rest: most recent)", {}}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<HybridGen>(c, p); }};
}

}  // namespace hg
