// Microbenchmarks of the decode-time kernels, each reported as GB/s of the bytes it must read
// and as a ratio to this machine's read bandwidth measured in the same run (BM_ReadBandwidth,
// a read-only AVX-512 reduction over 1 GiB). Run: build/tests/hg_bench [--benchmark_filter=…]
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "baselines/keyformer/keyformer.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/core/cpu_features.h"
#include "engine/core/tensor.h"
#include "engine/core/thread_pool.h"
#include "engine/runtime/bandwidth.h"
#include "engine/runtime/runtime.h"
#include "selectors/logit_topk.h"

namespace hg {
namespace {

// Read bandwidth per thread count, set by BM_SetReference (runs before the kernels): each kernel's
// x_bw is against the bandwidth of the same number of threads.
double g_read_gbs[65] = {};

void fill(float* p, size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t i = 0; i < n; ++i) p[i] = u(g);
}

// The paired reference: max(512 MiB, 3 × the last-level cache) read in turn, so each pass
// streams from memory.
ReadProbe& probe() {
  static ReadProbe p;
  return p;
}

// The reference pass reads at least this much, so that it measures the memory, not the start and
// end of a short parallel region (a small kernel's per-call costs are the kernel's, not the memory's).
constexpr int64_t kMinPassBytes = int64_t(64) << 20;

// Runs the timed loop: each iteration times one call of `kernel` (the benchmark's manual time),
// then one read pass of the same bytes (untimed). x_bw is the median over iterations of
// kernel GB/s / that pass's GB/s: the kernel and its reference see the same moment of this
// shared machine. x_bw_peak is against BM_SetReference's best-of-5 at the start of the run
// (the best moment of the run: the conservative ratio). x_bw_1s pairs each call with a second,
// weaker pass as well: one plain stream per thread (cpu::sum_one_stream), a plain reduction. A kernel whose
// output is large gives its bytes as `written`: x_traffic then counts them twice (their write-allocate read
// and their write-back, the output being out of cache again by the next call) on top of the bytes read, for
// the memory traffic the kernel makes; x_bw, the ratio the targets name, counts the reads only. `after(dt)`
// runs untimed after each call (dt: the call's seconds), for a benchmark's own reference pass.
template <class F, class A>
void run_paired_then(benchmark::State& st, double bytes_per_iter, int threads, F&& kernel, A&& after,
                     double written = 0) {
  PairedRatio pr, pr1;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    kernel();
    benchmark::ClobberMemory();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.SetIterationTime(dt);
    after(dt);
    const int64_t pass = std::max(int64_t(bytes_per_iter), kMinPassBytes);
    pr.add(bytes_per_iter / dt / 1e9, probe().pass_gbs(pass));
    pr1.add(bytes_per_iter / dt / 1e9, probe().pass_gbs(pass, ReadPass::kOneStream));
  }
  st.SetBytesProcessed(int64_t(bytes_per_iter) * int64_t(st.iterations()));
  st.counters["GB/s"] = pr.gbs();
  st.counters["ref_GB/s"] = pr.ref_gbs();
  st.counters["x_bw"] = pr.ratio();
  st.counters["x_bw_1s"] = pr1.ratio();
  if (written > 0) st.counters["x_traffic"] = pr.ratio() * (bytes_per_iter + 2 * written) / bytes_per_iter;
  const double peak = g_read_gbs[std::clamp(threads, 0, 64)];
  if (peak > 0) st.counters["x_bw_peak"] = pr.gbs() / peak;
}
template <class F>
void run_paired(benchmark::State& st, double bytes_per_iter, int threads, F&& kernel, double written = 0) {
  run_paired_then(
      st, bytes_per_iter, threads, kernel, [](double) {}, written);
}

// Enough copies of a working set of `bytes` that cycling through them streams from memory: at
// least three times the last-level cache (some server parts have 0.5 GB of it), and 96 MiB.
int cold_copies(double bytes) {
  const double need = std::max(96.0 * (1 << 20), 3.0 * double(last_level_cache_bytes()));
  return std::max(1, int(std::ceil(need / bytes)));
}

// cold_copies(bytes) buffers of `bytes` floats' worth (host_alloc memory, 2 MiB pages), filled by
// fill() with `seed`: a benchmark reads the next one on each call.
std::vector<AlignedBuffer> cold_buffers(size_t bytes, uint64_t seed) {
  std::vector<AlignedBuffer> out;
  for (int c = cold_copies(double(bytes)); c > 0; --c) {
    out.emplace_back(bytes);
    fill(static_cast<float*>(out.back().data()), bytes / 4, seed);
  }
  return out;
}

// Read-only reduction over 1 GiB with `threads` threads: the machine's read bandwidth.
void BM_ReadBandwidth(benchmark::State& st) {
  set_num_threads(int(st.range(0)));
  const int64_t bytes = int64_t(1) << 30;
  ReadProbe buf(bytes);
  double secs = 0;
  for (auto _ : st) secs += double(bytes) / 1e9 / buf.pass_gbs(bytes);
  st.counters["GB/s"] = double(bytes) * double(st.iterations()) / 1e9 / secs;
  st.SetBytesProcessed(bytes * int64_t(st.iterations()));
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0);

// Measures read bandwidth with 1 … hardware threads before the kernel benchmarks (their x_bw
// references): best of 5 passes over 1 GiB each.
void BM_SetReference(benchmark::State& st) {
  const int64_t bytes = int64_t(1) << 30;
  set_num_threads(hardware_threads());
  ReadProbe buf(bytes);
  for (auto _ : st) {
    for (int threads = 1; threads <= std::min(64, hardware_threads()); ++threads) {
      set_num_threads(threads);
      double best = 0;
      for (int rep = 0; rep < 5; ++rep) best = std::max(best, buf.pass_gbs(bytes));
      g_read_gbs[threads] = best;
      st.counters["ref_read_GB/s_" + std::to_string(threads) + "t"] = best;
    }
  }
}
BENCHMARK(BM_SetReference)->Iterations(1)->UseRealTime();

// The KV type argument of the attention and logits benchmarks: 0 F32, 1 F16, 2 BF16.
DType kv_type(int64_t arg) { return arg == 0 ? DType::kF32 : arg == 1 ? DType::kF16 : DType::kBF16; }

// Decode attention for one query row: H query heads over N cached keys in H_kv groups, F32/F16/BF16
// K/V. This is the CPU backend's `attention`, the kernel behind the `full` strategy on the CPU
// and MoE-Lightning's attention on the CPU (`rt_.cpu_backend().attention`). Bytes read: K and V,
// 2 · H_kv · N · D · sizeof(kv).
void BM_DecodeAttention(benchmark::State& st) {
  set_num_threads(int(st.range(3)));
  const int N = int(st.range(0)), H = int(st.range(1)), Hkv = int(st.range(2)), D = int(st.range(5));
  const DType t = kv_type(st.range(4));
  std::vector<float> Kf(size_t(Hkv) * N * D), Vf(Kf.size()), q(size_t(H) * D), out(q.size());
  fill(Kf.data(), Kf.size(), 1);
  fill(Vf.data(), Vf.size(), 2);
  fill(q.data(), q.size(), 3);
  const double bytes = 2.0 * Hkv * N * D * double(dtype_size(t));
  const int copies = cold_copies(bytes);  // cycled, so that K and V come from memory, not the LLC
  std::vector<AlignedBuffer> Ks, Vs;
  std::vector<AttnRow> rows;
  for (int c = 0; c < copies; ++c) {
    Ks.emplace_back(Kf.size() * dtype_size(t));
    Vs.emplace_back(Vf.size() * dtype_size(t));
    from_f32(t, Kf.data(), Ks.back().data(), Kf.size());
    from_f32(t, Vf.data(), Vs.back().data(), Vf.size());
  }
  for (int c = 0; c < copies; ++c) rows.push_back(AttnRow{Ks[size_t(c)].data(), Vs[size_t(c)].data(), int64_t(N) * D, N});
  auto be = make_cpu_backend();
  size_t it = 0;
  st.SetLabel(std::string(dtype_name(t)));
  run_paired(st, bytes, int(st.range(3)), [&] {
    be->attention(attention_args(H, Hkv, D, 1.0f / std::sqrt(float(D)), q.data(), {&rows[it++ % rows.size()], 1},
                                 out.data(), t));
  });
}

// Each shape {N, H, H_kv, kv, D} (kv: 0 f32, 1 f16, 2 bf16) with 1 and 2 threads.
void decode_attention_shapes(benchmark::internal::Benchmark* b) {
  const std::vector<std::array<int64_t, 5>> shapes = {
      {4096, 32, 8, 0, 128},
      {16384, 32, 8, 0, 128},
      {16384, 32, 8, 1, 128},
      {16384, 32, 8, 2, 128},
      // One KV head (a single (row, head) task): 2 threads only help through the split over keys.
      {65536, 4, 1, 0, 128},
      // Multi-head attention (G = 1) with D = 64, the stories110m shape, F16 and BF16 K/V.
      {16384, 12, 12, 1, 64},
      {16384, 12, 12, 2, 64},
      // G = 2 and G = 4 at D = 64 (F16): rows of 128 B read by two query heads, and the
      // Llama-3.2-1B shape.
      {16384, 24, 12, 1, 64},
      {16384, 32, 8, 1, 64},
      // D = 128 (F16) at G = 1 (OPT-6.7B), 3 (Llama-3.2-3B), 8 (Qwen2.5-3B, Llama-3-70B), 5, 6 and 7
      // (Qwen2.5-14B, 1.5B, 7B).
      {16384, 32, 32, 1, 128},
      {16384, 24, 8, 1, 128},
      {16384, 64, 8, 1, 128},
      {16384, 40, 8, 1, 128},
      {16384, 48, 8, 1, 128},
      {16384, 56, 8, 1, 128}};
  for (const auto& [N, H, Hkv, kv, D] : shapes)
    for (int64_t threads : {1, 2}) b->Args({N, H, Hkv, threads, kv, D});
}
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"N", "H", "H_kv", "threads", "kv", "D"})
    ->Apply(decode_attention_shapes)
    ->UseManualTime();

// The AVX-512 peers and ceilings below are compiled for AVX-512 whatever the build's flags, and run
// only on a CPU that has it.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
// A peer for BM_DecodeAttention: per KV head of D = 64 or 128, the same bytes in the chunked
// kernel's order (64-row chunks: K four rows side by side, then V row by row), prefetched the same way (64
// rows but at most 16 KiB ahead, T2, one line per 64 bytes) and the same FMA count for G = 4 (4 per 16
// values), but no softmax, no q or p loads and no reductions. The attention's GB/s over this one's is what
// the kernel's own work costs on top of streaming with that arithmetic.
template <typename T>
inline __m512 peer_load(const T* p) {  // 16 values as F32 (a function: lambdas miss the pragma's target)
  if constexpr (std::is_same_v<T, float>) return _mm512_loadu_ps(p);
  else return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int D, typename T>
float attention_stream_peer(const T* K, const T* V, int64_t n) {
  constexpr int kAhead = std::min(64, 16384 / (D * int(sizeof(T))));
  constexpr int kLine = 64 / int(sizeof(T));  // values per 64-byte line
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 c = _mm512_set1_ps(1.0001f);
  for (int64_t t0 = 0; t0 + 64 <= n; t0 += 64) {
    // Fully unrolled, so that the 16 accumulators stay in registers.
    for (int64_t r = t0; r < t0 + 64; r += 4)
#pragma GCC unroll 8
      for (int b = 0; b < D; b += 16) {
        if (b % kLine == 0)
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(K + (r + kAhead + i) * D + b), _MM_HINT_T2);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512 x = peer_load(K + (r + i) * D + b);
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) acc[i * 4 + k] = _mm512_fmadd_ps(x, c, acc[i * 4 + k]);
        }
      }
    for (int64_t r = t0; r < t0 + 64; ++r)
#pragma GCC unroll 8
      for (int b = 0; b < D; b += 16) {
        if (b % kLine == 0) _mm_prefetch(reinterpret_cast<const char*>(V + (r + kAhead) * D + b), _MM_HINT_T2);
        const __m512 x = peer_load(V + r * D + b);
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) acc[(b / 16 % 4) * 4 + k] = _mm512_fmadd_ps(x, c, acc[(b / 16 % 4) * 4 + k]);
      }
  }
  float sum = 0;
  for (auto& a : acc) sum += _mm512_reduce_add_ps(a);
  return sum;
}

// The same bytes and FMAs in the four-part orders instead: K and V each as four parts of the range,
// each stream prefetched kAheadBytes ahead with Locality. kBlockRows = 0: the eight streams side by
// side, a line of each in turn, as the read reference reads (prefetched as `cpu::sum` prefetches: 1 KiB
// ahead into L1 on AMD, 4 KiB into L2 on Intel); against attention_stream_peer it says how much of the
// attention's gap to the pass is its access order rather than its arithmetic. kBlockRows > 0: in
// phases, a block of that many rows of each K part, then the same block of each V part, as the fused
// four-part kernels read; against the eight streams it says what the K-then-V phases cost by themselves.
template <int D, int Locality, int kAheadBytes, int kBlockRows, typename T>
float attention_stream_peer_parts(const T* K, const T* V, int64_t n) {
  constexpr int kLine = 64 / int(sizeof(T)), kAhead = kAheadBytes / int(sizeof(T));
  constexpr int kBlockVals = kBlockRows > 0 ? kBlockRows * D : kLine;
  const int64_t per = n / 4 * D;  // values per part
  const T* s[8];
  for (int j = 0; j < 4; ++j) s[j] = K + j * per, s[4 + j] = V + j * per;
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 c = _mm512_set1_ps(1.0001f);
  for (int64_t i0 = 0; i0 < per; i0 += kBlockVals)
    for (int phase = 0; phase < 2; ++phase)  // K, then V
      for (int64_t i = i0; i < i0 + kBlockVals; i += kLine)
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; ++jj) {
          const T* p = s[4 * phase + jj] + i;
          __builtin_prefetch(p + kAhead, 0, Locality);
#pragma GCC unroll 4
          for (int b = 0; b < kLine; b += 16) {
            const __m512 x = peer_load(p + b);
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) acc[jj * 4 + k] = _mm512_fmadd_ps(x, c, acc[jj * 4 + k]);
          }
        }
  float sum = 0;
  for (auto& a : acc) sum += _mm512_reduce_add_ps(a);
  return sum;
}

// One KV head's peer in the order asked for, K and V as bytes of T.
template <int D, typename T>
float stream_peer_head(const char* K, const char* V, int64_t n, int order) {
  const T *k = reinterpret_cast<const T*>(K), *v = reinterpret_cast<const T*>(V);
  if (order == 0) return attention_stream_peer<D>(k, v, n);
  if (order == 2)
    return cpu_tuning() == CpuTuning::kAmd ? attention_stream_peer_parts<D, 3, 2048, 16>(k, v, n)   // T0
                                           : attention_stream_peer_parts<D, 1, 4096, 16>(k, v, n);  // T2
  return cpu_tuning() == CpuTuning::kAmd ? attention_stream_peer_parts<D, 3, 1024, 0>(k, v, n)      // T0
                                         : attention_stream_peer_parts<D, 1, 4096, 0>(k, v, n);     // T2
}

#pragma GCC pop_options

bool skip_without_avx512(benchmark::State& st) {
  if (cpu_supports(CpuIsa::kAvx512)) return false;
  st.SkipWithError("this CPU has no AVX-512");
  return true;
}

void BM_AttentionStreamPeer(benchmark::State& st) {
  if (skip_without_avx512(st)) return;
  const int threads = int(st.range(2));
  set_num_threads(threads);
  const int N = int(st.range(0)), Hkv = 8, D = int(st.range(3));
  const int order = int(st.range(4));  // 0 the chunks' order, 1 eight streams, 2 four parts in phases
  const DType t = st.range(1) == 0 ? DType::kF32 : DType::kF16;
  const bool f32 = t == DType::kF32;
  float (*head)(const char*, const char*, int64_t, int) =
      D == 64 ? (f32 ? stream_peer_head<64, float> : stream_peer_head<64, uint16_t>)
              : (f32 ? stream_peer_head<128, float> : stream_peer_head<128, uint16_t>);
  std::vector<float> Kf(size_t(Hkv) * N * D);
  fill(Kf.data(), Kf.size(), 1);
  const double bytes = 2.0 * Hkv * N * D * double(dtype_size(t));
  const int copies = cold_copies(bytes);
  std::vector<AlignedBuffer> Ks, Vs;
  for (int c = 0; c < copies; ++c) {
    Ks.emplace_back(Kf.size() * dtype_size(t));
    Vs.emplace_back(Kf.size() * dtype_size(t));
    from_f32(t, Kf.data(), Ks.back().data(), Kf.size());
    from_f32(t, Kf.data(), Vs.back().data(), Kf.size());
  }
  std::vector<float> sink(static_cast<size_t>(Hkv));
  size_t it = 0;
  st.SetLabel(std::string(dtype_name(t)) + (order == 0   ? " peer, the kernel's order"
                                            : order == 1 ? " peer, eight streams"
                                                         : " peer, four parts in 16-row phases"));
  run_paired(st, bytes, threads, [&] {
    const size_t c = it++ % size_t(copies);
    parallel_for(Hkv, [&](int64_t g) {  // KV heads across the pool, as the backend's attention
      const int64_t off = g * int64_t(N) * D * int64_t(dtype_size(t));
      sink[size_t(g)] += head(static_cast<const char*>(Ks[c].data()) + off,
                              static_cast<const char*>(Vs[c].data()) + off, N, order);
    });
  });
  benchmark::DoNotOptimize(sink.data());
}
BENCHMARK(BM_AttentionStreamPeer)
    ->ArgNames({"N", "kv", "threads", "D", "order"})
    ->ArgsProduct({{16384}, {0, 1}, {1, 2}, {128}, {0, 1}})
    ->ArgsProduct({{16384}, {1}, {1, 2}, {64}, {0, 1, 2}})
    ->UseManualTime();

// A peer for a KV layout the engine does not have: K stored in tiles of 16 keys, dimension-major
// ([D][16] per tile), V as rows. Each logit step then takes 16 keys of each of four parts of the range
// with one FMA per dimension per head and part (the query element broadcast), so the 16 logits of a
// (head, part) pair come out in one vector: no horizontal sums, the online softmax in registers. G = 4,
// F16, real attention (checked against the backend's at set-up). Against BM_DecodeAttention it says what
// the tiled layout would buy the fused attention.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
inline __m512 tiled_exp(__m512 x) {  // exp(x), x ≤ 0: 2^n · a degree-6 polynomial of the remainder
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.442695041f)), _MM_FROUND_TO_NEAREST_INT);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.6931471806f), x);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (const float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
}

// out [4, D] = softmax(q Kᵀ) V for one KV head of n keys (n a multiple of 64), q [4, D] already scaled.
template <int D>
void tiled_attention_head(const float* q, const uint16_t* Kt, const uint16_t* V, int64_t n, float* out) {
  constexpr int G = 4, kAhead = 2048;  // bytes ahead, into L1, per part (as the four-part kernels on AMD)
  const int64_t per = n / 4;
  float mx[G];
  __m512 vsum[G];
  for (int h = 0; h < G; ++h) mx[h] = -INFINITY, vsum[h] = _mm512_setzero_ps();
  std::fill(out, out + G * D, 0.0f);
  alignas(64) float s[G][64];
  for (int64_t b = 0; b < per; b += 16) {
    const uint16_t *kt[4], *vp[4];
    for (int j = 0; j < 4; ++j) kt[j] = Kt + (j * per + b) * D, vp[j] = V + (j * per + b) * D;
    __m512 acc[G][4];
    for (auto& a : acc)
      for (auto& x : a) x = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int d = 0; d < D; ++d) {
      if (d % 2 == 0)
        for (int j = 0; j < 4; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(kt[j] + d * 16) + kAhead, _MM_HINT_T0);
      __m512 k[4];
      for (int j = 0; j < 4; ++j) k[j] = peer_load(kt[j] + d * 16);
      for (int h = 0; h < G; ++h) {
        const __m512 qb = _mm512_set1_ps(q[h * D + d]);
        for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_fmadd_ps(qb, k[j], acc[h][j]);
      }
    }
    for (int h = 0; h < G; ++h) {
      const float m = _mm512_reduce_max_ps(
          _mm512_max_ps(_mm512_max_ps(acc[h][0], acc[h][1]), _mm512_max_ps(acc[h][2], acc[h][3])));
      if (m > mx[h]) {
        const float corr = mx[h] == -INFINITY ? 0.0f : std::exp(mx[h] - m);
        if (b > 0)
          for (int d = 0; d < D; ++d) out[h * D + d] *= corr;
        vsum[h] = _mm512_mul_ps(vsum[h], _mm512_set1_ps(corr));
        mx[h] = m;
      }
      const __m512 sh = _mm512_set1_ps(mx[h]);
      for (int j = 0; j < 4; ++j) {
        const __m512 e = tiled_exp(_mm512_sub_ps(acc[h][j], sh));
        vsum[h] = _mm512_add_ps(vsum[h], e);
        _mm512_store_ps(&s[h][16 * j], e);
      }
    }
    for (int b0 = 0; b0 < D / 16; b0 += 4) {
      __m512 a[G][4];
      for (int h = 0; h < G; ++h)
        for (int bb = 0; bb < 4; ++bb) a[h][bb] = _mm512_loadu_ps(out + h * D + (b0 + bb) * 16);
      for (int r = 0; r < 16; ++r)
        for (int j = 0; j < 4; ++j) {
          const uint16_t* row = vp[j] + r * D + b0 * 16;
          _mm_prefetch(reinterpret_cast<const char*>(row) + kAhead, _MM_HINT_T0);  // the pass's 128 bytes
          _mm_prefetch(reinterpret_cast<const char*>(row) + kAhead + 64, _MM_HINT_T0);
          __m512 vv[4];
          for (int bb = 0; bb < 4; ++bb) vv[bb] = peer_load(row + bb * 16);
          for (int h = 0; h < G; ++h) {
            const __m512 ph = _mm512_set1_ps(s[h][16 * j + r]);
            for (int bb = 0; bb < 4; ++bb) a[h][bb] = _mm512_fmadd_ps(ph, vv[bb], a[h][bb]);
          }
        }
      for (int h = 0; h < G; ++h)
        for (int bb = 0; bb < 4; ++bb) _mm512_storeu_ps(out + h * D + (b0 + bb) * 16, a[h][bb]);
    }
  }
  for (int h = 0; h < G; ++h) {
    const float inv = 1.0f / _mm512_reduce_add_ps(vsum[h]);
    for (int d = 0; d < D; ++d) out[h * D + d] *= inv;
  }
}
#pragma GCC pop_options

// K rows [n, D] as 16-key tiles [n / 16][D][16] in t.
void to_key_tiles(const uint16_t* K, int64_t n, int D, uint16_t* t) {
  for (int64_t i = 0; i < n; ++i)
    for (int d = 0; d < D; ++d) t[(i / 16) * D * 16 + d * 16 + i % 16] = K[i * D + d];
}

// Fills K, V (F16, rows and tiles) and q for Hkv heads of N keys; false (and the benchmark skipped) when
// the tiled attention of head 0 differs from the backend's by more than 1e-5.
struct TiledSet {
  std::vector<AlignedBuffer> Kt, V;
  std::vector<float> q;  // [4 · Hkv, D], scaled by 1/√D
};
bool tiled_set(benchmark::State& st, int Hkv, int N, int D, int copies, TiledSet& ts) {
  std::vector<float> Kf(size_t(Hkv) * N * D), Vf(Kf.size());
  fill(Kf.data(), Kf.size(), 1);
  fill(Vf.data(), Vf.size(), 2);
  ts.q.resize(size_t(4 * Hkv) * D);
  fill(ts.q.data(), ts.q.size(), 3);
  std::vector<uint16_t> K16(Kf.size()), V16(Kf.size());
  from_f32(DType::kF16, Kf.data(), K16.data(), Kf.size());
  from_f32(DType::kF16, Vf.data(), V16.data(), Vf.size());
  std::vector<uint16_t> tiles(K16.size());
  for (int g = 0; g < Hkv; ++g)
    to_key_tiles(K16.data() + size_t(g) * N * D, N, D, tiles.data() + size_t(g) * N * D);
  for (int c = 0; c < copies; ++c) {
    ts.Kt.emplace_back(tiles.size() * 2);
    ts.V.emplace_back(V16.size() * 2);
    std::memcpy(ts.Kt.back().data(), tiles.data(), tiles.size() * 2);
    std::memcpy(ts.V.back().data(), V16.data(), V16.size() * 2);
  }
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> want(size_t(4) * D), got(want.size());
  const AttnRow row{K16.data(), V16.data(), int64_t(N) * D, N};
  make_cpu_backend()->attention(
      attention_args(4, 1, D, scale, ts.q.data(), {&row, 1}, want.data(), DType::kF16));
  for (auto& x : ts.q) x *= scale;
  (D == 64 ? tiled_attention_head<64>
           : tiled_attention_head<128>)(ts.q.data(), static_cast<const uint16_t*>(ts.Kt[0].data()),
                                        V16.data(), N, got.data());
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= 1e-5f)) {  // 6e-8 measured: the order of the sums
      st.SkipWithError("the tiled attention differs from the backend's");
      return false;
    }
  return true;
}

void BM_AttentionTiledPeer(benchmark::State& st) {
  if (skip_without_avx512(st)) return;
  const int N = int(st.range(0)), threads = int(st.range(1)), D = int(st.range(2)), Hkv = 8;
  set_num_threads(threads);
  const double bytes = 2.0 * Hkv * N * D * 2;
  TiledSet ts;
  if (!tiled_set(st, Hkv, N, D, cold_copies(bytes), ts)) return;
  std::vector<float> out(ts.q.size());
  auto head = D == 64 ? tiled_attention_head<64> : tiled_attention_head<128>;
  size_t it = 0;
  st.SetLabel("f16 K in 16-key tiles");
  run_paired(st, bytes, threads, [&] {
    const size_t c = it++ % ts.Kt.size();
    parallel_for(Hkv, [&](int64_t g) {
      const int64_t off = g * int64_t(N) * D;
      head(ts.q.data() + g * 4 * D, static_cast<const uint16_t*>(ts.Kt[c].data()) + off,
           static_cast<const uint16_t*>(ts.V[c].data()) + off, N, out.data() + g * 4 * D);
    });
  });
}
BENCHMARK(BM_AttentionTiledPeer)
    ->ArgNames({"N", "threads", "D"})
    ->ArgsProduct({{16384}, {1, 2}, {64, 128}})
    ->UseManualTime();

// The same in L2 (one KV head of 1024 keys, one thread): ns per key against BM_DecodeAttentionWarm's.
void BM_AttentionTiledPeerWarm(benchmark::State& st) {
  if (skip_without_avx512(st)) return;
  set_num_threads(1);
  const int N = 1024, D = int(st.range(0));
  TiledSet ts;
  if (!tiled_set(st, 1, N, D, 1, ts)) return;
  std::vector<float> out(ts.q.size());
  auto head = D == 64 ? tiled_attention_head<64> : tiled_attention_head<128>;
  for (auto _ : st) {
    head(ts.q.data(), static_cast<const uint16_t*>(ts.Kt[0].data()),
         static_cast<const uint16_t*>(ts.V[0].data()), N, out.data());
    benchmark::ClobberMemory();
  }
  st.counters["ns_per_key"] = benchmark::Counter(double(N) * double(st.iterations()) * 1e-9,
                                                 benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AttentionTiledPeerWarm)->ArgName("D")->Arg(64)->Arg(128)->UseRealTime();

// The attention kernel's compute ceiling: one KV head (G query heads, head dim D) over keys that
// stay in L2, one thread, no reference pass. ns_per_key against the cold benchmarks' time per key says how
// much of a cold run is arithmetic.
void BM_DecodeAttentionWarm(benchmark::State& st) {
  set_num_threads(1);
  const int N = int(st.range(0)), H = int(st.range(2)), Hkv = 1, D = int(st.range(3));
  const DType t = kv_type(st.range(1));
  std::vector<float> Kf(size_t(N) * D), Vf(Kf.size()), q(size_t(H) * D), out(q.size());
  fill(Kf.data(), Kf.size(), 1);
  fill(Vf.data(), Vf.size(), 2);
  fill(q.data(), q.size(), 3);
  AlignedBuffer Kb(Kf.size() * dtype_size(t)), Vb(Vf.size() * dtype_size(t));
  from_f32(t, Kf.data(), Kb.data(), Kf.size());
  from_f32(t, Vf.data(), Vb.data(), Vf.size());
  const AttnRow row{Kb.data(), Vb.data(), int64_t(N) * D, N};
  auto be = make_cpu_backend();
  for (auto _ : st) {
    be->attention(attention_args(H, Hkv, D, 1.0f / std::sqrt(float(D)), q.data(), {&row, 1}, out.data(), t));
    benchmark::ClobberMemory();
  }
  st.SetLabel(std::string(dtype_name(t)));
  st.counters["ns_per_key"] = benchmark::Counter(double(N) * double(st.iterations()) * 1e-9,
                                                 benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.SetBytesProcessed(int64_t(2) * N * D * int64_t(dtype_size(t)) * int64_t(st.iterations()));
}
BENCHMARK(BM_DecodeAttentionWarm)
    ->ArgNames({"N", "kv", "G", "D"})
    ->Args({256, 0, 4, 128})
    ->Args({256, 1, 4, 128})
    ->Args({256, 2, 4, 128})
    // From kFourPartMinKeys keys on, the four parts (F16, 512 KiB of K and V):
    ->Args({1024, 1, 4, 128})
    ->Args({1024, 1, 1, 64})  // the stories110m shape (MHA, D = 64, F16)
    ->Args({1024, 1, 4, 64})  // the Llama-3.2-1B shape (G = 4, D = 64, F16)
    ->Args({1024, 0, 4, 64})  // the same in F32
    ->Args({1024, 2, 4, 64})  // and in BF16
    ->Args({512, 1, 2, 8})    // stories260K (G = 2, D = 8, F16): the accuracy runs' model
    ->Args({512, 0, 2, 8})    // the same in F32
    ->UseRealTime();

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
// One core's vector throughput, the ceiling under BM_DecodeAttentionWarm and the one-thread F16
// kernels: 512-bit FMAs per ns over 12 independent chains (`conversions: 0`), and the same FMAs
// with an F16→F32 conversion (vcvtph2ps) feeding every one (`conversions: 1`), as the F16 GEMV and
// the F16 attention kernels do. The empty asm statements keep every value in a register and make
// each iteration's conversions depend on the last, so that nothing is hoisted or merged. Returns
// the FMAs done.
double core_fma_loop(bool convert, int64_t iters) {
  __m512 a0 = _mm512_set1_ps(1), a1 = _mm512_set1_ps(2), a2 = _mm512_set1_ps(3), a3 = _mm512_set1_ps(4);
  __m512 a4 = _mm512_set1_ps(5), a5 = _mm512_set1_ps(6), a6 = _mm512_set1_ps(7), a7 = _mm512_set1_ps(8);
  __m512 a8 = _mm512_set1_ps(9), a9 = _mm512_set1_ps(10), a10 = _mm512_set1_ps(11), a11 = _mm512_set1_ps(12);
  __m512 b = _mm512_set1_ps(0.999f);
  __m256i h0 = _mm256_set1_epi16(0x3c00), h1 = h0, h2 = h0, h3 = h0;
#define HG_KEEP(v) asm volatile("" : "+v"(v))
  for (int64_t i = 0; i < iters; ++i) {
    if (convert) {  // 8 conversions and 8 FMAs (the branch is taken the same way every time)
      HG_KEEP(h0); HG_KEEP(h1); HG_KEEP(h2); HG_KEEP(h3);
      a0 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h0), a0), a1 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h1), a1);
      a2 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h2), a2), a3 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h3), a3);
      HG_KEEP(h0); HG_KEEP(h1); HG_KEEP(h2); HG_KEEP(h3);
      a4 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h0), a4), a5 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h1), a5);
      a6 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h2), a6), a7 = _mm512_fmadd_ps(b, _mm512_cvtph_ps(h3), a7);
    } else {  // 12 FMAs
      HG_KEEP(b);
      a0 = _mm512_fmadd_ps(a0, b, b), a1 = _mm512_fmadd_ps(a1, b, b), a2 = _mm512_fmadd_ps(a2, b, b);
      a3 = _mm512_fmadd_ps(a3, b, b), a4 = _mm512_fmadd_ps(a4, b, b), a5 = _mm512_fmadd_ps(a5, b, b);
      a6 = _mm512_fmadd_ps(a6, b, b), a7 = _mm512_fmadd_ps(a7, b, b), a8 = _mm512_fmadd_ps(a8, b, b);
      a9 = _mm512_fmadd_ps(a9, b, b), a10 = _mm512_fmadd_ps(a10, b, b), a11 = _mm512_fmadd_ps(a11, b, b);
    }
  }
#undef HG_KEEP
  const __m512 all =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                    _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                  _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  benchmark::DoNotOptimize(_mm512_reduce_add_ps(all));
  return double(iters) * (convert ? 8 : 12);
}
#pragma GCC pop_options

void BM_CoreFma(benchmark::State& st) {
  if (skip_without_avx512(st)) return;
  const bool convert = st.range(0) != 0;
  double secs = 0, fmas = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    fmas += core_fma_loop(convert, 1 << 20);
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  st.counters["FMA_per_ns"] = fmas / secs * 1e-9;
  st.SetLabel(convert ? "each FMA fed by an F16 conversion" : "FMAs only");
}
BENCHMARK(BM_CoreFma)->ArgNames({"conversions"})->Arg(0)->Arg(1)->UseRealTime();

// HybridGen's CPU stage: logits of G query heads over N offloaded keys of one KV head (F32).
// Bytes read: the keys, N · D · 4. Written: the logits, G · N · 4 (x_traffic).
void BM_GroupLogits(benchmark::State& st) {
  set_num_threads(int(st.range(1)));
  const int64_t N = st.range(0);
  const int G = 4, D = 128;
  // Keys and logits in host_alloc memory (2 MiB pages), as HybridGen's offloaded keys and logits
  // buffers are; a std::vector sits on 4 KiB pages here.
  const std::vector<AlignedBuffer> keys = cold_buffers(size_t(N * D) * 4, 7);
  AlignedBuffer lbuf(size_t(G * N) * 4);
  float* lg = static_cast<float*>(lbuf.data());
  std::vector<float> q(size_t(G * D));
  fill(lg, size_t(G * N), 0);
  fill(q.data(), q.size(), 8);
  auto be = make_cpu_backend();
  size_t it = 0;
  run_paired(st, double(N * D * 4), int(st.range(1)), [&] {
    const float* K = static_cast<const float*>(keys[it++ % keys.size()].data());
    be->group_logits(q.data(), G, K, N, D, 0.088f, lg);
  }, double(G * N * 4));
}
// 256K keys = 128 MiB, in copies cycled so that every pass streams from memory.
BENCHMARK(BM_GroupLogits)->ArgNames({"N", "threads"})->Args({262144, 1})->Args({262144, 2})->UseManualTime();

// The kernels as HybridGen's stages call them, per KV head of the 8B shape (H_kv = 8, G = 4,
// D = 128); the keys (8 · N · 512 B, 128 MiB at 32K) stream from memory. Bytes read: the keys.
// max 0: group_logits, the G × N logits of the head's N keys into one [G, N] scratch that every
// head reuses (cpu_stage's thread_local scratch): written over the previous head's (512 KiB at
// 32K), so their write-allocate reads may hit the cache. BM_GroupLogits above writes a 4 MiB
// logits array that every pass evicts: the worst case for its stores.
// max 1: group_logit_max, `post` mode's scores: the max over the G heads
// of each key's logits, one float per key written instead of G.
void BM_GroupLogitsStage(benchmark::State& st) {
  set_num_threads(int(st.range(1)));
  const int64_t N = st.range(0);
  const int Hkv = 8, G = 4, D = 128;
  const bool max = st.range(2) == 1;
  const std::vector<AlignedBuffer> keys = cold_buffers(size_t(Hkv * N * D) * 4, 7);
  AlignedBuffer lbuf(size_t(G * N) * 4);
  float* lg = static_cast<float*>(lbuf.data());
  std::vector<float> q(size_t(Hkv * G * D));
  fill(lg, size_t(G * N), 0);
  fill(q.data(), q.size(), 8);
  auto be = make_cpu_backend();
  size_t it = 0;
  run_paired(st, double(Hkv * N * D * 4), int(st.range(1)), [&] {
    const float* K = static_cast<const float*>(keys[it++ % keys.size()].data());
    for (int g = 0; g < Hkv; ++g) {
      const float* qg = q.data() + g * G * D;
      if (max)
        be->group_logit_max(qg, G, K + g * N * D, N, D, 0.088f, lg);
      else
        be->group_logits(qg, G, K + g * N * D, N, D, 0.088f, lg);
    }
  });
  st.SetLabel(max ? "group_logit_max" : "group_logits");
}
BENCHMARK(BM_GroupLogitsStage)
    ->ArgNames({"N", "threads", "max"})
    ->ArgsProduct({{32768}, {1, 2}, {0, 1}})
    ->UseManualTime();

// HybridGen's whole `post` selection per KV head of the 8B shape: K = 128 of N offloaded keys by
// the group's max logit, and the G logits of the selected. method 0: group_logits over all N keys
// into [G, N], logit_top_k over the G rows, the selected logits picked out (the earlier
// method); 1: group_logit_max (one score per key), logit_top_k over the scores, then the K
// selected rows gathered and their logits computed again (as cpu_stage runs now). Bytes read: the
// keys.
void BM_PostSelection(benchmark::State& st) {
  set_num_threads(int(st.range(1)));
  const int64_t N = st.range(0);
  const int Hkv = 8, G = 4, D = 128;
  const int32_t K = 128;
  const std::vector<AlignedBuffer> keys = cold_buffers(size_t(Hkv * N * D) * 4, 7);
  AlignedBuffer lbuf(size_t(G * N) * 4);
  float* lg = static_cast<float*>(lbuf.data());
  std::vector<float> q(size_t(Hkv * G * D)), kg(size_t(K * D)), sel_lg(size_t(G * K));
  fill(lg, size_t(G * N), 0);
  fill(q.data(), q.size(), 8);
  std::vector<int32_t> sel;
  auto be = make_cpu_backend();
  const bool scores = st.range(2) == 1;
  size_t it = 0;
  run_paired(st, double(Hkv * N * D * 4), int(st.range(1)), [&] {
    const float* Ks = static_cast<const float*>(keys[it++ % keys.size()].data());
    for (int g = 0; g < Hkv; ++g) {
      const float* qg = q.data() + g * G * D;
      const float* Kg = Ks + g * N * D;
      if (scores) {
        be->group_logit_max(qg, G, Kg, N, D, 0.088f, lg);
        logit_top_k(*be, lg, 1, N, int32_t(N), K, sel);
        cpu::gather_rows(kg.data(), Kg, D * 4, D * 4, sel.data(), K);
        be->group_logits(qg, G, kg.data(), K, D, 0.088f, sel_lg.data());
      } else {
        be->group_logits(qg, G, Kg, N, D, 0.088f, lg);
        logit_top_k(*be, lg, G, N, int32_t(N), K, sel);
        for (int h = 0; h < G; ++h)
          for (int32_t i = 0; i < K; ++i) sel_lg[size_t(h * K + i)] = lg[h * N + sel[size_t(i)]];
      }
      benchmark::DoNotOptimize(sel_lg.data());
    }
  });
  st.SetLabel(scores ? "group_logit_max, top-K, selected logits again" : "group_logits, top-K over G rows");
}
BENCHMARK(BM_PostSelection)
    ->ArgNames({"N", "threads", "method"})
    ->ArgsProduct({{32768}, {1, 2}, {0, 1}})
    ->UseManualTime();

// Gather of selected V rows (D = 128 F32, 512 B rows) out of 1M rows (512 MiB; more where the
// last-level cache is large) with
// cpu::gather_rows, as InfiniGen's fetch and HybridGen's CPU stage run it on one worker. The
// strategies select positions in token order (sorted); `sorted: 0` is a random order. Bytes read:
// K · D · 4. The baseline (`prefetch: 0`) is a plain memcpy per row. `hugepages: 0` opts the
// buffer out of the 2 MiB pages that host_alloc advises.
// Two ratios: x_bw against the sequential read pass (run_paired's), and x_rows against a
// read-only pass over another set of random rows of the same buffer (rows_read_pass_gbs, one
// thread like the gather) right after each gather: the random-row read rate, which is what bounds
// a gather.
void BM_GatherRows(benchmark::State& st) {
  // At least 1M rows, and three times the last-level cache.
  const int64_t D = 128, N = std::max<int64_t>(1 << 20, 3 * last_level_cache_bytes() / (D * 4)), K = st.range(0);
  AlignedBuffer vbuf(size_t(N * D) * 4);
  if (!st.range(3)) madvise(vbuf.data(), vbuf.bytes(), MADV_NOHUGEPAGE);  // before the first touch
  float* V = static_cast<float*>(vbuf.data());
  std::vector<float> out(size_t(K * D));
  fill(V, size_t(N * D), 9);
  // 16 index sets used in turn, so that the rows are not cache-resident from the last pass.
  std::mt19937_64 g(1);
  std::vector<std::vector<int32_t>> sets(16, std::vector<int32_t>(static_cast<size_t>(K)));
  for (auto& set : sets) {
    for (auto& i : set) i = int32_t(g() % uint64_t(N));
    if (st.range(2)) std::sort(set.begin(), set.end());
  }
  size_t it = 0;
  const bool prefetch = st.range(1) != 0;
  PairedRatio rows;
  set_num_threads(1);  // one copy worker
  run_paired_then(
      st, double(K * D * 4), 1,
      [&] {
        const auto& idx = sets[it++ % sets.size()];
        if (prefetch) {
          cpu::gather_rows(out.data(), V, D * 4, D * 4, idx.data(), K);
        } else {
          for (int64_t i = 0; i < K; ++i)
            std::memcpy(&out[size_t(i * D)], &V[size_t(idx[size_t(i)]) * D], D * 4);
        }
      },
      [&](double dt) {
        rows.add(double(K * D * 4) / dt / 1e9, rows_read_pass_gbs(V, D, sets[it % sets.size()].data(), K));
      });
  st.counters["rows_ref_GB/s"] = rows.ref_gbs();
  st.counters["x_rows"] = rows.ratio();
}
BENCHMARK(BM_GatherRows)
    ->ArgNames({"K", "prefetch", "sorted", "hugepages"})
    ->Args({16384, 0, 1, 1})->Args({16384, 1, 1, 1})->Args({16384, 1, 0, 1})->Args({16384, 1, 1, 0})
    ->UseManualTime();

// HybridGen's CPU stage as measured runs take it, stage by stage, for one decode row of the
// Llama-3.1-8B shape (H = 32, H_kv = 8, D = 128) with F16 KV (the paper's), N = 16K offloaded
// tokens and K = 2048 selected per KV head, on the CPU worker's threads:
//   stage 0: the speculative query, W_q (4096 × 4096, F16 weights) times the layer input;
//   stage 1: the `post` scores, group_logit_max of each KV head's G query heads over its N keys
//            (F16 rows streamed from memory);
//   stage 2: the selection, the logit top-K of each head's N scores (in cache: the scores were
//            just written);
//   stage 3: the selected V rows gathered, sorted positions, F16 rows of 256 B (from memory).
// x_bw: the stage's bytes (weights, keys, V rows) over the paired sequential read; the selection,
// compute on cached scores, reports ns per position. The gather's random rows are compared with a
// random-row read in BM_GatherRows (x_rows).
void BM_HybridGenCpuStage(benchmark::State& st) {
  const int stage = int(st.range(0)), threads = int(st.range(1));
  set_num_threads(threads);
  const int64_t N = 16384, d_model = 4096;
  const int Hkv = 8, G = 4, D = 128;
  const int32_t K = 2048;
  auto be = make_cpu_backend();
  std::vector<float> x(static_cast<size_t>(d_model)), q(static_cast<size_t>(Hkv * G * D)), y(static_cast<size_t>(d_model));
  fill(x.data(), x.size(), 6);
  fill(q.data(), q.size(), 8);
  // `copies` cold copies of `floats` values stored as F16.
  auto f16_copies = [](size_t floats, uint64_t seed) {
    std::vector<float> tmp(floats);
    fill(tmp.data(), floats, seed);
    std::vector<AlignedBuffer> out;
    for (int c = cold_copies(double(floats) * 2); c > 0; --c) {
      out.emplace_back(floats * 2);
      from_f32(DType::kF16, tmp.data(), out.back().data(), floats);
    }
    return out;
  };
  size_t it = 0;
  static const char* kNames[] = {"speculative query", "scores", "selection", "V gather"};
  st.SetLabel(kNames[stage]);
  if (stage == 0) {
    std::vector<float> tmp(size_t(d_model * d_model));
    fill(tmp.data(), tmp.size(), 5);
    std::vector<Weight> ws;
    for (int c = cold_copies(double(tmp.size()) * 2); c > 0; --c)
      ws.push_back(convert_weight(DType::kF32, tmp.data(), DType::kF16, {d_model, d_model}));
    run_paired(st, double(d_model * d_model) * 2, threads,
               [&] { be->matmul(x.data(), 1, ws[it++ % ws.size()], nullptr, y.data()); });
    return;
  }
  std::vector<float> scores(size_t(Hkv * N));
  fill(scores.data(), scores.size(), 3);
  if (stage == 2) {  // compute on cached scores: timed alone (no read pass between), ns per position
    std::vector<int32_t> sel;
    for (auto _ : st) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int g = 0; g < Hkv; ++g) logit_top_k(*be, scores.data() + g * N, 1, N, int32_t(N), K, sel);
      benchmark::DoNotOptimize(sel.data());
      st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    st.counters["ns_per_pos"] = benchmark::Counter(double(Hkv * N), benchmark::Counter::kIsIterationInvariantRate |
                                                                        benchmark::Counter::kInvert);
    return;
  }
  const std::vector<AlignedBuffer> rows = f16_copies(size_t(Hkv * N * D), 7);
  if (stage == 1) {
    run_paired(st, double(Hkv * N * D) * 2, threads, [&] {
      const char* Kc = static_cast<const char*>(rows[it++ % rows.size()].data());
      for (int g = 0; g < Hkv; ++g)
        be->group_logit_max(q.data() + g * G * D, G, Kc + int64_t(g) * N * D * 2, N, D, 0.088f,
                            scores.data() + g * N, DType::kF16);
    });
    return;
  }
  // stage 3: each head's K positions, sorted, as the selection leaves them.
  std::mt19937_64 gen(2);
  std::vector<std::vector<int32_t>> sel(static_cast<size_t>(Hkv));
  for (auto& s : sel) {
    std::vector<int32_t> all(static_cast<size_t>(N));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), gen);
    s.assign(all.begin(), all.begin() + K);
    std::sort(s.begin(), s.end());
  }
  std::vector<uint16_t> out(size_t(Hkv) * K * D);
  // x_rows: against a one-thread read of the same rows of the next copy (rows_read_pass_gbs, the
  // gather's prefetch), right after each gather: the random-row read rate that bounds the copy.
  PairedRatio rows_ratio;
  const double bytes = double(Hkv) * K * D * 2;
  run_paired_then(
      st, bytes, threads,
      [&] {
        const char* V = static_cast<const char*>(rows[it++ % rows.size()].data());
        for (int g = 0; g < Hkv; ++g)
          be->gather_rows(out.data() + int64_t(g) * K * D, V + int64_t(g) * N * D * 2, D * 2, D * 2,
                          sel[size_t(g)].data(), K);
      },
      [&](double dt) {
        const char* W = static_cast<const char*>(rows[it % rows.size()].data());
        set_num_threads(1);  // the gather's one worker
        double secs = 0;     // each head's rows read in turn
        for (int g = 0; g < Hkv; ++g)
          secs += bytes / Hkv / 1e9 /
                  rows_read_pass_gbs(reinterpret_cast<const float*>(W + int64_t(g) * N * D * 2), D / 2,
                                     sel[size_t(g)].data(), K);
        set_num_threads(threads);
        rows_ratio.add(bytes / dt / 1e9, bytes / secs / 1e9);
      });
  st.counters["rows_ref_GB/s"] = rows_ratio.ref_gbs();
  st.counters["x_rows"] = rows_ratio.ratio();
}
BENCHMARK(BM_HybridGenCpuStage)->ArgNames({"stage", "threads"})->ArgsProduct({{0, 1, 2, 3}, {1, 2}})->UseManualTime();

// The scores stage's kernel (group_logit_max, G = 4, D = 128) on one thread with its keys resident
// in L1 (48 keys) or L2 (2048 keys): the compute ceiling under BM_HybridGenCpuStage/stage:1.
// Reported: ns per key and GB/s of keys. type: 0 f32, 1 f16, 2 bf16.
void BM_GroupLogitMaxWarm(benchmark::State& st) {
  set_num_threads(1);
  const int64_t N = st.range(0);
  const int G = 4, D = 128;
  const DType t = kv_type(st.range(1));
  std::vector<float> Kf(size_t(N * D)), q(size_t(G * D)), score(static_cast<size_t>(N));
  fill(Kf.data(), Kf.size(), 7);
  fill(q.data(), q.size(), 8);
  AlignedBuffer Kb(Kf.size() * dtype_size(t));
  from_f32(t, Kf.data(), Kb.data(), Kf.size());
  auto be = make_cpu_backend();
  for (auto _ : st) {
    be->group_logit_max(q.data(), G, Kb.data(), N, D, 0.088f, score.data(), t);
    benchmark::ClobberMemory();
  }
  st.SetLabel(std::string(dtype_name(t)));
  st.counters["ns_per_key"] = benchmark::Counter(double(N) * double(st.iterations()) * 1e-9,
                                                 benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.SetBytesProcessed(N * D * int64_t(dtype_size(t)) * int64_t(st.iterations()));
}
BENCHMARK(BM_GroupLogitMaxWarm)->ArgNames({"N", "type"})->ArgsProduct({{48, 2048}, {0, 1, 2}})->UseRealTime();

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")
// The scores kernel's arithmetic without its software prefetch or horizontal sums: F16 rows of
// 128 (256 B), four keys at a time, each 32-byte block converted and multiplied into four heads'
// accumulators. order 0 loads the four rows' blocks in turn, as logits16 does (addresses 256 B
// apart, then back); order 1 loads each row's blocks in address order. Same loads and FMAs.
[[gnu::noinline]] float key_order_pass(const uint16_t* K, int64_t rows, bool ascending) {
  __m512 a[16];
  for (auto& v : a) v = _mm512_setzero_ps();
  const __m512 q = _mm512_set1_ps(1.0001f);
  auto load = [&](int64_t r, int b) {
    __m512 v = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(K + r * 128 + b * 16)));
    asm volatile("" : "+v"(v));  // one conversion per load, none merged or hoisted
    return v;
  };
  for (int64_t c = 0; c + 4 <= rows; c += 4) {
    if (ascending) {
      for (int i = 0; i < 4; ++i)
        for (int b = 0; b < 8; ++b) {
          const __m512 kv = load(c + i, b);
          for (int h = 0; h < 4; ++h) a[h * 4 + i] = _mm512_fmadd_ps(q, kv, a[h * 4 + i]);
        }
    } else {
      for (int b = 0; b < 8; ++b) {
        __m512 kv[4];
        for (int i = 0; i < 4; ++i) kv[i] = load(c + i, b);
        for (int h = 0; h < 4; ++h)
          for (int i = 0; i < 4; ++i) a[h * 4 + i] = _mm512_fmadd_ps(q, kv[i], a[h * 4 + i]);
      }
    }
  }
  __m512 s = a[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}
#pragma GCC pop_options

// Whether the order of a kernel's loads decides how fast one core streams: key_order_pass over
// 64 MiB of F16 rows from memory (hardware prefetcher only), paired with the read pass. The same
// pass over 64 KiB in L1 sets its arithmetic rate (`L1_GB/s`).
void BM_KeyAccessOrder(benchmark::State& st) {
  if (skip_without_avx512(st)) return;
  set_num_threads(1);
  const bool ascending = st.range(0) != 0;
  const size_t bytes = size_t(64) << 20;
  const std::vector<AlignedBuffer> rows = cold_buffers(bytes, 3);  // any bits: the FMAs' values are not read
  AlignedBuffer warm(65536);
  std::fill_n(static_cast<uint16_t*>(warm.data()), 32768, uint16_t(0x3c00));
  size_t it = 0;
  float sink = 0;
  run_paired(st, double(bytes), 1, [&] {
    sink += key_order_pass(static_cast<const uint16_t*>(rows[it++ % rows.size()].data()),
                           int64_t(bytes / 256), ascending);
  });
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 256; ++r)
    sink += key_order_pass(static_cast<const uint16_t*>(warm.data()), 256, ascending);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sink);
  st.counters["L1_GB/s"] = 256.0 * 65536 / dt / 1e9;
  st.SetLabel(ascending ? "rows in address order" : "four rows in turn (logits16's order)");
}
BENCHMARK(BM_KeyAccessOrder)->ArgNames({"ascending"})->Arg(0)->Arg(1)->UseManualTime();

// HybridGen's post-mode selection (and InfiniGen's): the K positions with the highest max logit
// over G = 4 query heads, out of n, on one thread, after the logits were computed (so they are in
// cache, as in the strategies). method 0: the reference policy op, the std::nth_element selection
// the strategies ran before; 1: the CPU kernel (a sampled lower bound, then a select among the few
// that pass it). Reported: ns per position (`ns_per_pos`).
void BM_LogitTopK(benchmark::State& st) {
  const int32_t n = int32_t(st.range(0)), K = int32_t(st.range(1));
  const int G = 4;
  std::vector<float> l(size_t(G) * size_t(n));
  fill(l.data(), l.size(), 9);
  std::vector<int32_t> out;
  auto cpu = make_cpu_backend();
  auto ref = make_ref_backend();
  for (auto _ : st) {
    logit_top_k(st.range(2) == 0 ? *ref : *cpu, l.data(), G, n, n, K, out);
    benchmark::DoNotOptimize(out.data());
  }
  st.counters["ns_per_pos"] = benchmark::Counter(
      double(n), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  st.SetLabel(st.range(2) == 0 ? "nth_element reference" : "logit_top_k");
}
BENCHMARK(BM_LogitTopK)
    ->ArgNames({"n", "K", "method"})
    ->ArgsProduct({{16384, 65536}, {128, 2048}, {0, 1}})
    ->ArgsProduct({{1024}, {200}, {0, 1}});  // InfiniGen on an RTE context of stories260K

// Keyformer's score policy (one query row of one head over n cached keys: noise, softmax,
// accumulation) against the unit its modeled cost is counted in, the host backend's exp_shift_sum
// over the same n, timed alternately on one thread with the rows in cache as in the strategy.
// x_exp (Keyformer ÷ exp_shift_sum per element) is kKeyformerScoreElems.
void BM_KeyformerScoresVsExpSum(benchmark::State& st) {
  set_num_threads(1);
  const int32_t n = int32_t(st.range(0));
  auto be = make_cpu_backend();
  const size_t un = size_t(n);
  std::vector<float> logits(un), e(un);
  std::vector<PolicyOps::ScoreSlot> acc(un);
  fill(logits.data(), logits.size(), 11);
  fill(e.data(), e.size(), 12);
  for (int32_t i = 0; i < n; ++i) acc[size_t(i)].pos = 3 * i;
  constexpr int kReps = 64;
  std::vector<double> kf, ex;
  PolicyOps::ScoreRows::Row one{acc.data(), n, n, 0, 1.5};
  PolicyOps::ScoreRows sr;
  sr.rule = PolicyOps::ScoreRule::kGumbelSoftmax, sr.H = 1, sr.H_kv = 1, sr.taps = logits.data(), sr.tap_ld = n;
  sr.seed = 1, sr.layer = 2, sr.rows = &one, sr.n_rows = 1;
  for (auto _ : st) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r) {
      ++one.pos;  // a new query row: fresh noise
      be->accumulate_scores(sr);
    }
    auto t1 = std::chrono::steady_clock::now();
    float sink = 0;
    for (int r = 0; r < kReps; ++r) sink += be->exp_shift_sum(e.data(), n, 1.0f);  // stays in (0, 1]
    auto t2 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(sink);
    benchmark::DoNotOptimize(acc.data());
    kf.push_back(std::chrono::duration<double>(t1 - t0).count());
    ex.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  std::sort(kf.begin(), kf.end());
  std::sort(ex.begin(), ex.end());
  const double k = kf[kf.size() / 2], x = ex[ex.size() / 2], per = double(kReps) * n;
  st.counters["keyformer_ns_per_score"] = 1e9 * k / per;
  st.counters["exp_sum_ns_per_elem"] = 1e9 * x / per;
  st.counters["x_exp"] = k / x;
}
BENCHMARK(BM_KeyformerScoresVsExpSum)->ArgNames({"n"})->Arg(1024)->Arg(4096)->Arg(32768)->UseRealTime();

// BM_Gemv's and BM_GemvWarm's weight type argument: 0 F32, 1 BF16, 2 F16.
DType gemv_type(int64_t arg) { return arg == 0 ? DType::kF32 : arg == 1 ? DType::kBF16 : DType::kF16; }

// Decode GEMV (M = 1; cpu::gemv, the CPU backend's path for up to 4 rows): y = x · Wᵀ, W [N, K]. Bytes read: the weights. Cold: cycles
// through enough matrices to exceed the last-level cache.
void BM_Gemv(benchmark::State& st) {
  set_num_threads(int(st.range(3)));
  const int64_t N = st.range(0), K = st.range(1);
  const DType t = gemv_type(st.range(2));
  const int n_mats = cold_copies(double(N * K) * double(dtype_size(t)));
  std::vector<Weight> ws;
  std::vector<float> tmp(size_t(N * K));
  fill(tmp.data(), tmp.size(), 5);
  for (int i = 0; i < n_mats; ++i) ws.push_back(convert_weight(DType::kF32, tmp.data(), t, {N, K}));
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
  fill(x.data(), x.size(), 6);
  auto be = make_cpu_backend();
  st.SetLabel(std::string(dtype_name(t)));
  // Each iteration reads all copies back to back, as a model reads its layers. Timed alone after
  // each reference pass, one call of a small shape read 10-15 % less (docs/performance.md).
  run_paired(st, double(n_mats) * double(N * K) * double(dtype_size(t)), int(st.range(3)), [&] {
    for (const Weight& w : ws) be->matmul(x.data(), 1, w, nullptr, y.data());
  });
}
BENCHMARK(BM_Gemv)
    ->ArgNames({"N", "K", "type", "threads"})  // type: 0 f32, 1 bf16, 2 f16
    ->Args({4096, 4096, 0, 1})
    ->Args({4096, 4096, 0, 2})
    ->Args({4096, 4096, 1, 1})
    ->Args({4096, 4096, 1, 2})
    ->Args({4096, 4096, 2, 1})
    ->Args({4096, 4096, 2, 2})
    // The 110M shape's projections (dim 768, FFN 2048): small matrices, where per-call costs show.
    ->Args({768, 768, 0, 2})
    ->Args({2048, 768, 0, 2})
    ->Args({768, 2048, 0, 2})
    // The same in F16 on one thread: stories110m F16 at one thread is the weakest whole-model row.
    ->Args({768, 768, 2, 1})
    ->Args({2048, 768, 2, 1})
    ->Args({768, 2048, 2, 1})
    // The Llama-3.2-1B shape's F16 projections on one thread (dim 2048, FFN 8192, K/V 512 rows).
    ->Args({2048, 2048, 2, 1})
    ->Args({512, 2048, 2, 1})
    ->Args({8192, 2048, 2, 1})
    ->Args({2048, 8192, 2, 1})
    // BF16 on one thread, as the emulated accelerator streams weights: calibrate's 8192² GEMV
    // against the 1B shape's LM head (128K × 2048, half of its decode bytes).
    ->Args({8192, 8192, 1, 1})
    ->Args({128256, 2048, 1, 1})
    // The same LM head in F16, as the 1B F16 file streams it.
    ->Args({128256, 2048, 2, 1})
    ->Args({128256, 2048, 2, 2})
    ->UseManualTime();

// The same GEMV on one thread with its matrix resident in L2 (256 × 2048) or L1 (16 rows, 32 KiB):
// the rates of the cache levels and of the arithmetic, against which BM_Gemv's streaming rate shows
// what bounds a cold pass.
void BM_GemvWarm(benchmark::State& st) {
  set_num_threads(1);
  const int64_t N = st.range(0), K = st.range(1);
  const DType t = gemv_type(st.range(2));
  std::vector<float> tmp(size_t(N * K));
  fill(tmp.data(), tmp.size(), 5);
  const Weight w = convert_weight(DType::kF32, tmp.data(), t, {N, K});
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
  fill(x.data(), x.size(), 6);
  auto be = make_cpu_backend();
  for (auto _ : st) {
    be->matmul(x.data(), 1, w, nullptr, y.data());
    benchmark::ClobberMemory();
  }
  st.SetLabel(std::string(dtype_name(t)));
  st.SetBytesProcessed(N * K * int64_t(dtype_size(t)) * int64_t(st.iterations()));
}
BENCHMARK(BM_GemvWarm)
    ->ArgNames({"N", "K", "type"})  // type: 0 f32, 1 bf16, 2 f16
    ->Args({256, 2048, 0})
    ->Args({256, 2048, 1})
    ->Args({256, 2048, 2})
    ->Args({16, 512, 0})
    ->Args({16, 1024, 1})
    ->Args({16, 1024, 2});

// Each vendor's tuning on this machine, call by call, the order alternating: the read reference
// (kernel 0: cpu::sum's prefetch distance and hint) and the one-row GEMV of a 4096² matrix (kernel
// 1 + type, as BM_Gemv's: rows in blocks side by side on Intel, as streams on AMD). amd/intel is
// the median per-pair ratio of GB/s (above 1: AMD's choice reads faster here), the evidence behind
// the vendor switches of docs/performance.md, "Tuning choices".
void BM_VendorTunings(benchmark::State& st) {
  const int kernel = int(st.range(0));
  set_num_threads(int(st.range(1)));
  const int64_t N = 4096, K = 4096;
  const DType t = gemv_type(std::max<int64_t>(0, kernel - 1));
  std::vector<Weight> ws;
  std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
  if (kernel > 0) {
    std::vector<float> tmp(size_t(N * K));
    fill(tmp.data(), tmp.size(), 5);
    for (int i = cold_copies(double(N * K) * double(dtype_size(t))); i > 0; --i)
      ws.push_back(convert_weight(DType::kF32, tmp.data(), t, {N, K}));
    fill(x.data(), x.size(), 6);
  }
  auto be = make_cpu_backend();
  const double bytes = kernel > 0 ? double(ws.size()) * double(N * K) * double(dtype_size(t)) : double(128 << 20);
  auto gbs = [&] {
    if (kernel == 0) return probe().pass_gbs(int64_t(bytes));
    const auto t0 = std::chrono::steady_clock::now();
    for (const Weight& w : ws) be->matmul(x.data(), 1, w, nullptr, y.data());
    benchmark::ClobberMemory();
    return bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };
  const CpuTuning saved = cpu_tuning();
  PairedRatio pr;  // kernel: AMD's tuning, ref: Intel's
  bool amd_first = false;
  for (auto _ : st) {
    double g[2];  // [0] Intel, [1] AMD
    for (int o = 0; o < 2; ++o) {
      const int v = (o == 0) == amd_first;
      set_cpu_tuning(v ? CpuTuning::kAmd : CpuTuning::kIntel);
      g[v] = gbs();
    }
    pr.add(g[1], g[0]);
    amd_first = !amd_first;
  }
  set_cpu_tuning(saved);
  st.SetLabel(kernel == 0 ? "read reference" : "gemv " + std::string(dtype_name(t)));
  st.counters["intel_GB/s"] = pr.ref_gbs();
  st.counters["amd_GB/s"] = pr.gbs();
  st.counters["amd/intel"] = pr.ratio();
}
BENCHMARK(BM_VendorTunings)
    ->ArgNames({"kernel", "threads"})  // kernel: 0 the read reference, 1 + BM_Gemv's type
    ->ArgsProduct({{0, 1, 2, 3}, {1, 2}})
    ->UseRealTime()
    ->MinTime(2.0);

// The read reference's split of its pass over the threads: ranges taken as the threads come free
// (read_pass_gbs, the split the decode GEMV takes) against one fixed chunk per thread, 64 MiB
// passes alternating over a 512 MiB buffer. ranges/halves is the median per-pair ratio of GB/s
// (docs/performance.md, "Tuning choices").
void BM_ReadSplits(benchmark::State& st) {
  set_num_threads(int(st.range(0)));
  const int64_t N = std::max<int64_t>(int64_t(512) << 20, 3 * last_level_cache_bytes()) / 4;
  const int64_t n = int64_t(64) << 20 >> 2;
  AlignedBuffer buf(size_t(N) * 4);
  float* p = static_cast<float*>(buf.data());
  parallel_chunks(N, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, 1.0f); });
  int64_t pos = 0;
  auto next = [&] {
    if (pos + n > N) pos = 0;
    const float* q = p + pos;
    pos += n;
    return q;
  };
  auto halves = [&] {
    const float* a = next();
    float part[64] = {};
    const auto t0 = std::chrono::steady_clock::now();
    parallel_chunks(n, [&](int64_t b, int64_t e) { part[b * 64 / n] = cpu::sum(a + b, e - b); });
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(part);
    return double(n) * 4 / dt / 1e9;
  };
  PairedRatio pr;  // kernel: ranges, ref: fixed chunks
  bool ranges_first = false;
  for (auto _ : st) {
    double r = 0, h = 0;
    if (ranges_first) {
      r = read_pass_gbs(next(), n);
      h = halves();
    } else {
      h = halves();
      r = read_pass_gbs(next(), n);
    }
    pr.add(r, h);
    ranges_first = !ranges_first;
  }
  st.counters["ranges_GB/s"] = pr.gbs();
  st.counters["halves_GB/s"] = pr.ref_gbs();
  st.counters["ranges/halves"] = pr.ratio();
}
BENCHMARK(BM_ReadSplits)->ArgNames({"threads"})->Arg(1)->Arg(2)->Iterations(200)->UseRealTime();

// `hgbench calibrate`'s dram bandwidth against an independent STREAM-style read (an OpenMP
// reduction with eight chains over 256 MiB from host_alloc, the page size calibrate reads from),
// measured in turn five times: x_stream is the median of calibrate / stream. Also reports the
// emulated accelerator's SGEMM rate over the CPU's (below 1 when it has fewer threads).
double stream_read_gbs(double* a, size_t n) {
  double best = 0;
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    double s = 0;
#pragma omp parallel reduction(+ : s)
    {
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
#pragma omp for
      for (size_t i = 0; i < n; i += 8) {
        s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
        s4 += a[i + 4], s5 += a[i + 5], s6 += a[i + 6], s7 += a[i + 7];
      }
      s += s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    }
    benchmark::DoNotOptimize(s);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(n) * 8 / dt / 1e9);
  }
  return best;
}

void BM_CalibrateVsStream(benchmark::State& st) {
  set_num_threads(hardware_threads());
  const size_t n = size_t(256) << 20 >> 3;
  std::unique_ptr<double, decltype(&std::free)> buf(static_cast<double*>(host_alloc(n * 8)), &std::free);
  if (!buf) {
    st.SkipWithError("host_alloc of 256 MiB failed");
    return;
  }
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) buf.get()[i] = double(i % 7);
  MemorySystem mem(TierConfig{});
  PairedRatio pr;
  for (auto _ : st) pr.add(measure_read_gbs(mem, Tier::kDram, int64_t(256) << 20, 0.3), stream_read_gbs(buf.get(), n));
  st.counters["calibrate_GB/s"] = pr.gbs();
  st.counters["stream_GB/s"] = pr.ref_gbs();
  st.counters["x_stream"] = pr.ratio();
}
BENCHMARK(BM_CalibrateVsStream)->Iterations(5)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace
}  // namespace hg

BENCHMARK_MAIN();
