// `moe_lightning` — attention on the CPU ("AoC"). KV lives on `dram`; the accelerator computes q,
// k, v; the new k, v and q go to the CPU; the CPU worker runs exact GQA decode attention (each K/V
// row read once for all query heads of its group); the output returns to the accelerator.
// `micro_batches: m` splits the rows into m micro-batches so that the CPU attention of one overlaps
// the transfers of the others (the part of CGOPipe that lives inside one layer; overlapping the
// accelerator's FFN of other micro-batches needs decoder-level micro-batching, not built yet).
// Transfers per step: q, k, v and the output only.
#include "baselines/common.h"
#include "engine/decoder/kv_store.h"

namespace hg {
namespace {

class MoeLightning final : public KvStrategy {
 public:
  MoeLightning(const StrategyContext& ctx, const StrategyParams& p)
      : rt_(require_runtime(ctx, "moe_lightning")), mb_(int(p.get_int("micro_batches"))) {
    if (mb_ < 1) input_error("strategy moe_lightning: micro_batches must be >= 1");
  }
  std::string_view name() const override { return "moe_lightning"; }
  // Attention runs on the CPU over dram: the accelerator reads no K or V.
  int64_t accel_attention_keys(const TokenRow&) const override { return 0; }

  void begin(const KvShape& shape, std::span<const int32_t> capacity, std::span<const int32_t>) override {
    shape_ = shape;
    store_.reset(shape, capacity, &rt_.memory(), Tier::kDram);
  }

  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override {
    const size_t n = rows.size() * size_t(shape_.H_kv) * size_t(shape_.D);
    std::vector<TokenRow> r(rows.begin(), rows.end());
    kv_in_ = rt_.transfers().run(
        Tier::kGpu, Tier::kDram, int64_t(n) * 4 * 2,
        [this, layer, r = std::move(r), k, v, n] {
          std::vector<float> hk, hv;
          Backend& dev = rt_.accel_backend();
          store_.write(layer, r, host_view(dev, k, n, hk), host_view(dev, v, n, hv));
        },
        {}, "k,v to cpu");
  }

  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override {
    const int64_t row_floats = int64_t(shape_.H) * shape_.D;
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
              ar[i] = AttnRow{store_.k(layer, r[i].seq), store_.v(layer, r[i].seq), store_.head_stride(r[i].seq),
                              r[i].pos + 1};
            rt_.cpu_backend().attention(attention_args(shape_, ar, qc, scale, oc));
          });
      done.push_back(rt_.transfers().copy(out + b * row_floats, Tier::kGpu, oc, Tier::kDram, bytes, {att}, "out to gpu"));
    }
    for (auto& d : done) d.wait();
  }

 private:
  StageWork work(int layer, const std::vector<TokenRow>& r) const {
    (void)layer;
    StageWork w;
    int64_t keys = 0;
    for (auto& x : r) keys += x.pos + 1;
    w.flops = 4.0 * shape_.H * shape_.D * double(keys);
    w.bytes[size_t(Tier::kDram)] = 2 * keys * shape_.H_kv * shape_.D * 4;
    return w;
  }
  Runtime& rt_;
  int mb_;
  KvShape shape_;
  KvStore store_;
  Allocation qbuf_, obuf_;
  Event kv_in_;
};

}  // namespace

StrategyInfo moe_lightning_info() {
  return {"moe_lightning", "attention on the CPU over KV in dram; q/k/v to the CPU, output back (MoE-Lightning)",
          {{"micro_batches", ParamSpec::Type::kInt, "1", "", "rows split into this many CPU-attention micro-batches", {}}},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<MoeLightning>(c, p); },
          /*runs_on_cuda=*/true};
}

}  // namespace hg
