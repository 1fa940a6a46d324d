// The `full` strategy.
#include "baselines/full/full.h"

#include "baselines/common.h"

namespace hg {

void FullStrategy::begin(const KvShape& shape, std::span<const int32_t> capacity, std::span<const int32_t>) {
  if (rt_ && rt_->device() != DeviceKind::kCpu) store_.reset(shape, capacity, &rt_->memory(), Tier::kGpu, kv_dtype_);
  else if (!be_.host_memory()) store_.reset(shape, capacity, nullptr, Tier::kDram, kv_dtype_, &be_);  // e.g. --backend cuda
  else store_.reset(shape, capacity, nullptr, Tier::kDram, kv_dtype_);
}

void FullStrategy::append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) {
  store_.write(layer, rows, k, v, &be_);  // through the backend: device memory on cuda
}

void FullStrategy::attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) {
  const KvShape& s = store_.shape();
  attn_rows_.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const TokenRow r = rows[i];
    attn_rows_[i] = AttnRow{store_.k_raw(layer, r.seq), store_.v_raw(layer, r.seq), store_.head_stride(r.seq), r.pos + 1};
  }
  AttentionArgs a = attention_args(s, attn_rows_, q, scale, out);
  a.kv_dtype = kv_dtype_;
  be_.attention(a);
}

void FullStrategy::fork(int32_t src, int32_t n, std::span<const int32_t> dst) {
  for (int32_t d : dst)
    for (int l = 0; l < store_.shape().n_layers; ++l) store_.copy_tokens(l, src, d, n, &be_);
}

}  // namespace hg
