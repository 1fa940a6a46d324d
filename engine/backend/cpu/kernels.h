// CPU kernels, built at three instruction-set levels (portable C++, AVX-512, AVX-512 with BF16 dot
// products) and run at the one chosen when the process starts (engine/core/cpu_features.h:
// the best this CPU has, or HG_CPU_ISA). Single-threaded building blocks; the CPU backend
// parallelises over rows and heads. Each has a `ref` counterpart that tests compare against at
// every level (tests/unit/test_cpu_kernels.cpp).
#pragma once
#include <cstdint>

#include "engine/core/dtype.h"

namespace hg::cpu {

float dot(const float* a, const float* b, int64_t n);
// Σ p[0, n): a read-only pass with independent partial sums, eight streams side by side with
// prefetch (the best read this machine does): what the bandwidth measurements (calibrate, bench,
// hg_bench) read.
float sum(const float* p, int64_t n);
// (sum, sum_one_stream and sum_rows, the read references, run at the best level the CPU has, not the
// active one: they measure the machine.)
// Σ p[0, n) read front to back as one stream, four independent AVX-512 partial sums, no software
// prefetch: the plain read-only reduction, a second, weaker reference beside sum's.
float sum_one_stream(const float* p, int64_t n);
// y = x * rsqrt(mean(x²) + eps) * w.
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* y);
void layer_norm_row(const float* x, const float* w, const float* b, int64_t n, float eps, float* y);
void swiglu(const float* gate, const float* up, int64_t n, float* y);
void relu(float* x, int64_t n);
void add(float* y, const float* x, int64_t n);
// The largest of x[0, n), NaN ignored; -inf for n = 0 or all NaN (a softmax's shift).
float max_value(const float* x, int64_t n);
// x[i] = exp(x[i] - shift), returns the sum (vectorised exp, rel. error ~1e-7).
float exp_shift_sum(float* x, int64_t n, float shift);
// Scales and converts F32 to BF16 (round to nearest even) / BF16 to F32.
void f32_to_bf16_row(const float* x, uint16_t* y, int64_t n);
void bf16_to_f32_row(const uint16_t* x, float* y, int64_t n);
void f16_to_f32_row(const uint16_t* x, float* y, int64_t n);

// Decode/prefill attention for one query row and one KV head group (GQA without copying K/V):
// q [G, D] are the G query heads sharing K, V [n_keys, D]; out [G, D].
// scratch holds G * n_keys floats. Each K and V row is read once for all G heads.
// Optional taps (may be null): logits_out / probs_out [G, tap_ld] receive the scaled logits and
// the normalised probabilities.
// K and V rows are of type `kv` (F32, F16 or BF16; converted to F32 as they are read).
void attention_group(const float* q, const void* K, const void* V, DType kv, int64_t n_keys, int G, int D, float scale,
                     float* out, float* scratch, float* logits_out = nullptr, float* probs_out = nullptr,
                     int64_t tap_ld = 0, float* lse_out = nullptr, const int32_t* key_limits = nullptr);
// key_limits (optional, [G]): head h sees keys [0, key_limits[h]) only (≥ 1 each) — query rows of
// one sequence batched as one group in prefill, each with its causal limit.
// lse_out (optional, [G]): log Σ_t exp(logit) per head — what merging split-key partial results needs
// (flash-decoding: out = Σ_c e^{lse_c − M} out_c / Σ_c e^{lse_c − M}).
// logits[h, t] = scale · q[h] · K[t] for t in [t0, t1) (q [G, D], K [n, D] of type kt, logits [G, n]).
void group_logits(const float* q, int G, const void* K, DType kt, int64_t n, int64_t t0, int64_t t1, int D,
                  float scale, float* logits);
// score[t] = max over h < G of scale · q[h] · K[t] for t in [t0, t1), NaN logits skipped (-inf when
// all are): the same logits as group_logits, bit for bit, reduced before they are stored, so that
// one float per key is written instead of G.
void group_logit_max(const float* q, int G, const void* K, DType kt, int64_t t0, int64_t t1, int D, float scale,
                     float* score);
// y[m, n] = x[m, :] · W[n, :] for m < M, n in [n0, n1): the decode GEMV (W [N, K] row-major of
// type wt, converted to F32 as it streams; F32 accumulation). y has row stride ldy.
void gemv(const float* x, int M, const void* W, DType wt, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy);
// True when the active level's GEMV multiplies BF16 weights with `vdpbf16ps` (AVX512_BF16): x is
// then rounded to BF16 first, as oneDNN's BF16 prefill does; otherwise x stays F32.
bool gemv_rounds_bf16_activations();
// dst row i ← the row at src + idx[i] · src_stride, row_bytes each, for i < n: the gather of selected
// K/V rows (InfiniGen's fetch, HybridGen's selected V). Rows are prefetched a fixed number of bytes
// ahead so that several misses are in flight (random rows defeat the hardware prefetcher).
void gather_rows(void* dst, const void* src, int64_t row_bytes, int64_t src_stride, const int32_t* idx, int64_t n);

// Σ of the selected rows (row_floats floats at src + idx[i] · src_stride floats, i < n), read with
// gather_rows' prefetch: the read-only random-row pass that gathers are compared against.
float sum_rows(const float* src, int64_t row_floats, int64_t src_stride, const int32_t* idx, int64_t n);
// Row i from src[i] to dst[i] (row_bytes each, host pointers), sources prefetched ahead.
void copy_rows(void* const* dst, const void* const* src, int64_t row_bytes, int64_t n);
// out[h] = Σ_t p[h, t] · V[t] over all n rows (V of type vt).
void group_weighted_v(const float* p, int G, const void* V, DType vt, int64_t n, int D, float* out);
// y[i] = x[i] as F32, i < n (x of type xt).
void to_f32(const void* x, DType xt, float* y, int64_t n);
// out[i] = gumbel::draw(base, pos[i]) for i < n (engine/backend/gumbel.h), bit for bit at every level.
void gumbel_noise(uint64_t base, const int32_t* pos, int64_t n, double* out);
// The K positions of the highest scores, score(t) = max over h < G of logits[h * ld + t], in
// increasing order into out (selectors/logit_topk.h has the rule); returns how many: min(K, n), 0
// for K ≤ 0.
int32_t logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, int32_t* out);

}  // namespace hg::cpu
