// `flexgen` — attention on the accelerator ("AoG") with the whole KV cache on `dram` (FlexGen's
// policy 100 0 0 100 100 0). Per layer, the layer's K and V for the tokens stored so far are copied
// to an accelerator staging buffer and attention runs there; new tokens' K/V are written back to
// dram. `overlap: true` prefetches layer i+1's KV on the copy queue while layer i computes, and
// after the last layer, layer 0's for the next step, so that no step waits for a load (FlexGen's
// overlap path); `overlap: false` is the serial path InfiniGen's scripts used.
// Exact attention. Generalised beyond the authors' OPT-only code: GQA (K/V per KV head), batches
// of sequences with different lengths (ragged rows). On a GPU the staging layers are device memory
// and the copies cudaMemcpy2D from pinned dram (Backend::upload_2d on the copy queue's stream).
// Under an accelerator KV budget (gpu_kv_bytes) FlexGen fills it as its policy search would raise
// cache_gpu: beside the two staging layers, the first layers' whole KV stays on the accelerator
// (attended in place, never loaded or written back), and only the other layers stream. FlexGen
// splits its cache along batch × heads; whole layers move the same bytes and keep one attention call.
#include "baselines/common.h"
#include "engine/kv/kv_store.h"

namespace hg {
namespace {

class FlexGen final : public KvStrategy {
 public:
  FlexGen(const StrategyContext& ctx, const StrategyParams& p)
      : be_(ctx.backend), rt_(require_runtime(ctx, "flexgen")), overlap_(p.get_bool("overlap")), kv_(ctx, p) {}
  std::string_view name() const override { return "flexgen"; }
  DType kv_dtype() const override { return kv_.dtype(); }

  ~FlexGen() override {
    try {
      settle();
    } catch (...) {  // a failed load was reported to its reader already, or has none left
    }
  }

  void begin(const KvShape& shape, std::span<const int32_t> capacity, std::span<const int32_t>) override {
    settle();  // a prefetch for a step that did not come still writes into the staging layers
    shape_ = shape;
    resident_ = resident_layers(shape, capacity);
    const auto layers = [&](int n) { return KvShape{n, shape.H, shape.H_kv, shape.D, shape.rope}; };
    stage_.reset(layers(resident_ < shape.n_layers ? 2 : 0), capacity, &rt_.memory(), Tier::kGpu,
                 kv_.dtype());
    res_.reset(layers(resident_), capacity, &rt_.memory(), Tier::kGpu, kv_.dtype());
    store_.reset(layers(shape.n_layers - resident_), capacity, &rt_.memory(), Tier::kDram, kv_.dtype());
    loaded_ = {-1, -1};
    prefetch_ = {};
    next_first_.clear();
    prefetched_first_.clear();
    exposed_ = exposed_last_ = 0;
  }

  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override {
    if (layer < resident_) {  // resident: the accelerator's copy is the only one
      res_.write(layer, rows, k, v, &be_);
      return;
    }
    stage_.write(layer % 2, rows, k, v, &be_);  // the accelerator's own copy of the new tokens
    const size_t n = rows.size() * size_t(shape_.H_kv) * size_t(shape_.D);
    std::vector<TokenRow> r(rows.begin(), rows.end());
    writeback_ = rt_.transfers().run(
        Tier::kGpu, Tier::kDram, kv_.bytes(int64_t(n)) * 2,
        [this, layer, r = std::move(r), k, v, n] {
          std::vector<float> hk, hv;
          store_.write(layer - resident_, r, host_view(be_, k, n, hk), host_view(be_, v, n, hv));
        },
        {}, "kv writeback");
  }

  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override {
    const auto first = first_new_position(rows);
    if (layer == shape_.n_layers - 1) {  // where each sequence's next step starts
      next_first_.clear();
      for (auto& r : rows) next_first_[r.seq] = std::max(next_first_[r.seq], r.pos + 1);
    }
    if (layer < resident_) return attend_in(res_, layer, rows, q, scale, out);
    const int slot = layer % 2;
    if (loaded_[size_t(slot)] == layer && prefetch_[size_t(slot)].valid() && covers(first)) {
      prefetch_[size_t(slot)].wait();
    } else {
      ++exposed_;  // a load the step waits for
      load(layer, first).wait();
    }
    prefetch_[size_t(slot)] = {};
    if (overlap_ && layer + 1 < shape_.n_layers) {
      prefetch_[size_t((layer + 1) % 2)] = load(layer + 1, first);
      prefetched_first_ = first;
    }
    attend_in(stage_, slot, rows, q, scale, out);
    writeback_.wait();  // k, v are the decoder's scratch: done before the next layer reuses it
  }

  // The next step's first streamed layer: its KV up to the tokens this step stored, prefetched now
  // (the last layer's attention has been queued; it may have used the same staging slot).
  void end_step() override {
    // The last writeback reads the caller's k, v (a seeded fill frees them after end_step).
    if (writeback_.valid()) writeback_.wait();
    exposed_last_ = exposed_;
    exposed_ = 0;
    if (!overlap_ || next_first_.empty() || resident_ >= shape_.n_layers) return;
    if (resident_ % 2 == (shape_.n_layers - 1) % 2) be_.synchronize();
    prefetch_[size_t(resident_ % 2)] = load(resident_, next_first_);
    prefetched_first_ = next_first_;
    next_first_.clear();
  }
  std::map<std::string, double> step_stats() const override { return {{"exposed_loads", double(exposed_last_)}}; }
  std::map<std::string, std::string> effective_params() const override {
    auto e = kv_.effective();
    if (resident_ > 0) e["cache_gpu_layers"] = std::to_string(resident_);
    return e;
  }
  // The dram store is the state; the next step loads dst's layers as a sequence the prefetch missed.
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override {
    settle();
    for (int32_t d : dst)
      for (int l = 0; l < shape_.n_layers; ++l)
        if (l < resident_)
          res_.copy_tokens(l, src, d, n, &be_);
        else
          store_.copy_tokens(l - resident_, src, d, n);
  }

  // Copies tokens [0, first[seq]) of `layer` from dram into staging slot layer % 2.
  Event load(int layer, const std::map<int32_t, int32_t>& first) {
    const int slot = layer % 2;
    loaded_[size_t(slot)] = layer;
    int64_t bytes = 0;
    for (auto& [seq, n] : first) bytes += kv_.bytes(int64_t(n) * shape_.H_kv * shape_.D) * 2;
    return rt_.transfers().run(
        Tier::kDram, Tier::kGpu, bytes,
        [this, layer, slot, first] {
          // Per sequence, tokens [0, n) of every KV head: one strided copy each for K and V (the
          // staging store has the dram store's head stride).
          for (auto& [seq, n] : first) {
            const size_t pitch = size_t(kv_.bytes(store_.head_stride(seq))), len = size_t(kv_.bytes(int64_t(n) * shape_.D));
            const int l = layer - resident_;
            be_.upload_2d(stage_.k_raw(slot, seq), pitch, store_.k_raw(l, seq), pitch, len,
                          size_t(shape_.H_kv));
            be_.upload_2d(stage_.v_raw(slot, seq), pitch, store_.v_raw(l, seq), pitch, len,
                          size_t(shape_.H_kv));
          }
        },
        {writeback_}, "kv load layer " + std::to_string(layer));
  }

  // Attention of `rows` over layer `l` of `st` (an accelerator store: a staging slot or a resident layer).
  void attend_in(KvStore& st, int l, std::span<const TokenRow> rows, const float* q, float scale,
                 float* out) {
    attn_rows_.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      attn_rows_[i] = AttnRow{st.k_raw(l, rows[i].seq), st.v_raw(l, rows[i].seq), st.head_stride(rows[i].seq),
                              rows[i].pos + 1};
    be_.attention(attention_args(shape_, attn_rows_, q, scale, out, kv_.dtype()));
  }

  // Layers whose KV stays on the accelerator: as many as the budget holds beside the two staging
  // layers (all of them when the whole KV fits); none without a budget (the paper's policy).
  int resident_layers(const KvShape& shape, std::span<const int32_t> capacity) const {
    int64_t layer = 0;
    for (int32_t c : capacity) layer += kv_.bytes(int64_t(c) * shape.H_kv * shape.D) * 2;
    return layers_within_budget(rt_.memory().kv_budget(), layer, shape.n_layers);
  }

  void settle() {
    for (auto& p : prefetch_)
      if (p.valid()) p.wait();
    if (writeback_.valid()) writeback_.wait();
  }

  // The prefetch in flight holds at least the tokens `first` asks for, for every sequence.
  bool covers(const std::map<int32_t, int32_t>& first) const {
    for (auto& [seq, n] : first) {
      auto it = prefetched_first_.find(seq);
      if (it == prefetched_first_.end() || it->second < n) return false;
    }
    return true;
  }

  Backend& be_;
  Runtime& rt_;
  bool overlap_;
  KvElement kv_;
  std::map<int32_t, int32_t> next_first_, prefetched_first_;
  int exposed_ = 0, exposed_last_ = 0;  // loads waited for in this step, in the last one
  KvShape shape_;
  // store_: layers [resident_, n) on dram; stage_: 2 of them (double buffer) on the gpu tier;
  // res_: layers [0, resident_) on the gpu tier.
  KvStore store_, stage_, res_;
  int resident_ = 0;
  std::array<int, 2> loaded_{-1, -1};
  std::array<Event, 2> prefetch_;
  Event writeback_;
  std::vector<AttnRow> attn_rows_;
};

}  // namespace

StrategyInfo flexgen_info() {
  return {"flexgen",
          "attention on the accelerator; all KV on dram, each layer's KV copied over per step (FlexGen)",
          {overlap_param()},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<FlexGen>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/false, /*native_16bit_kv=*/true};
}

}  // namespace hg
