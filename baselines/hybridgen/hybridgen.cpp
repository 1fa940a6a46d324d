// HybridGen: set-up, the accelerator's merged attention, the end of a step (hybridgen.h).
#include "baselines/hybridgen/hybridgen.h"

#include <cstring>
#include <utility>

namespace hg {

HybridGen::HybridGen(const StrategyContext& ctx, const StrategyParams& p)
    : be_(ctx.backend),
      rt_(require_runtime(ctx, "hybridgen")),
      model_(ctx.model),
      resident_tokens_(int32_t(p.get_int("gpu_kv_tokens"))),
      gpu_kv_tokens_(resident_tokens_),
      page_(int32_t(p.get_int("page_tokens"))),
      speculative_(p.get_bool("speculative_query")),
      query_on_accel_(p.get("query_on") == "accelerator"),
      sinks_(int32_t(p.get_int("pre_sinks"))),
      placement_(make_placement(p.get("placement"), p.get_float("interleave_dram_ratio"))),
      dram_kv_bytes_(p.get_int("dram_kv_bytes")),
      sched_cfg_(config(p)),
      sched_(sched_cfg_),
      k_min_ratio_(p.get_float("kv_ratio")),
      budget_(p.get_float("budget")),
      kv_(ctx, p) {
  if (k_min_ratio_ < 0 || k_min_ratio_ > 1) input_error("strategy hybridgen: kv_ratio must be in [0, 1]");
  if (resident_tokens_ < 1 || page_ < 1)
    input_error("strategy hybridgen: gpu_kv_tokens and page_tokens must be >= 1");
  if (speculative_ && !model_) input_error("strategy hybridgen: speculative_query needs the model's weights");
}

void HybridGen::begin(const KvShape& shape, std::span<const int32_t> capacity,
                      std::span<const int32_t> prompt_len) {
  shape_ = shape;
  B_ = int(capacity.size());
  prompt_.assign(prompt_len.begin(), prompt_len.end());
  cap_.assign(capacity.begin(), capacity.end());
  resident_tokens_ = gpu_kv_tokens_;
  if (const int64_t budget = rt_.memory().kv_budget(); budget > 0) {
    // What fits stays on the accelerator: the ring (every layer and sequence) beside the
    // prefill's one layer of each whole sequence (attend_exact).
    const int64_t row = 2 * kv_.bytes(int64_t(shape.H_kv) * shape.D);
    int64_t staging = 0;
    for (int32_t c : cap_) staging += row * c;
    const int64_t per_token = row * shape.n_layers * B_;
    resident_tokens_ = int32_t(std::clamp<int64_t>((budget - staging) / per_token - 1, 1, gpu_kv_tokens_));
  }
  std::vector<int32_t> ring(static_cast<size_t>(B_)), off(static_cast<size_t>(B_));
  for (int b = 0; b < B_; ++b) {
    ring[size_t(b)] = std::min(resident_tokens_ + 1, cap_[size_t(b)]);
    off[size_t(b)] = std::max(1, cap_[size_t(b)] - resident_tokens_);
  }
  ring_.reset(shape, ring, &rt_.memory(), Tier::kGpu, kv_.dtype());
  const int64_t dram_avail =
      dram_kv_bytes_ > 0 ? dram_kv_bytes_ : rt_.memory().ledger().available(Tier::kDram);
  offloaded_kv_.reset(shape, off, page_, *placement_, dram_avail, rt_.memory(), kv_.dtype());
  pending_.assign(size_t(shape.n_layers) * size_t(B_), nullptr);
  results_.assign(pending_.size(), nullptr);
  deferred_.assign(size_t(shape.n_layers), nullptr);
  pool_.clear();
  pool_.resize(2 * size_t(B_));
  offloaded_.assign(pending_.size(), 0);
  last_pos_.assign(pending_.size(), -1);
  sched_ = FeedbackScheduler(sched_cfg_);
  if (k_min_ratio_ > 0 || budget_ > 0)
    set_k_min_for(prompt_len.empty() ? 1 : *std::min_element(prompt_len.begin(), prompt_len.end()));
  t_cpu_ = t_tx_ = t_query_ = t_fixed_ = waited_ = 0;
  seen_pos_max_ = 0;
  in_step_ = false;
  last_ = {};
}

int64_t HybridGen::k_min_for(int64_t context) const {
  if (budget_ > 0) {
    // The shared budget counts the resident ring too: K_min is what the ring leaves of it.
    const int64_t resident = std::min<int64_t>(context, int64_t(resident_tokens_) + 1);
    return std::max<int64_t>(1, int64_t(std::floor(budget_ * double(context))) - resident);
  }
  if (k_min_ratio_ > 0) return std::max<int64_t>(1, int64_t(std::floor(k_min_ratio_ * double(context))));
  return 0;  // k_min in tokens: the scheduler's alone
}

std::map<std::string, std::string> HybridGen::effective_params() const {
  std::map<std::string, std::string> e = kv_.effective();
  // K as the scheduler set it at the last step, and what a CPU stage selects with it.
  if (last_.count("K")) {
    e["K"] = fmt::format("{}", last_.at("K"));
    if (last_.count("K_effective")) e["K_effective"] = fmt::format("{}", last_.at("K_effective"));
  }
  e["k_min"] = fmt::format("{}", sched_.k_min());
  if (resident_tokens_ != gpu_kv_tokens_) e["gpu_kv_tokens"] = fmt::format("{}", resident_tokens_);
  return e;
}

void HybridGen::attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) {
  if (layer == 0 && !rows.empty() && rows[0].pos >= prompt_[size_t(rows[0].seq)] && !in_step_) {
    in_step_ = true;
    step_start_ = Clock::now();
  }
  std::vector<TokenRow> prefill, decode;
  std::vector<size_t> pi, di;
  for (size_t i = 0; i < rows.size(); ++i)
    (rows[i].pos < prompt_[size_t(rows[i].seq)] ? (prefill.push_back(rows[i]), pi)
                                                : (decode.push_back(rows[i]), di))
        .push_back(i);
  if (!prefill.empty()) attend_exact(layer, prefill, pi, q, scale, out);
  if (!decode.empty()) attend_decode(layer, decode, di, q, scale, out);
}

void HybridGen::end_step() {
  // Trim every ring back to the R newest tokens.
  for (int l = 0; l < shape_.n_layers; ++l) {
    std::vector<std::pair<int, int32_t>> leaving;
    for (int b = 0; b < B_; ++b) {
      int32_t& off = offloaded_[pidx(l, b)];
      while (last_pos_[pidx(l, b)] - resident_tokens_ + 1 > off) leaving.emplace_back(b, off++);
    }
    if (!leaving.empty()) offload(l, leaving, {}, nullptr, nullptr);
  }
  if (!in_step_) return;
  in_step_ = false;
  // The accelerator's own time this step (its wait for CPU results excluded); modeled from the
  // forward's work when the runtime has a stage clock.
  const double t_gpu = rt_.stage_clock()
                           ? rt_.stage_seconds(StageKind::kAccelCompute, current_accel_work(), 0)
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
  if (k_min_ratio_ > 0 || budget_ > 0) {  // the batch's shortest context (each row's own K_min: k_for())
    int32_t shortest = seen_pos_max_;
    for (int b = 0; b < B_; ++b)
      if (last_pos_[pidx(0, b)] >= 0) shortest = std::min(shortest, last_pos_[pidx(0, b)]);
    set_k_min_for(shortest + 1);
  }
  sched_.update(t_cpu, t_tx, t_gpu, n_off, t_fixed);
  waited_ = 0;
  last_["tokens_gpu"] = double(std::min<int64_t>(resident_tokens_, seen_pos_max_ + 1));
  last_["tokens_offloaded"] = double(n_off);
  // K as the scheduler set it, and the tokens a CPU stage selects with it (no more than offloaded).
  last_["K_effective"] = double(std::min<int64_t>(int64_t(last_["K"]), n_off));
  last_["v_pages_far"] = double(offloaded_kv_.far_value_pages());
}

void HybridGen::fork(int32_t src, int32_t n, std::span<const int32_t> dst) {
  const int Hkv = shape_.H_kv;
  const int64_t row = kv_.bytes(shape_.D);
  for (int32_t d : dst)
    for (int l = 0; l < shape_.n_layers; ++l) {
      HG_CHECK(!pending_[pidx(l, src)] && !deferred_[size_t(l)]);  // between steps: no stage in flight
      ring_.copy_tokens(l, src, d, std::min(n, resident_tokens_ + 1), &be_);
      const int32_t n_off = offloaded_[pidx(l, src)];
      // Offloaded rows go from src's tier to dst's (pages are placed per sequence: they may differ).
      for (Tier from : {Tier::kDram, Tier::kFar})
        for (Tier to : {Tier::kDram, Tier::kFar}) {
          auto key_here = [&](int32_t p) {
            return offloaded_kv_.key_tier(l, src, p) == from && offloaded_kv_.key_tier(l, d, p) == to;
          };
          auto value_here = [&](int32_t p) { return vtier(l, src, p) == from && vtier(l, d, p) == to; };
          int64_t rows = 0;
          for (int32_t p = 0; p < n_off; ++p) rows += key_here(p) + value_here(p);
          if (rows == 0) continue;
          rt_.transfers()
              .run(
                  from, to, rows * Hkv * row,
                  [&] {
                    for (int32_t p = 0; p < n_off; ++p)
                      for (int g = 0; g < Hkv; ++g) {
                        if (key_here(p))
                          std::memcpy(offloaded_kv_.key(l, d, g, p), offloaded_kv_.key(l, src, g, p), size_t(row));
                        if (value_here(p)) std::memcpy(vrow(l, d, g, p), vrow(l, src, g, p), size_t(row));
                      }
                  },
                  {}, "fork offloaded kv")
              .wait();
        }
      offloaded_[pidx(l, d)] = n_off;
      last_pos_[pidx(l, d)] = last_pos_[pidx(l, src)];
    }
}

void HybridGen::attend_decode(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& idx,
                              const float* q, float scale, float* out) {
  const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
  const int64_t hd = int64_t(shape_.H) * D;
  const int32_t ring_slots = resident_tokens_ + 1;
  submit_deferred(layer);  // normally queued already, after the previous layer's stage
  std::vector<std::shared_ptr<CpuResult>> res(rows.size());
  std::vector<StageRow> now;  // rows no speculation covered: their stage runs now, with the true query
  std::vector<size_t> now_idx;
  for (size_t j = 0; j < rows.size(); ++j) {
    const TokenRow& r = rows[j];
    seen_pos_max_ = std::max(seen_pos_max_, r.pos);
    if (offloaded_[pidx(layer, r.seq)] == 0) continue;
    res[j] = std::exchange(pending_[pidx(layer, r.seq)], nullptr);
    if (res[j]) continue;
    res[j] = fresh_result(layer, r.seq);
    now.push_back({r, current_k(r), res[j]});
    now_idx.push_back(idx[j]);
  }
  if (!now.empty()) {
    // The true queries to the host (q stays valid: this call waits for the stage); queueing the
    // transfer on a GPU also waits for the work queued so far.
    auto qt = std::make_shared<std::vector<float>>(now.size() * size_t(hd));
    const Event sent = rt_.transfers().run(
        Tier::kGpu, Tier::kDram, int64_t(qt->size()) * 4,
        [this, qt, q, now_idx, hd] {
          for (size_t j = 0; j < now_idx.size(); ++j)
            be_.download(qt->data() + int64_t(j) * hd, q + int64_t(now_idx[j]) * hd, size_t(hd) * 4);
        },
        {}, "query to host");
    submit_cpu_stage(layer, "hybridgen logits, layer " + std::to_string(layer), std::move(now), sched_.pre(), 0,
                     sent, [qt] { return qt; });
  }
  submit_deferred(layer + 1);
  // The accelerator's logits of every row's resident tokens (true query) while the CPU stage
  // finishes; row j's at j·H·ring_slots.
  const size_t per_row = size_t(shape_.H) * size_t(ring_slots);
  if (resident_logits_.size() < rows.size() * per_row) resident_logits_ = BackendArray<float>(be_, rows.size() * per_row);
  for (size_t j = 0; j < rows.size(); ++j) {
    const TokenRow& r = rows[j];
    const int32_t n = r.pos + 1, used = std::min(n, ring_slots);
    // The ring holds exactly the resident tokens: all of them before any offload, afterwards the
    // R trimmed by the last end_step plus this step's token.
    HG_CHECK(n - offloaded_[pidx(layer, r.seq)] == used);
    float* lb = resident_logits_.data() + j * per_row;
    for (int g = 0; g < Hkv; ++g)
      be_.group_logits(q + int64_t(idx[j]) * hd + int64_t(g) * G * D, G,
                       at(ring_.k_raw(layer, r.seq), g * ring_.head_stride(r.seq)), used, D, scale,
                       lb + int64_t(g) * G * used, kv_.dtype());
  }
  const auto t0 = Clock::now();
  for (const auto& r : res)
    if (r) {
      r->done.wait();
      // The merge reads the logits and V rows those transfers brought: waiting on each (done by
      // now) makes the accelerator's next segment follow them in the modeled replay too.
      for (const Event& e : r->arrived) e.wait();
    }
  waited_ += since(t0);
  // Per row, one softmax over the CPU's logits of the selected offloaded tokens and the resident
  // logits, then both value sums.
  for (size_t j = 0; j < rows.size(); ++j) {
    const TokenRow& r = rows[j];
    Backend::MergedAttention m;
    m.H = shape_.H, m.H_kv = Hkv, m.D = D, m.scale = scale, m.q = q + int64_t(idx[j]) * hd;
    m.lb = resident_logits_.data() + j * per_row;
    if (res[j]) m.la = res[j]->logits, m.Va = res[j]->v, m.na = res[j]->k;
    m.Kb = ring_.k_raw(layer, r.seq), m.Vb = ring_.v_raw(layer, r.seq), m.ld_b = ring_.head_stride(r.seq) / D,
    m.nb = std::min(r.pos + 1, ring_slots), m.kv_dtype = kv_.dtype();
    m.out = out + int64_t(idx[j]) * hd;
    be_.merged_attention(m);
  }
}

StrategyInfo hybridgen_info() {
  using T = ParamSpec::Type;
  // clang-format off
  return {"hybridgen",
          "CPU logits for offloaded keys of the next layer while the accelerator works; merged softmax; feedback "
          "scheduler; semantic K/V mapping (HybridGen)",
          {{"gpu_kv_tokens", T::kInt, "1024", "tokens", "newest tokens resident on the accelerator per layer", {}, 1, kNoMax},
           {"placement", T::kEnum, "semantic", "", "tiers of offloaded V pages", {"semantic", "interleave", "dram-only"}},
           {"interleave_dram_ratio", T::kFloat, "0.5", "ratio", "interleave: fraction of pages in dram", {}, 0, 1},
           {"dram_kv_bytes", T::kInt, "0", "bytes", "dram available to offloaded KV (0: what the dram tier has)", {}, 0, kNoMax},
           {"page_tokens", T::kInt, "64", "tokens", "tokens per V page", {}, 1, kNoMax},
           {"speculative_query", T::kBool, "true", "", "CPU logits for layer i+1 from layer i's input", {}},
           {"query_on", T::kEnum, "cpu", "", "speculative query projected by the CPU stage (the paper) or the accelerator",
            {"cpu", "accelerator"}},
           {"k", T::kEnum, "adaptive", "", "token count K: adapted by the scheduler or fixed", {"adaptive", "fixed"}},
           {"mode", T::kEnum, "adaptive", "", "selection: switched by the scheduler, or fixed post/pre", {"adaptive", "post", "pre"}},
           {"k_min", T::kInt, "128", "tokens", "lower bound of K (accuracy threshold)", {}, 1, kNoMax},
           {"kv_ratio", T::kFloat, "0", "ratio", "instead of k_min: K_min is this fraction of the current context (0: k_min)", {}, 0, 1},
           {"k_max", T::kInt, "4096", "tokens", "upper bound of K", {}, 1, kNoMax},
           {"k_fixed", T::kInt, "128", "tokens", "K when k=fixed", {}, 1, kNoMax},
           {"k_growth", T::kFloat, "2.0", "", "factor by which the scheduler raises or lowers K", {}, 1, kNoMax},
           {"pre_sinks", T::kInt, "4", "tokens", "pre mode: first tokens always selected (rest: most recent)", {}, 0, kNoMax}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<HybridGen>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/true, /*native_16bit_kv=*/true};
  // clang-format on
}

}  // namespace hg
