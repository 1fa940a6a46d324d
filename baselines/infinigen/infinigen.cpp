// `infinigen` — speculative KV fetching (snu-comparch/InfiniGen). The full KV cache lives on `dram`
// (a PagedKvStore with every page there) and is never evicted. Offline skewing: per layer and KV
// head, an orthogonal matrix A from the SVD (Eigen) of the calibration prompt's queries (the
// group's heads) and keys, after RoPE for RoPE models; q·k = (qA)·(kA). The calibration prompt is
// the first `calib_tokens` (2048) tokens of the run's first prompt (the authors warm up once, on
// the first book of PG-19). At prefill the `partial_ratio` columns with the largest Σ|qA| + Σ|kA|
// (the paper's rule; the authors' code uses |Q| only, InfiniGen#7) form a partial key cache on the
// accelerator, appended every step. Speculation for layer i+1 runs while layer i computes: the
// partial query comes from layer i's attention input (layer i's norm), layer i+1's W_q (+ bias) and
// RoPE, skewed and sliced (with RoPE the rotation sits between W_q and A, so the full q is formed
// and then projected — the same numbers as a pre-multiplied partial W_q without RoPE). Per query
// head, tokens whose partial logit, scaled by 1/√D as attention scales it, exceeds max − alpha are
// counted; the count is averaged over heads and capped at max_kv_ratio of the current length; that
// many top tokens per KV head (by the group's max partial logit — GQA generalisation) have their K
// and V rows gathered from dram onto the accelerator, where layer i+1 attends over them plus the
// current token. Layers 0 and 1 load their full KV, as the authors' code does. Prefill attention is
// exact.
#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>

#include "baselines/common.h"
#include "baselines/speculation.h"
#include "engine/kv/kv_store.h"
#include "engine/kv/paged_kv_store.h"
#include "engine/kv/placement.h"
#include "selectors/logit_topk.h"

namespace hg {

// The α rule: per head, #tokens with partial logit > max − alpha; mean over heads; capped at
// max_ratio·n (at least 1). logits [H, n].
int32_t infinigen_fetch_count(Backend& host, const float* logits, int H, int64_t n, double alpha,
                              double max_ratio) {
  if (n == 0) return 0;
  int64_t total = 0;
  for (int h = 0; h < H; ++h) {
    const float* l = logits + int64_t(h) * n;
    const double threshold = double(host.max_value(l, n)) - alpha;
    int64_t above = 0;  // an integer count, so that the loop vectorises
    for (int64_t t = 0; t < n; ++t) above += double(l[t]) > threshold;
    total += above;
  }
  const double avg = double(total) / H;
  const double cap = std::max(1.0, std::floor(max_ratio * double(n)));
  return int32_t(std::max(1.0, std::min(std::floor(avg), cap)));
}

namespace {

// The skew is offline in the authors' code (computed once, before any timed run). hgbench computes
// it from the calibration prompt's queries and keys in a run's prefill and keeps it for the
// process, keyed by those exact inputs: a warm-up run pays the SVD, and the timed runs after it
// (other repeats, lengths and budgets over the same calibration prefix) reuse it.
class SkewCache {
 public:
  static SkewCache& instance() {
    static SkewCache c;
    return c;
  }
  // A layer's calibration (its queries and keys as collected, by content) and the skew's shape;
  // find() gives the kept columns [dp, D] per KV head, or nothing.
  struct Key {
    size_t q_hash, k_hash, q_size, k_size;
    int H_kv, D, G, dp;
    auto operator<=>(const Key&) const = default;
  };
  static Key key(const std::vector<float>& q, const std::vector<float>& k, int H_kv, int D, int G, int dp) {
    auto h = [](const std::vector<float>& v) {
      return std::hash<std::string_view>{}(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    };
    return Key{h(q), h(k), q.size(), k.size(), H_kv, D, G, dp};
  }
  std::optional<std::vector<std::vector<float>>> find(const Key& k) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = map_.find(k);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void put(const Key& k, std::vector<std::vector<float>> w) {
    std::lock_guard<std::mutex> l(mu_);
    if (map_.size() >= kMaxLayers) map_.clear();  // bounded: a few models' layers
    map_.emplace(k, std::move(w));
  }

 private:
  static constexpr size_t kMaxLayers = 1024;
  std::mutex mu_;
  std::map<Key, std::vector<std::vector<float>>> map_;
};

class InfiniGen final : public KvStrategy {
 public:
  InfiniGen(const StrategyContext& ctx, const StrategyParams& p)
      : be_(ctx.backend),
        rt_(require_runtime(ctx, "infinigen")),
        model_(ctx.model),
        partial_ratio_(p.get_float("partial_ratio")),
        alpha_(p.get_float("alpha")),
        dry_fetch_ratio_(p.get_float("dry_fetch_ratio")),
        max_kv_ratio_(p.get_float("max_kv_ratio")),
        full_layers_(int(p.get_int("full_layers"))),
        calib_tokens_(int32_t(p.get_int("calib_tokens"))),
        kv_(ctx, p) {
    // The shared budget caps the fetched share (and sets it in dry runs, which have no logits).
    if (const double b = p.get_float("budget"); b > 0) max_kv_ratio_ = dry_fetch_ratio_ = b;
    if (!model_) input_error("strategy infinigen needs the model's weights");
    if (calib_tokens_ < 0)
      input_error("strategy infinigen: calib_tokens must be >= 0 (0: the whole first prompt)");
    if (!(partial_ratio_ > 0 && partial_ratio_ <= 1) || !(max_kv_ratio_ > 0 && max_kv_ratio_ <= 1))
      input_error("strategy infinigen: partial_ratio and max_kv_ratio must be in (0, 1]");
  }
  ~InfiniGen() override {
    try {
      wait_fetches();
    } catch (...) {  // a failed fetch was reported to its reader already, or has none left
    }
    forget_skew();
  }
  std::string_view name() const override { return "infinigen"; }
  // The KV store, the full loads and the fetched rows are of kv_dtype; the partial key cache is F32
  // (the skew's product), a partial_ratio share of the key bytes.
  DType kv_dtype() const override { return kv_.dtype(); }
  std::map<std::string, std::string> effective_params() const override { return kv_.effective(); }
  // Prefill: every visible key. Decode: the full layers' keys (at least layer 0's), the fetched
  // share of the others' (the last fetch's fraction of the length).
  int64_t accel_attention_keys(const TokenRow& r) const override {
    if (r.pos < prompt_[size_t(r.seq)]) return int64_t(r.pos) + 1;
    // Layer 0 has no layer before it to speculate from: it always loads its full KV.
    const double L = double(shape_.n_layers), full = std::min(std::max(double(full_layers_), 1.0), L);
    return int64_t(std::llround(double(r.pos + 1) * (full + (L - full) * last_fetch_frac_) / L));
  }

  void begin(const KvShape& shape, std::span<const int32_t> capacity,
             std::span<const int32_t> prompt_len) override {
    wait_fetches();  // a fetch still in flight writes into the kept buffers
    attended_sum_ = last_attended_ = 0;
    shape_ = shape;
    B_ = int(capacity.size());
    prompt_.assign(prompt_len.begin(), prompt_len.end());
    // The whole cache on dram, as its authors keep it (dram-only placement: every page there).
    store_.reset(shape, capacity, kPageTokens, *dram_only_, rt_.memory().ledger().available(Tier::kDram),
                 rt_.memory(), kv_.dtype());
    dp_ = std::max(1, int(std::lround(partial_ratio_ * shape.D)));
    // The skew is calibrated once, on the first prompt this instance sees (the authors calibrate
    // once, offline): later batches of the same shape keep it, and their partial keys are built as
    // their rows are appended.
    const bool keep = calibrated() && skew_.size() == size_t(shape.n_layers) * size_t(shape.H_kv) &&
                      skew_shape_ == std::array<int, 3>{shape.H_kv, shape.D, dp_};
    if (!keep) {
      forget_skew();
      skew_.clear();
      skew_.resize(size_t(shape.n_layers) * size_t(shape.H_kv));
      skew_stacked_.clear();
      skew_stacked_.resize(size_t(shape.n_layers));
      skew_shape_ = {shape.H_kv, shape.D, dp_};
    }
    calib_q_.assign(size_t(shape.n_layers), {});
    calib_k_.assign(size_t(shape.n_layers), {});
    // Partial key cache [H_kv, cap, dp] per (layer, seq) on the accelerator.
    std::vector<int32_t> cap(capacity.begin(), capacity.end());
    partial_.reset(KvShape{shape.n_layers, shape.H, shape.H_kv, dp_, nullptr}, cap, &rt_.memory(),
                   Tier::kGpu);
    fetch_.assign(size_t(shape.n_layers) * size_t(B_), nullptr);
    fetch_pool_.clear();
    fetch_pool_.resize(size_t(2) * size_t(B_));
    full_pool_.clear();
    full_pool_.resize(size_t(B_));
    last_fetch_ = 0;
  }

  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override {
    const int Hkv = shape_.H_kv, D = shape_.D;
    new_k_ = k;
    new_v_ = v;
    const size_t n = rows.size() * size_t(Hkv) * size_t(D);
    const float* kh = nullptr;  // the rows' keys on the host, once written back
    rt_.transfers()
        .run(
            Tier::kGpu, Tier::kDram, kv_.bytes(int64_t(n)) * 2,
            [&] {
              kh = host_view(be_, k, n, host_k_);
              store_.write(layer, rows, kh, host_view(be_, v, n, host_v_));
            },
            {}, "kv writeback")
        .wait();
    if (calibrating(rows) && !rt_.dry())  // a dry run's skew needs no keys (its transfers are charged)
      for (size_t i = 0; i < rows.size(); ++i)
        if (calibration_row(rows[i]))
          calib_k_[size_t(layer)].insert(calib_k_[size_t(layer)].end(), kh + int64_t(i) * Hkv * D,
                                         kh + int64_t(i + 1) * Hkv * D);
    if (ready(layer))
      for (size_t i = 0; i < rows.size(); ++i) append_partial(layer, rows[i], k + int64_t(i) * Hkv * D);
  }

  void prepare(int layer, std::span<const TokenRow> rows, const float* x) override {
    if (layer < full_layers_ || !ready(layer)) return;
    // The decode rows' speculative queries in one projection (W_q read once per layer, as the
    // authors' code projects the batch), each row's selection, then one gather for all of them
    // (one transfer per layer, not per row).
    std::vector<size_t> need;
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].pos >= prompt_[size_t(rows[i].seq)]) need.push_back(i);
    if (need.empty()) return;
    const int64_t d = model_->hp.d_model, M = int64_t(need.size()), hd = int64_t(shape_.H) * shape_.D;
    const float* xs = x;
    if (need.size() != rows.size()) {  // prefill rows in the forward too: the decode rows' inputs gathered
      if (spec_x_.size() < size_t(M * d)) spec_x_ = BackendArray<float>(be_, size_t(M * d));
      for (int64_t j = 0; j < M; ++j)
        be_.copy(spec_x_.data() + j * d, x + int64_t(need[size_t(j)]) * d, size_t(d) * 4);
      xs = spec_x_.data();
    }
    if (spec_h_.size() < size_t(M * d)) spec_h_ = BackendArray<float>(be_, size_t(M * d));
    if (spec_q_.size() < size_t(M * hd)) spec_q_ = BackendArray<float>(be_, size_t(M * hd));
    std::vector<int32_t> pos;
    for (size_t i : need) pos.push_back(rows[i].pos);
    speculative_query(be_, *model_, layer - 1, layer, xs, M, pos.data(), shape_.rope, spec_h_.data(),
                      spec_q_.data());
    std::vector<Gather> gathers;
    for (int64_t j = 0; j < M; ++j)
      gathers.push_back(speculate(layer, rows[need[size_t(j)]], spec_q_.data() + j * hd));
    const int Hkv = shape_.H_kv, D = shape_.D;
    int64_t bytes = 0, n_rows = 0;
    for (const Gather& g : gathers) {
      bytes += int64_t(2) * kv_.bytes(int64_t(Hkv) * g.f->n * D);
      for (const auto& sel : g.sel)
        n_rows += gathered_runs(sel) + store_.value_runs(sel);  // K rows are one block
    }
    auto fetch = [this, gathers, layer, Hkv, D] {
      // Every row's selected K and V of every head in one copy_rows.
      thread_local RowCopies copies;
      copies.clear();
      for (const Gather& gt : gathers)
        for (int g = 0; g < Hkv; ++g) {
          const int32_t n = int32_t(gt.sel[size_t(g)].size());
          const int64_t dst = kv_.bytes(int64_t(g) * (gt.f->n + 1) * D);  // a row left per head for the current token
          store_.key_rows(layer, gt.seq, g, gt.sel[size_t(g)].data(), n, gt.f->k + dst, copies);
          store_.value_rows(layer, gt.seq, g, gt.sel[size_t(g)].data(), n, gt.f->v + dst, copies);
        }
      copies.run(be_, store_.row_bytes());
      be_.synchronize();  // the attention reading them runs on another thread's stream
    };
    const Event done =
        rt_.transfers().run_gather(Tier::kDram, Tier::kGpu, bytes, n_rows, std::move(fetch), {}, "speculative kv fetch");
    for (const Gather& g : gathers) g.f->done = done;
  }

  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override {
    const int Hkv = shape_.H_kv, D = shape_.D, H = shape_.H;
    const int64_t hd = int64_t(H) * D;
    if (calibrating(rows)) {  // the calibration prompt's queries, kept on the host for the SVD
      // Only the span of calibration rows goes to the host (calib_tokens of them, not the prompt's).
      size_t i0 = rows.size(), i1 = 0;
      for (size_t i = 0; i < rows.size(); ++i)
        if (calibration_row(rows[i])) i0 = std::min(i0, i), i1 = i + 1;
      const float* qh = nullptr;
      rt_.transfers()
          .run(
              Tier::kGpu, Tier::kDram, int64_t(i1 - i0) * hd * 4,
              [&] { qh = host_view(be_, q + int64_t(i0) * hd, (i1 - i0) * size_t(hd), host_q_); }, {},
              "calibration queries to host")
          .wait();
      for (size_t i = i0; i < i1 && !rt_.dry(); ++i)
        if (calibration_row(rows[i]))
          calib_q_[size_t(layer)].insert(calib_q_[size_t(layer)].end(), qh + int64_t(i - i0) * hd,
                                         qh + int64_t(i - i0 + 1) * hd);
    }
    // Full-KV rows (layers < full_layers, prefill, before calibration) share one load per sequence,
    // into that sequence's buffers (kept between calls: no allocation, page faults or zeroing of
    // the whole cache per layer and step).
    std::map<int32_t, int32_t> full_n;
    for (size_t i = 0; i < rows.size(); ++i) {
      const TokenRow r = rows[i];
      const bool spec = r.pos >= prompt_[size_t(r.seq)] && fetch_[size_t(layer) * size_t(B_) + size_t(r.seq)];
      if (!spec) full_n[r.seq] = std::max(full_n[r.seq], r.pos + 1);
    }
    own_rows_.assign(size_t(B_), false);
    std::vector<std::pair<int32_t, int32_t>> loads;  // (seq, tokens): one transfer for all of them
    int64_t load_bytes = 0;
    for (auto& [seq, n] : full_n) {
      Buffers& fb = full_pool_[size_t(seq)];
      grow(fb.k, kv_.bytes(int64_t(Hkv) * n * D));
      grow(fb.v, kv_.bytes(int64_t(Hkv) * n * D));
      char *kb = fb.k.as<char>(), *vb = fb.v.as<char>();
      if (write_own_kv(be_, rows, {}, seq, n, new_k_, new_v_, Hkv, D, kb, vb, kv_.dtype())) {  // a whole-prompt prefill
        own_rows_[size_t(seq)] = true;
        continue;
      }
      loads.emplace_back(seq, n);
      load_bytes += int64_t(2) * kv_.bytes(int64_t(Hkv) * n * D);
    }
    if (!loads.empty())
      rt_.transfers()
          .run(
              Tier::kDram, Tier::kGpu, load_bytes,
              [&] {
                for (auto [sq, nn] : loads) {
                  const size_t pitch = size_t(kv_.bytes(int64_t(nn) * shape_.D));
                  store_.upload_keys(be_, Tier::kDram, layer, sq, nn, full_pool_[size_t(sq)].k.as<char>(),
                                     pitch);
                  store_.upload_values(be_, Tier::kDram, layer, sq, nn, full_pool_[size_t(sq)].v.as<char>(),
                                       pitch);
                }
              },
              {}, "full kv load")
          .wait();
    for (size_t i = 0; i < rows.size(); ++i) {
      const TokenRow r = rows[i];
      auto& f = fetch_[size_t(layer) * size_t(B_) + size_t(r.seq)];
      std::vector<AttnRow> ar(1);
      const bool spec = r.pos >= prompt_[size_t(r.seq)] && f;
      if (spec) {  // the speculatively fetched rows plus the current token
        f->done.wait();
        // Each head's fetched rows, then the current token's in the row the fetch left after them.
        const int32_t n = f->n + 1;
        char *kb = f->k, *vb = f->v;
        const int32_t cur = f->n;
        be_.write_kv(new_k_ + int64_t(i) * Hkv * D, 1, Hkv, D, &cur, kb, int64_t(n) * D, kv_.dtype());
        be_.write_kv(new_v_ + int64_t(i) * Hkv * D, 1, Hkv, D, &cur, vb, int64_t(n) * D, kv_.dtype());
        ar[0] = AttnRow{kb, vb, int64_t(n) * D, n};
        last_fetch_ = f->n;
        f = nullptr;
      } else {
        const int32_t n = full_n[r.seq];
        const Buffers& fb = full_pool_[size_t(r.seq)];
        ar[0] = AttnRow{fb.k.as<char>(), fb.v.as<char>(), int64_t(n) * D, r.pos + 1};
      }
      be_.attention(attention_args(shape_, ar, q + int64_t(i) * hd, scale, out + int64_t(i) * hd, kv_.dtype()));
      if (r.pos >= prompt_[size_t(r.seq)]) attended_sum_ += ar[0].n_keys;
    }
    // The end of the calibration prompt: skew this layer and build its partial key cache.
    for (auto& r : rows)
      if (r.seq == 0 && r.pos == calib_len() - 1 && !ready(layer)) calibrate(layer);
  }

  std::map<std::string, double> step_stats() const override {
    // skew_svd_layers: layers whose skew this run computed (0 when a warm-up's are reused).
    return {{"fetched_tokens", double(last_fetch_)}, {"skew_svd_layers", double(svd_layers_)}};
  }
  // The keys each layer attended in the step that ended, counted as they were fetched (the fetch
  // counts follow the speculation's logits, known only once it ran).
  void end_step() override {
    last_attended_ = attended_sum_ / std::max(1, shape_.n_layers);
    attended_sum_ = 0;
  }
  std::optional<AttendedKeys> last_attended() const override { return AttendedKeys{last_attended_, 0}; }
  bool needs_prompt_attention() const override { return true; }
  // The dram store and the partial key cache (fetches live within a step).
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override {
    wait_fetches();
    for (int32_t d : dst)
      for (int l = 0; l < shape_.n_layers; ++l) {
        HG_CHECK(!fetch_[size_t(l) * size_t(B_) + size_t(src)]);
        store_.copy_tokens(l, src, d, n);
        if (ready(l)) partial_.copy_tokens(l, src, d, n, &be_);
      }
  }

 private:
  struct Fetch {
    int32_t n = 0;
    char *k = nullptr, *v = nullptr;  // gpu: [H_kv][n][D] of kv_dtype, in fetch_pool_
    Event done;
  };
  struct Buffers {
    Allocation k, v;
  };
  void wait_fetches() {
    for (auto& f : fetch_)
      if (f) f->done.wait();
  }
  void forget_skew() {
    for (const Weight& w : skew_)
      if (!w.empty()) be_.forget_weight(w);
  }
  void grow(Allocation& a, int64_t bytes) { grow_allocation(rt_.memory(), Tier::kGpu, a, bytes, true); }
  bool ready(int layer) const { return !skew_[size_t(layer) * size_t(shape_.H_kv)].empty(); }
  // A prompt's keys [H_kv, n, D] of kv_dtype in the accelerator's memory as F32, for the skew's
  // matmul: k itself when F32, else converted into prompt_k32_.
  const float* keys_f32(const void* k, int32_t n) {
    if (kv_.dtype() == DType::kF32) return static_cast<const float*>(k);
    const int64_t elems = int64_t(shape_.H_kv) * n * shape_.D;
    grow(prompt_k32_, elems * 4);
    be_.convert_to_f32(k, kv_.dtype(), elems, prompt_k32_.as<float>());
    return prompt_k32_.as<float>();
  }
  // The calibration prompt: the first calib_tokens tokens of sequence 0's prompt (all of it for 0).
  // Its queries and keys are held per layer until that layer calibrates: bounded, a 32K prompt of
  // the 8B shape would otherwise hold 20 GB of them.
  int32_t calib_len() const { return calib_tokens_ > 0 ? std::min(prompt_[0], calib_tokens_) : prompt_[0]; }
  bool calibration_row(const TokenRow& r) const { return r.seq == 0 && r.pos < calib_len(); }
  bool calibrated() const {
    return !skew_.empty() && std::all_of(skew_.begin(), skew_.end(), [](const Weight& w) { return !w.empty(); });
  }
  bool calibrating(std::span<const TokenRow> rows) const {
    if (calibrated()) return false;
    for (auto& r : rows)
      if (calibration_row(r)) return true;
    return false;
  }

  void calibrate(int layer) {
    const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
    const auto& qs = calib_q_[size_t(layer)];
    const auto& ks = calib_k_[size_t(layer)];
    const int64_t T = int64_t(ks.size()) / (int64_t(Hkv) * D);
    std::optional<std::vector<std::vector<float>>> kept;
    if (rt_.dry()) {
      // A dry run has no values to decompose: the first dp unit vectors stand in (its fetch counts
      // are the documented fraction, whatever the skew), and nothing is hashed or factorised.
      kept.emplace(size_t(Hkv), std::vector<float>(size_t(dp_) * size_t(D), 0.0f));
      for (auto& w : *kept)
        for (int c = 0; c < dp_; ++c) w[size_t(c) * size_t(D) + size_t(c)] = 1.0f;
    } else {
      const SkewCache::Key key = SkewCache::key(qs, ks, Hkv, D, G, dp_);
      kept = SkewCache::instance().find(key);
      if (!kept) {
        ++svd_layers_;
        kept = skew_columns(qs, ks, T);
        SkewCache::instance().put(key, *kept);
      }
    }
    for (int g = 0; g < Hkv; ++g)
      skew_[size_t(layer) * size_t(Hkv) + size_t(g)] =
          convert_weight(DType::kF32, (*kept)[size_t(g)].data(), DType::kF32, {dp_, D});
    std::vector<float> stacked;
    for (auto& w : *kept) stacked.insert(stacked.end(), w.begin(), w.end());
    skew_stacked_[size_t(layer)] = convert_weight(DType::kF32, stacked.data(), DType::kF32, {int64_t(Hkv) * dp_, D});
    calib_q_[size_t(layer)].clear();
    calib_k_[size_t(layer)].clear();
    build_partial_cache(layer);
  }

  // Per KV head, the skew's kept columns as a [dp, D] weight's rows, from the calibration's queries
  // qs [T, H, D] and keys ks [T, H_kv, D].
  std::vector<std::vector<float>> skew_columns(const std::vector<float>& qs, const std::vector<float>& ks,
                                               int64_t T) const {
    const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
    std::vector<std::vector<float>> kept(static_cast<size_t>(Hkv));
    for (int g = 0; g < Hkv; ++g) {
      Eigen::MatrixXf M(T * (G + 1), D);
      for (int64_t t = 0; t < T; ++t) {
        for (int h = 0; h < G; ++h)
          for (int d = 0; d < D; ++d) M(t * (G + 1) + h, d) = qs[size_t((t * shape_.H + g * G + h) * D + d)];
        for (int d = 0; d < D; ++d) M(t * (G + 1) + G, d) = ks[size_t((t * Hkv + g) * D + d)];
      }
      // A = the right singular vectors of M, as the eigenvectors of the D×D Gram matrix MᵀM (in
      // double, so that squaring the singular values loses nothing at F32): D×D orthogonal also
      // when the calibration has fewer rows than D (a short prompt). The columns' order and signs
      // do not matter: they are ranked below, and a kept column's sign cancels in q_c·k_c. A
      // symmetric eigensolver also compiles in a third of BDCSVD's time.
      const Eigen::MatrixXd M64 = M.cast<double>();
      const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(M64.transpose() * M64);
      const Eigen::MatrixXf A = eig.eigenvectors().cast<float>();
      // Columns with the largest Σ|qA| + Σ|kA|.
      const Eigen::MatrixXf S = M * A;
      std::vector<std::pair<float, int>> mag(static_cast<size_t>(D));
      for (int c = 0; c < D; ++c) mag[size_t(c)] = {-S.col(c).cwiseAbs().sum(), c};
      std::sort(mag.begin(), mag.end());
      // The skew as a [dp, D] weight: row c is the column of A kept c-th, so that a row's partial
      // vector is one product with it on the accelerator (x · Wᵀ).
      std::vector<float>& w = kept[size_t(g)];
      w.resize(size_t(dp_) * size_t(D));
      for (int c = 0; c < dp_; ++c)
        for (int d = 0; d < D; ++d) w[size_t(c) * size_t(D) + size_t(d)] = A(d, mag[size_t(c)].second);
    }
    return kept;
  }

  void build_partial_cache(int layer) {
    const int Hkv = shape_.H_kv, D = shape_.D;
    // Partial keys of every stored token of every sequence: its prompt's keys back on the
    // accelerator, skewed there.
    for (int b = 0; b < B_; ++b) {
      const int32_t n = prompt_[size_t(b)];
      if (size_t(b) < own_rows_.size() && own_rows_[size_t(b)]) {  // this layer's prompt keys are on the accelerator
        const float* kb = keys_f32(full_pool_[size_t(b)].k.as<char>(), n);
        for (int g = 0; g < Hkv; ++g)
          be_.matmul(kb + int64_t(g) * n * D, n, skew_[size_t(layer) * size_t(Hkv) + size_t(g)], nullptr,
                     partial_.k(layer, b) + g * partial_.head_stride(b));
        continue;
      }
      grow(prompt_k_, kv_.bytes(int64_t(Hkv) * n * D));
      rt_.transfers()
          .run(
              Tier::kDram, Tier::kGpu, kv_.bytes(int64_t(Hkv) * n * D),
              [&] {
                store_.upload_keys(be_, Tier::kDram, layer, b, n, prompt_k_.as<char>(),
                                   size_t(kv_.bytes(int64_t(n) * D)));
              },
              {}, "prompt keys for the partial cache")
          .wait();
      const float* kb = keys_f32(prompt_k_.as<char>(), n);
      for (int g = 0; g < Hkv; ++g)
        be_.matmul(kb + int64_t(g) * n * D, n, skew_[size_t(layer) * size_t(Hkv) + size_t(g)], nullptr,
                   partial_.k(layer, b) + g * partial_.head_stride(b));
    }
  }

  // `rows` rows of x [rows, D] (row i of KV head group_of(i)) through every head's skew in one product
  // with the stacked skew, [rows, H_kv·dp] in skewed_; then each row's own head's dp columns to
  // dst(i), in one copy_rows. Launches per layer stay constant; the other heads' products are
  // computed and dropped (H_kv × a product of dp columns, small beside attention).
  template <class Group, class Dst>
  void skew_rows(int layer, const float* x, int rows, Group group_of, Dst dst) {
    const int Hkv = shape_.H_kv;
    const size_t w = size_t(Hkv) * size_t(dp_);
    if (skewed_.size() < size_t(rows) * w) skewed_ = BackendArray<float>(be_, size_t(rows) * w);
    be_.matmul(x, rows, skew_stacked_[size_t(layer)], nullptr, skewed_.data());
    skew_copies_.clear();
    for (int i = 0; i < rows; ++i) skew_copies_.add(dst(i), skewed_.data() + size_t(i) * w + size_t(group_of(i)) * size_t(dp_));
    skew_copies_.run(be_, int64_t(dp_) * 4);
  }

  // The partial key of one new row, k_row [H_kv, D] in the accelerator's memory, into the partial
  // cache.
  void append_partial(int layer, const TokenRow& r, const float* k_row) {
    skew_rows(layer, k_row, shape_.H_kv, [](int g) { return g; }, [&](int g) {
      return partial_.k(layer, r.seq) + g * partial_.head_stride(r.seq) + int64_t(r.pos) * dp_;
    });
  }

  // One row's fetch: its sequence, the buffers its rows go to, and the positions per KV head.
  struct Gather {
    int seq;
    std::shared_ptr<Fetch> f;
    std::vector<std::vector<int32_t>> sel;
  };
  // The speculation for one row from its speculative query q [H, D] (in the accelerator's memory:
  // layer i's attention input through its norm, layer i+1's W_q (+ bias) and RoPE at the row's
  // position, projected by prepare() for the batch): the skew per KV head, the partial logits over
  // the tokens stored so far (the current one joins at attention), its fetch count and selection.
  Gather speculate(int layer, const TokenRow& r, const float* q) {
    const int Hkv = shape_.H_kv, D = shape_.D, H = shape_.H, G = H / Hkv;
    const int32_t n = r.pos;
    if (spec_qp_.size() < size_t(H) * size_t(dp_))
      spec_qp_ = BackendArray<float>(be_, size_t(H) * size_t(dp_));
    if (spec_logits_.size() < size_t(H) * size_t(n))
      spec_logits_ = BackendArray<float>(be_, size_t(H) * size_t(n) * 2);
    float *qp = spec_qp_.data(), *dl = spec_logits_.data();
    // Each query head [D] through its KV head's skew, sliced to [dp]. Scaled by 1/√D as attention
    // scales them: alpha is compared against scaled logits, as in the authors' code
    // (weight_bias_concat(..., head_dim) on the speedup path, / sqrt(head_dim) on the accuracy path).
    skew_rows(layer, q, H, [&](int h) { return h / G; }, [&](int h) { return qp + int64_t(h) * dp_; });
    be_.heads_logits(qp, H, Hkv, partial_.k(layer, r.seq), partial_.head_stride(r.seq) / dp_, n, dp_,
                     1.0f / std::sqrt(float(D)), dl);
    // The count and the selection run on the host: the logits come back when they are elsewhere.
    const float* logits = dl;
    if (!be_.host_memory() && !rt_.dry()) {
      logits_.resize(size_t(H) * size_t(n));
      rt_.transfers()
          .run(
              Tier::kGpu, Tier::kDram, int64_t(logits_.size()) * 4,
              [&] { be_.download(logits_.data(), dl, logits_.size() * 4); }, {}, "speculation logits to host")
          .wait();
      logits = logits_.data();
    }
    // Dry runs compute no logits: the count is the documented expected fraction instead.
    const int32_t count = rt_.dry()
                              ? int32_t(std::clamp<int64_t>(std::llround(dry_fetch_ratio_ * double(n)), 1, n))
                              : infinigen_fetch_count(rt_.cpu_backend(), logits, H, n, alpha_, max_kv_ratio_);
    auto f = std::make_shared<Fetch>();
    f->n = count;
    last_fetch_frac_ = n > 0 ? double(count) / double(n) : 1.0;
    // The fetch for `layer` is written while layer − 1 attends over its own (the other parity's
    // buffers) and read when `layer` attends; the last reader of this parity's was layer − 2.
    Buffers& fb = fetch_pool_[size_t(layer % 2) * size_t(B_) + size_t(r.seq)];
    grow(fb.k, kv_.bytes(int64_t(Hkv) * (count + 1) * D));  // per head: the fetched rows and the current token
    grow(fb.v, kv_.bytes(int64_t(Hkv) * (count + 1) * D));
    f->k = fb.k.as<char>(), f->v = fb.v.as<char>();
    Gather out{r.seq, f, std::vector<std::vector<int32_t>>(static_cast<size_t>(Hkv))};
    for (int g = 0; g < Hkv; ++g) {
      auto& sel = out.sel[size_t(g)];
      if (rt_.dry()) {  // no logits: the first `count` positions (what equal scores select), no scan
        sel.resize(size_t(count));
        for (int32_t t = 0; t < count; ++t) sel[size_t(t)] = t;
      } else {
        logit_top_k(rt_.cpu_backend(), logits + int64_t(g) * G * n, G, n, n, count, sel);
      }
    }
    fetch_[size_t(layer) * size_t(B_) + size_t(r.seq)] = f;
    return out;
  }

  Backend& be_;
  Runtime& rt_;
  const Model* model_;
  double partial_ratio_, alpha_, dry_fetch_ratio_, max_kv_ratio_;
  double last_fetch_frac_ = 1.0;  // the last fetch's count over the length (forward_work's estimate)
  int full_layers_;
  int32_t calib_tokens_;
  KvElement kv_;
  KvShape shape_;
  int B_ = 0, dp_ = 1;
  std::vector<int32_t> prompt_;
  static constexpr int32_t kPageTokens = 64;
  std::unique_ptr<PlacementPolicy> dram_only_ = make_placement("dram-only");
  PagedKvStore store_;  // the whole KV cache, on dram
  KvStore partial_;
  int svd_layers_ = 0;
  std::array<int, 3> skew_shape_{};  // H_kv, D, dp of the kept skew
  std::vector<Weight> skew_;  // per (layer, KV head): the kept columns of the skew, [dp, D]
  std::vector<Weight> skew_stacked_;  // per layer: every KV head's skew_, stacked, [H_kv·dp, D]
  BackendArray<float> skewed_;        // skew_rows' product
  RowCopies skew_copies_;
  std::vector<std::vector<float>> calib_q_, calib_k_;
  std::vector<std::shared_ptr<Fetch>> fetch_;
  std::vector<float> logits_;                                    // speculate()'s partial logits on the host
  std::vector<float> host_k_, host_v_, host_q_;                  // rows read back from the accelerator
  // prepare()'s and speculate()'s accelerator scratch
  BackendArray<float> spec_x_, spec_h_, spec_q_, spec_qp_, spec_logits_;
  // Kept accelerator buffers: full loads per sequence, and fetches per layer parity and sequence
  // (each head's fetched rows and a row for the current token, as the attention reads them).
  std::vector<Buffers> full_pool_, fetch_pool_;
  Allocation prompt_k_, prompt_k32_;  // calibrate(): a prompt's keys on the accelerator (kv_dtype, F32)
  std::vector<bool> own_rows_;  // per sequence: this attend call's full buffers hold its own rows
  const float *new_k_ = nullptr, *new_v_ = nullptr;
  int32_t last_fetch_ = 0;
  int64_t attended_sum_ = 0, last_attended_ = 0;  // decode rows' keys over this step's layers; the last step's per layer
};

}  // namespace

StrategyInfo infinigen_info() {
  using T = ParamSpec::Type;
  return {"infinigen",
          "SVD-skewed partial keys speculate which KV rows to fetch from dram for the next layer (InfiniGen)",
          {{"partial_ratio",
            T::kFloat,
            "0.2",
            "ratio",
            "fraction of head-dim columns in the partial key cache",
            {}},
           {"alpha", T::kFloat, "4.0", "", "tokens within max − alpha of the partial logits are counted", {}},
           {"max_kv_ratio",
            T::kFloat,
            "0.2",
            "ratio",
            "cap on fetched tokens, fraction of the current length",
            {}},
           {"dry_fetch_ratio",
            T::kFloat,
            "0.2",
            "ratio",
            "dry runs only (no logits to apply alpha to): fraction of the current length fetched per step",
            {}},
           {"full_layers", T::kInt, "2", "layers", "first layers that load their full KV", {}},
           {"calib_tokens",
            T::kInt,
            "2048",
            "tokens",
            "skew calibrated on the first prompt's first tokens (0: all)",
            {}}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<InfiniGen>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/true, /*native_16bit_kv=*/true};
}

}  // namespace hg
