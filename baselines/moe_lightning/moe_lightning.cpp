// `moe_lightning` — attention on the CPU ("AoC"). KV lives on `dram`; the accelerator computes q,
// k, v; the new k, v and q go to the CPU; the CPU worker runs exact GQA decode attention (each K/V
// row read once for all query heads of its group); the output returns to the accelerator.
// `micro_batches: m` splits the rows into m micro-batches so that the CPU attention of one overlaps
// the transfers of the others (the part of CGOPipe that lives inside one layer; overlapping the
// accelerator's FFN of other micro-batches needs decoder-level micro-batching, not built yet).
// Transfers per step: q, k, v and the output only. The prefill's attention runs on the accelerator,
// as the authors' artifact does: a prompt chunk's rows attend over a staging copy of one layer on
// the `gpu` tier (the chunk's own k, v, plus earlier chunks' loaded back from dram); only decode
// attention goes to the CPU.
#include "baselines/common.h"
#include "engine/kv/kv_store.h"

namespace hg {
namespace {

class MoeLightning final : public KvStrategy {
 public:
  MoeLightning(const StrategyContext& ctx, const StrategyParams& p)
      : be_(ctx.backend), rt_(require_runtime(ctx, "moe_lightning")), mb_(int(p.get_int("micro_batches"))),
        kv_(ctx, p) {
    if (mb_ < 1) input_error("strategy moe_lightning: micro_batches must be >= 1");
  }
  std::string_view name() const override { return "moe_lightning"; }
  DType kv_dtype() const override { return kv_.dtype(); }
  std::map<std::string, std::string> effective_params() const override { return kv_.effective(); }
  // Decode: every visible key, its logits on the CPU.
  AttendedKeys attended_keys(const TokenRow& r) const override {
    return prefill(r) ? AttendedKeys{int64_t(r.pos) + 1, 0} : AttendedKeys{0, int64_t(r.pos) + 1};
  }
  // Decode attention runs on the CPU over dram: the accelerator reads no K or V then. Prefill rows
  // attend on the accelerator over every visible key.
  int64_t accel_attention_keys(const TokenRow& r) const override {
    return prefill(r) ? int64_t(r.pos) + 1 : 0;
  }

  void begin(const KvShape& shape, std::span<const int32_t> capacity, std::span<const int32_t> prompt_len) override {
    shape_ = shape;
    prompt_.assign(prompt_len.begin(), prompt_len.end());
    store_.reset(shape, capacity, &rt_.memory(), Tier::kDram, kv_.dtype());
    // One layer of the prompt on the accelerator (its tokens only; decode needs none).
    std::vector<int32_t> cap(prompt_.begin(), prompt_.end());
    for (auto& c : cap) c = std::max(c, 1);
    stage_.reset(KvShape{1, shape.H, shape.H_kv, shape.D, shape.rope}, cap, &rt_.memory(), Tier::kGpu, kv_.dtype());
  }

  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override {
    // Prompt rows: the accelerator keeps its own copy for the prefill's attention (rows in order:
    // a chunk's prompt rows come before any decode row of the same call).
    size_t np = 0;
    while (np < rows.size() && prefill(rows[np])) ++np;
    if (np > 0) stage_.write(0, rows.subspan(0, np), k, v, &be_);
    const size_t n = rows.size() * size_t(shape_.H_kv) * size_t(shape_.D);
    std::vector<TokenRow> r(rows.begin(), rows.end());
    kv_in_ = rt_.transfers().run(
        Tier::kGpu, Tier::kDram, kv_.bytes(int64_t(n)) * 2,
        [this, layer, r = std::move(r), k, v, n] {
          std::vector<float> hk, hv;
          Backend& dev = rt_.accel_backend();
          store_.write(layer, r, host_view(dev, k, n, hk), host_view(dev, v, n, hv));
        },
        {}, "k,v to cpu");
  }

  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override {
    const int64_t row_floats = int64_t(shape_.H) * shape_.D;
    size_t np = 0;
    while (np < rows.size() && prefill(rows[np])) ++np;
    if (np > 0) attend_prefill(layer, rows.subspan(0, np), q, scale, out);
    if (np == rows.size()) {
      kv_in_.wait();  // k, v are the decoder's scratch: written back before the next layer reuses it
      return;
    }
    rows = rows.subspan(np);
    q += int64_t(np) * row_floats;
    out += int64_t(np) * row_floats;
    const int64_t need = int64_t(rows.size()) * row_floats * 4;
    if (!qbuf_.data() || qbuf_.bytes() < need) {
      qbuf_ = rt_.memory().allocate(Tier::kDram, need);
      obuf_ = rt_.memory().allocate(Tier::kDram, need);
    }
    std::vector<Event> done;
    const int64_t n = int64_t(rows.size());
    const int m = int(std::min<int64_t>(mb_, n));
    for (int c = 0; c < m; ++c) {
      const int64_t b = n * c / m, e = n * (c + 1) / m;
      const int64_t bytes = (e - b) * row_floats * 4;
      float* qc = qbuf_.as<float>() + b * row_floats;
      float* oc = obuf_.as<float>() + b * row_floats;
      Event q_in = rt_.transfers().copy(qc, Tier::kDram, q + b * row_floats, Tier::kGpu, bytes, {}, "q to cpu");
      std::vector<TokenRow> r(rows.begin() + b, rows.begin() + e);
      Event att = rt_.cpu().submit(
          "cpu attention layer " + std::to_string(layer), work(layer, r), {q_in, kv_in_},
          [this, layer, r, qc, oc, scale] {
            std::vector<AttnRow> ar(r.size());
            for (size_t i = 0; i < r.size(); ++i)
              ar[i] = AttnRow{store_.k_raw(layer, r[i].seq), store_.v_raw(layer, r[i].seq),
                              store_.head_stride(r[i].seq), r[i].pos + 1};
            rt_.cpu_backend().attention(attention_args(shape_, ar, qc, scale, oc, kv_.dtype()));
          });
      done.push_back(rt_.transfers().copy(out + b * row_floats, Tier::kGpu, oc, Tier::kDram, bytes, {att}, "out to gpu"));
    }
    for (auto& d : done) d.wait();
  }

 private:
  bool prefill(const TokenRow& r) const { return r.pos < prompt_[size_t(r.seq)]; }

 public:
  // The last k, v transfer reads the caller's buffers (a seeded fill frees them after end_step).
  void end_step() override {
    if (kv_in_.valid()) kv_in_.wait();
  }
  // The dram store is the state (the prompt's staging layer serves prefill rows only).
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override {
    if (kv_in_.valid()) kv_in_.wait();
    for (int32_t d : dst)
      for (int l = 0; l < shape_.n_layers; ++l) store_.copy_tokens(l, src, d, n);
  }

 private:

  // Prompt rows on the accelerator: tokens before this chunk come back from dram into the staging
  // layer (the chunk's own are there from append()), then exact causal attention.
  void attend_prefill(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) {
    const auto first = first_new_position(rows);
    int64_t bytes = 0;
    for (auto& [seq, n] : first) bytes += kv_.bytes(int64_t(n) * shape_.H_kv * shape_.D) * 2;
    if (bytes > 0) {
      rt_.transfers()
          .run(
              Tier::kDram, Tier::kGpu, bytes,
              [this, layer, &first] {
                for (auto& [seq, n] : first) {
                  if (n == 0) continue;
                  const size_t src = size_t(kv_.bytes(store_.head_stride(seq)));
                  const size_t dst = size_t(kv_.bytes(stage_.head_stride(seq)));
                  const size_t len = size_t(kv_.bytes(int64_t(n) * shape_.D));
                  be_.upload_2d(stage_.k_raw(0, seq), dst, store_.k_raw(layer, seq), src, len, size_t(shape_.H_kv));
                  be_.upload_2d(stage_.v_raw(0, seq), dst, store_.v_raw(layer, seq), src, len, size_t(shape_.H_kv));
                }
              },
              {kv_in_}, "prompt kv back, layer " + std::to_string(layer))
          .wait();
    }
    std::vector<AttnRow> ar(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      ar[i] = AttnRow{stage_.k_raw(0, rows[i].seq), stage_.v_raw(0, rows[i].seq), stage_.head_stride(rows[i].seq),
                      rows[i].pos + 1};
    be_.attention(attention_args(shape_, ar, q, scale, out, kv_.dtype()));
  }

  StageWork work(int layer, const std::vector<TokenRow>& r) const {
    (void)layer;
    StageWork w;
    int64_t keys = 0;
    for (auto& x : r) keys += x.pos + 1;
    w.flops = 4.0 * shape_.H * shape_.D * double(keys);
    w.bytes[size_t(Tier::kDram)] = 2 * kv_.bytes(keys * shape_.H_kv * shape_.D);
    return w;
  }
  Backend& be_;
  Runtime& rt_;
  int mb_;
  KvShape shape_;
  std::vector<int32_t> prompt_;
  KvElement kv_;
  KvStore store_, stage_;  // stage_: one layer of the prompt on the gpu tier
  Allocation qbuf_, obuf_;
  Event kv_in_;
};

}  // namespace

StrategyInfo moe_lightning_info() {
  return {"moe_lightning", "attention on the CPU over KV in dram; q/k/v to the CPU, output back (MoE-Lightning)",
          {{"micro_batches", ParamSpec::Type::kInt, "1", "", "rows split into this many CPU-attention micro-batches", {}, 1, kNoMax}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<MoeLightning>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/false, /*native_16bit_kv=*/true};
}

}  // namespace hg
