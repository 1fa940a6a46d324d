// HybridGen: set-up, the accelerator's merged attention, the end of a step (hybridgen.h).
#include "baselines/hybridgen/hybridgen.h"

#include <cstring>
#include <utility>

namespace hg {

HybridGen::HybridGen(const StrategyContext& ctx, const StrategyParams& p)
    : be_(ctx.backend),
      rt_(require_runtime(ctx, "hybridgen")),
      model_(ctx.model),
      kv_(ctx, p),
      gpu_kv_tokens_(int32_t(p.get_int("gpu_kv_tokens"))),
      ring_given_(p.given("gpu_kv_tokens")),
      page_(int32_t(p.get_int("page_tokens"))),
      speculative_(p.get_bool("speculative_query")),
      query_on_accel_(p.get("query_on") == "accelerator"),
      placement_(make_placement(p.get("placement"), p.get_float("interleave_dram_ratio"))),
      dram_kv_bytes_(p.get_int("dram_kv_bytes")),
      sched_cfg_(config(p)),
      sched_(sched_cfg_),
      k_min_ratio_(p.get_float("kv_ratio")),
      budget_(p.get_float("budget")),
      ring_(be_, rt_, kv_),
      stage_(be_, rt_, model_, kv_, int32_t(p.get_int("pre_sinks")), ring_) {
  if (k_min_ratio_ < 0 || k_min_ratio_ > 1) input_error("strategy hybridgen: kv_ratio must be in [0, 1]");
  if (gpu_kv_tokens_ < 1 || page_ < 1)
    input_error("strategy hybridgen: gpu_kv_tokens and page_tokens must be >= 1");
  if (speculative_ && !model_) input_error("strategy hybridgen: speculative_query needs the model's weights");
}

void HybridGen::begin(const KvShape& shape, std::span<const int32_t> capacity,
                      std::span<const int32_t> prompt_len) {
  shape_ = shape;
  B_ = int(capacity.size());
  prompt_.assign(prompt_len.begin(), prompt_len.end());
  int32_t resident = gpu_kv_tokens_;
  if (const int64_t budget = rt_.memory().kv_budget(); budget > 0) {
    // What fits stays on the accelerator: the ring (every layer and sequence) beside the
    // prefill's one layer of each whole sequence (attend_exact). A ring the request sized only
    // shrinks to fit; the default one fills the budget, up to the whole context.
    const int64_t row = 2 * kv_.bytes(int64_t(shape.H_kv) * shape.D);
    int64_t staging = 0;
    int32_t longest = 1;
    for (int32_t c : capacity) staging += row * c, longest = std::max(longest, c);
    const int64_t per_token = row * shape.n_layers * B_;
    resident = int32_t(std::clamp<int64_t>((budget - staging) / per_token - 1, 1,
                                           ring_given_ ? gpu_kv_tokens_ : std::max(gpu_kv_tokens_, longest)));
  }
  if (budget_ > 0 && !ring_given_ && !capacity.empty()) {
    // A matched budget: the ring holds at most half of the attended tokens of the shortest
    // sequence, the CPU selects the rest (k_min_for), so the attended fraction is the budget and
    // each of HybridGen's two halves has its share. A ring the request sized keeps its size.
    const int32_t shortest = *std::min_element(capacity.begin(), capacity.end());
    resident = std::min(resident, std::max<int32_t>(1, int32_t(std::floor(budget_ * shortest / 2))));
  }
  const int64_t dram_avail =
      dram_kv_bytes_ > 0 ? dram_kv_bytes_ : rt_.memory().ledger().available(Tier::kDram);
  ring_.reset(shape, capacity, resident, page_, *placement_, dram_avail);
  stage_.reset(shape, B_);
  pending_.assign(size_t(shape.n_layers) * size_t(B_), nullptr);
  deferred_.assign(size_t(shape.n_layers), nullptr);
  sched_ = FeedbackScheduler(sched_cfg_);
  if (k_min_ratio_ > 0 || budget_ > 0)
    set_k_min_for(prompt_len.empty() ? 1 : *std::min_element(prompt_len.begin(), prompt_len.end()));
  waited_ = 0;
  seen_pos_max_ = 0;
  in_step_ = false;
  last_ = {};
}

int64_t HybridGen::k_min_for(int64_t context) const {
  if (budget_ > 0) {
    // The shared budget counts the resident ring too: K_min is what the ring leaves of it.
    const int64_t resident = std::min<int64_t>(context, int64_t(ring_.resident_tokens()) + 1);
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
  if (ring_.resident_tokens() != gpu_kv_tokens_)
    e["gpu_kv_tokens"] = fmt::format("{}", ring_.resident_tokens());
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
  if (!prefill.empty())
    seen_pos_max_ = std::max(seen_pos_max_, ring_.attend_exact(layer, prefill, pi, q, scale, out));
  if (!decode.empty()) attend_decode(layer, decode, di, q, scale, out);
}

void HybridGen::end_step() {
  ring_.trim();  // every ring back to the R newest tokens
  if (!in_step_) return;
  in_step_ = false;
  // The accelerator's own time this step (its wait for CPU results excluded); modeled from the
  // forward's work when the runtime has a stage clock.
  const double t_gpu = rt_.stage_clock()
                           ? rt_.stage_seconds(StageKind::kAccelCompute, current_accel_work(), 0)
                           : std::max(0.0, since(step_start_) - waited_);
  int64_t n_off = 0;
  for (int b = 0; b < B_; ++b) n_off = std::max<int64_t>(n_off, ring_.offloaded(0, b));
  const CpuStage::Times st = stage_.take_times();
  const double t_cpu = st.cpu, t_tx = st.tx, t_query = st.query, t_fixed = st.fixed;
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
      if (ring_.last_pos(0, b) >= 0) shortest = std::min(shortest, ring_.last_pos(0, b));
    set_k_min_for(shortest + 1);
  }
  sched_.update(t_cpu, t_tx, t_gpu, n_off, t_fixed);
  waited_ = 0;
  last_["tokens_gpu"] = double(std::min<int64_t>(ring_.resident_tokens(), seen_pos_max_ + 1));
  last_["tokens_offloaded"] = double(n_off);
  // K as the scheduler set it, and the tokens a CPU stage selects with it (no more than offloaded).
  last_["K_effective"] = double(std::min<int64_t>(int64_t(last_["K"]), n_off));
  last_["v_pages_far"] = double(ring_.offloaded_kv().far_value_pages());
}

void HybridGen::fork(int32_t src, int32_t n, std::span<const int32_t> dst) {
  for (int l = 0; l < shape_.n_layers; ++l)
    HG_CHECK(!pending_[pidx(l, src)] && !deferred_[size_t(l)]);  // between steps: no stage in flight
  for (int32_t d : dst) ring_.copy_sequence(src, n, d);
}

void HybridGen::prepare(int layer, std::span<const TokenRow> rows, const float* x) {
  if (!speculative_) return;
  std::vector<size_t> need;  // decode rows with offloaded tokens only
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].pos >= prompt_[size_t(rows[i].seq)] && ring_.offloaded(layer, rows[i].seq) > 0)
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
    stage_.project_query(be_, layer, spec_x_.data(), M, pos.data(), spec_h_.data(), in_dev.data());
    add_accel_work(stage_.query_work(layer, M));
  } else {
    for (size_t j = 0; j < need.size(); ++j)
      be_.copy(in_dev.data() + int64_t(j) * d, x + int64_t(need[j]) * d, size_t(d) * 4);
  }
  auto from = std::make_shared<std::vector<float>>(size_t(M * n));
  const Event sent = rt_.transfers().run(
      Tier::kGpu, Tier::kDram, M * n * 4,
      [this, from, src = in_dev.data()] { be_.download(from->data(), src, from->size() * 4); }, {},
      query_on_accel_ ? "speculative query to host" : "layer input to host");
  if (query_on_accel_) stage_.add_query_seconds(since(t0), 0);
  std::vector<CpuStage::Row> stage;
  std::vector<int32_t> pos;
  bool behind = false;
  for (size_t j : need) {
    const TokenRow r = rows[j];
    auto res = stage_.fresh_result(layer, r.seq);
    pending_[pidx(layer, r.seq)] = res;
    stage.push_back({r, current_k(r), res});
    pos.push_back(r.pos);
    // The CPU queue runs stages in submission order. When the layer now running has no
    // speculation of its own, its CPU stage is submitted at its attention, after this call: this
    // stage then waits until that one is queued, so that it does not run ahead of the stage the
    // accelerator is about to wait for.
    behind |= layer > 0 && ring_.offloaded(layer - 1, r.seq) > 0 && !pending_[pidx(layer - 1, r.seq)];
  }
  // With query_on=cpu the layer's speculative queries are one projection over all M rows (W_q read
  // once per layer, not once per sequence), the first part of the stage.
  auto query = [this, layer, from, M, pos]() -> CpuStage::Queries {
    if (query_on_accel_) return from;
    const int64_t d = model_->hp.d_model;
    const auto tq = Clock::now();
    std::vector<float> h(size_t(M * d));
    auto q = std::make_shared<std::vector<float>>(size_t(M) * size_t(shape_.H) * size_t(shape_.D));
    stage_.project_query(rt_.cpu_backend(), layer, from->data(), M, pos.data(), h.data(), q->data());
    const double measured = since(tq);
    // The part of the CPU stage that does not scale with the tokens scored (the scheduler's
    // estimate of post mode from pre), on the stage clock when there is one.
    const StageWork work = stage_.query_work(layer, M, Tier::kDram);
    stage_.add_query_seconds(measured, rt_.stage_seconds(StageKind::kCpuCompute, work, measured));
    return q;
  };
  const std::string what =
      query_on_accel_ ? "hybridgen speculative logits, layer " : "hybridgen speculative q + logits, layer ";
  auto submit = [this, layer, what, stage = std::move(stage), sent, query, M, pre = sched_.pre()] {
    stage_.submit(layer, what + std::to_string(layer), stage, pre, query_on_accel_ ? 0 : M, sent, query);
  };
  if (behind)
    deferred_[size_t(layer)] = std::move(submit);
  else
    submit();
}

void HybridGen::submit_deferred(int layer) {
  if (layer >= shape_.n_layers) return;
  auto& d = deferred_[size_t(layer)];
  if (!d) return;
  auto f = std::move(d);
  d = nullptr;
  f();
}

void HybridGen::attend_decode(int layer, const std::vector<TokenRow>& rows, const std::vector<size_t>& idx,
                              const float* q, float scale, float* out) {
  const int Hkv = shape_.H_kv, D = shape_.D;
  const int64_t hd = int64_t(shape_.H) * D;
  const int32_t ring_slots = ring_.slots();
  submit_deferred(layer);  // normally queued already, after the previous layer's stage
  std::vector<std::shared_ptr<CpuResult>> res(rows.size());
  std::vector<CpuStage::Row> now;  // rows no speculation covered: their stage runs now, with the true query
  std::vector<size_t> now_idx;
  for (size_t j = 0; j < rows.size(); ++j) {
    const TokenRow& r = rows[j];
    seen_pos_max_ = std::max(seen_pos_max_, r.pos);
    if (ring_.offloaded(layer, r.seq) == 0) continue;
    res[j] = std::exchange(pending_[pidx(layer, r.seq)], nullptr);
    if (res[j]) continue;
    res[j] = stage_.fresh_result(layer, r.seq);
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
    stage_.submit(layer, "hybridgen logits, layer " + std::to_string(layer), std::move(now), sched_.pre(), 0,
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
    HG_CHECK(n - ring_.offloaded(layer, r.seq) == used);
    float* lb = resident_logits_.data() + j * per_row;
    be_.heads_logits(q + int64_t(idx[j]) * hd, shape_.H, Hkv, ring_.ring_k(layer, r.seq), ring_.head_stride(r.seq) / D,
                     used, D, scale, lb, kv_.dtype());
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
    m.Kb = ring_.ring_k(layer, r.seq), m.Vb = ring_.ring_v(layer, r.seq),
    m.ld_b = ring_.head_stride(r.seq) / D, m.nb = std::min(r.pos + 1, ring_slots), m.kv_dtype = kv_.dtype();
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
          {{"gpu_kv_tokens", T::kInt, "1024", "tokens", "newest tokens resident on the accelerator per layer (under an experiment's gpu_kv_bytes: as many as fit, at most this when set; under a budget, unless set: at most half the budget's tokens)", {}, 1, kNoMax},
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
