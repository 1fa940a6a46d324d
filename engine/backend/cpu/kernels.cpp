// hg::cpu kernels: each call goes to the table of the instruction-set level chosen at run time
// (engine/core/cpu_features.h), so one binary runs on any x86-64 CPU and uses AVX-512 where it is.
#include "engine/backend/cpu/kernels.h"

#include <algorithm>
#include <cstring>

#include "engine/backend/cpu/kernel_table.h"
#include "engine/core/cpu_features.h"

namespace hg::cpu {
namespace {
const KernelTable& table_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16: return avx512_bf16::kernel_table();
    case CpuIsa::kAvx512: return avx512::kernel_table();
    case CpuIsa::kPortable: break;
  }
  return portable::kernel_table();
}
const KernelTable& table() { return table_for(active_cpu_isa()); }
// The read references (sum, sum_one_stream, sum_rows) measure the machine, not the kernels: they
// run at the best level this CPU has whatever level the kernels run at.
const KernelTable& best_table() {
  static const KernelTable& t = table_for(best_cpu_isa());
  return t;
}
}  // namespace

float dot(const float* a, const float* b, int64_t n) { return table().dot(a, b, n); }
float sum(const float* p, int64_t n) { return best_table().sum(p, n); }
float sum_one_stream(const float* p, int64_t n) { return best_table().sum_one_stream(p, n); }
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y) {
  table().rms_norm_row(x, w, n, eps, y);
}
void layer_norm_row(const float* x, const float* w, const float* b, int64_t n, float eps, float* y) {
  table().layer_norm_row(x, w, b, n, eps, y);
}
void swiglu(const float* gate, const float* up, int64_t n, float* y) { table().swiglu(gate, up, n, y); }
void relu(float* x, int64_t n) { table().relu(x, n); }
void add(float* y, const float* x, int64_t n) { table().add(y, x, n); }
float max_value(const float* x, int64_t n) { return table().max_value(x, n); }
float exp_shift_sum(float* x, int64_t n, float shift) { return table().exp_shift_sum(x, n, shift); }
void f32_to_bf16_row(const float* x, uint16_t* y, int64_t n) { table().f32_to_bf16_row(x, y, n); }
void bf16_to_f32_row(const uint16_t* x, float* y, int64_t n) { table().bf16_to_f32_row(x, y, n); }
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n) { table().f16_to_f32_row(x, y, n); }
void attention_group(const float* q, const void* K, const void* V, DType kv, int64_t n_keys, int G, int D, float scale,
                     float* out, float* scratch, float* logits_out, float* probs_out, int64_t tap_ld, float* lse_out,
                     const int32_t* key_limits) {
  table().attention_group(q, K, V, kv, n_keys, G, D, scale, out, scratch, logits_out, probs_out, tap_ld, lse_out,
                          key_limits);
}
void group_logits(const float* q, int G, const void* K, DType kt, int64_t n, int64_t t0, int64_t t1, int D,
                  float scale, float* logits) {
  table().group_logits(q, G, K, kt, n, t0, t1, D, scale, logits);
}
void group_logit_max(const float* q, int G, const void* K, DType kt, int64_t t0, int64_t t1, int D, float scale,
                     float* score) {
  table().group_logit_max(q, G, K, kt, t0, t1, D, scale, score);
}
void gemv(const float* x, int M, const void* W, DType wt, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  table().gemv(x, M, W, wt, K, n0, n1, y, ldy);
}
bool gemv_rounds_bf16_activations() { return table().gemv_rounds_bf16_activations(); }
void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx, int64_t n) {
  table().gather_rows(dst, src, row_bytes, src_stride, idx, n);
}
float sum_rows(const float* src, int64_t row_floats, int64_t src_stride, const int32_t* idx, int64_t n) {
  return best_table().sum_rows(src, row_floats, src_stride, idx, n);
}
void group_weighted_v(const float* p, int G, const void* V, DType vt, int64_t n, int D, float* out) {
  table().group_weighted_v(p, G, V, vt, n, D, out);
}
void to_f32(const void* x, DType xt, float* y, int64_t n) { table().to_f32(x, xt, y, n); }
void gumbel_noise(uint64_t base, const int32_t* pos, int64_t n, double* out) { table().gumbel_noise(base, pos, n, out); }
int32_t logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, int32_t* out) {
  return table().logit_top_k(logits, G, ld, n, K, out);
}
void copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n) {
  // Source rows requested 8 KiB ahead, as gather_rows does: scattered rows defeat the prefetcher.
  const int64_t ahead = std::max<int64_t>(1, 8192 / std::max<int64_t>(row_bytes, 1));
  auto request = [&](int64_t i) {
    for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(static_cast<const char*>(src[i]) + off, 0, 1);
  };
  for (int64_t i = 0; i < std::min(n, ahead); ++i) request(i);
  for (int64_t i = 0; i < n; ++i) {
    if (i + ahead < n) request(i + ahead);
    std::memcpy(dst[i], src[i], size_t(row_bytes));
  }
}

}  // namespace hg::cpu
