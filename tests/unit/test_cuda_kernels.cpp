// Every CUDA kernel against the CPU backend (or the ref oracle) on random inputs; tolerances from
// the table below (BF16 GEMM as in test_cpu_kernels). Built whenever nvcc exists; each test skips
// with a message when no CUDA device is visible.
#include <cmath>

#include "baselines/full/full.h"
#include "baselines/registry.h"
#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_kernels.h"
#include "engine/decoder/decoder.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "contract_backend.h"
#include "eviction_case.h"
#include "test_util.h"

namespace hg {
namespace {

constexpr test::Tol kTolF32{1e-4, 1e-4};
constexpr test::Tol kTolGemmF32{1e-3, 1e-3};  // cuBLAS may use TF32-free but reordered sums
constexpr test::Tol kTolGemmHalf{3e-2, 2e-2};

#define HG_REQUIRE_CUDA_DEVICE() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device visible; CUDA kernels compiled but not run"

// Device copy of a host vector, freed at scope exit.
template <typename T>
struct Dev {
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    p = static_cast<T*>(cuda::dev_alloc(std::max<size_t>(1, n) * sizeof(T)));
    if (n) cuda::h2d(p, h.data(), n * sizeof(T));
  }
  explicit Dev(size_t count) : n(count) { p = static_cast<T*>(cuda::dev_alloc(std::max<size_t>(1, n) * sizeof(T))); }
  ~Dev() { cuda::dev_free(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    cuda::synchronize();
    if (n) cuda::d2h(h.data(), p, n * sizeof(T));
    return h;
  }
  T* p;
  size_t n;
};

// A cache of F32 values as `t` elements (F32: the bytes as they are).
std::vector<uint16_t> as_half(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = t == DType::kBF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
  return h;
}
struct KvBytes {
  KvBytes(const std::vector<float>& x, DType t) : f(x), h(t == DType::kF32 ? std::vector<uint16_t>{} : as_half(x, t)), t(t) {}
  const void* data() const { return t == DType::kF32 ? static_cast<const void*>(f.data()) : h.data(); }
  size_t bytes() const { return f.size() * dtype_size(t); }
  std::vector<float> f;
  std::vector<uint16_t> h;
  DType t;
};
constexpr DType kKvTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// cuBLAS is opened at run time, not linked: with the toolkit installed it opens, device or not.
TEST(CudaBuild, CublasOpensAtRunTime) { EXPECT_GE(cuda::open_cublas(), 12); }

TEST(CudaKernels, GemmMatchesCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
    // M = 1 with K % 8 == 0 takes the decode GEMV for half weights (x read as F32, not rounded);
    // the other shapes take cuBLAS (x rounded to the weights' type).
    for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 17, 97},
                           {17, 97, 33},
                           {64, 1024, 512},
                           {1, 1024, 37},
                           {1, 4096, 1001},
                           {1, 14336, 64}}) {
      auto x = test::random_vec(size_t(M * K), 1);
      auto wf = test::random_vec(size_t(N * K), 2);
      auto b = test::random_vec(size_t(N), 3);
      Weight w = convert_weight(DType::kF32, wf.data(), t, {N, K});
      std::vector<uint8_t> wb(w.bytes());
      std::memcpy(wb.data(), w.buf.data(), w.bytes());
      Dev<float> dx(x), db(b), dy(size_t(M * N));
      Dev<uint8_t> dw(wb), dh(size_t(M * K * 2));
      cuda::gemm(dx.p, M, dw.p, t, N, K, db.p, dy.p, dh.p);
      std::vector<float> ref(size_t(M * N));
      if (t == DType::kF32) {
        cpu->matmul(x.data(), M, w, b.data(), ref.data());
      } else {  // the oracle: ref backend on the activations the kernel reads (rounded for cuBLAS)
        if (!(M == 1 && K % 8 == 0))
          for (auto& v : x) v = t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
        make_ref_backend()->matmul(x.data(), M, w, b.data(), ref.data());
      }
      const auto got = dy.host();
      EXPECT_TRUE(test::all_close(got.data(), ref.data(), ref.size(), t == DType::kF32 ? kTolGemmF32 : kTolGemmHalf))
          << dtype_name(t) << " M" << M << " K" << K << " N" << N;
    }
}

TEST(CudaKernels, ElementwiseAndNormsMatchCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  const int64_t M = 5, n = 1000;
  auto x = test::random_vec(size_t(M * n), 4), w = test::random_vec(size_t(n), 5), b = test::random_vec(size_t(n), 6);
  auto u = test::random_vec(size_t(M * n), 7);
  Dev<float> dx(x), dw(w), db(b), du(u), dy(size_t(M * n));
  std::vector<float> ref(size_t(M * n));
  cuda::rms_norm(dx.p, dw.p, M, n, 1e-5f, dy.p);
  cpu->rms_norm(x.data(), w.data(), M, n, 1e-5f, ref.data());
  EXPECT_TRUE(test::all_close(dy.host().data(), ref.data(), ref.size(), kTolF32)) << "rms_norm";
  cuda::layer_norm(dx.p, dw.p, db.p, M, n, 1e-5f, dy.p);
  cpu->layer_norm(x.data(), w.data(), b.data(), M, n, 1e-5f, ref.data());
  EXPECT_TRUE(test::all_close(dy.host().data(), ref.data(), ref.size(), kTolF32)) << "layer_norm";
  cuda::swiglu(dx.p, du.p, M * n, dy.p);
  cpu->swiglu(x.data(), u.data(), M * n, ref.data());
  EXPECT_TRUE(test::all_close(dy.host().data(), ref.data(), ref.size(), kTolF32)) << "swiglu";
  Dev<float> dr(x);
  cuda::relu(dr.p, M * n);
  auto r = x;
  cpu->relu(r.data(), M * n);
  EXPECT_TRUE(test::all_close(dr.host().data(), r.data(), r.size(), {0, 0})) << "relu";
  cuda::add(dr.p, du.p, M * n);
  cpu->add(r.data(), u.data(), M * n);
  EXPECT_TRUE(test::all_close(dr.host().data(), r.data(), r.size(), kTolF32)) << "add";
  cuda::add_bias(dr.p, db.p, M, n);
  for (int64_t m = 0; m < M; ++m) cpu->add(r.data() + m * n, b.data(), n);
  EXPECT_TRUE(test::all_close(dr.host().data(), r.data(), r.size(), kTolF32)) << "bias";
}

TEST(CudaKernels, RopeAndEmbedMatchCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  HParams hp;
  hp.head_dim = 64;
  hp.rope_theta = 500000;
  hp.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 8192};
  for (RopeStyle st : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    hp.rope_style = st;
    const RopeTable t = make_rope_table(hp, {});
    std::vector<float> inv(t.inv_freq.begin(), t.inv_freq.end());
    const int64_t M = 4;
    const int H = 3;
    auto x = test::random_vec(size_t(M * H * 64), 8);
    std::vector<int32_t> pos = {0, 7, 1000, 30000};
    Dev<float> dx(x), dinv(inv);
    Dev<int32_t> dpos(pos);
    cuda::rope(dx.p, M, H, 64, dpos.p, dinv.p, st == RopeStyle::kInterleaved);
    cpu->rope(x.data(), M, H, 64, pos.data(), t);
    EXPECT_TRUE(test::all_close(dx.host().data(), x.data(), x.size(), {2e-3, 1e-3})) << int(st);  // fp32 angles
  }
  auto tab = test::random_vec(50 * 33, 9);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    Weight w = convert_weight(DType::kF32, tab.data(), t, {50, 33});
    std::vector<uint8_t> wb(w.bytes());
    std::memcpy(wb.data(), w.buf.data(), w.bytes());
    std::vector<int32_t> ids = {3, 49, 0};
    Dev<uint8_t> dw(wb);
    Dev<int32_t> did(ids);
    Dev<float> dy(3 * 33);
    cuda::embed(dw.p, t, 33, did.p, 3, dy.p);
    std::vector<float> ref(3 * 33);
    cpu->embed(w, ids.data(), 3, ref.data());
    EXPECT_TRUE(test::all_close(dy.host().data(), ref.data(), ref.size(), {0, 0})) << dtype_name(t);
  }
}

TEST(CudaKernels, SplitAttentionEqualsCpuAttention) {
  HG_REQUIRE_CUDA_DEVICE();
  // Keys split in two sets (as HybridGen: device-resident and CPU-computed logits), merged in
  // token order, softmax, weighted V sum over the gathered V set = exact attention on the CPU.
  const int H = 8, H_kv = 2, D = 64;
  const int64_t n = 301, ld = 320;
  auto q = test::random_vec(size_t(H * D), 10);
  auto K = test::random_vec(size_t(H_kv * ld * D), 11, -2, 2);
  auto V = test::random_vec(size_t(H_kv * ld * D), 12);
  const float scale = 0.125f;
  std::vector<float> ref(size_t(H * D));
  AttnRow row{K.data(), V.data(), ld * D, int32_t(n)};
  make_cpu_backend()->attention(attention_args(H, H_kv, D, scale, q.data(), {&row, 1}, ref.data()));

  // Part A: even tokens' logits on the device; part B: odd tokens' logits computed on the CPU.
  std::vector<int32_t> a_pos, b_pos;
  for (int32_t t = 0; t < n; ++t) (t % 2 ? b_pos : a_pos).push_back(t);
  const int64_t na = int64_t(a_pos.size()), nb = int64_t(b_pos.size());
  // Device keys of part A: gathered rows per KV head.
  std::vector<float> Ka(size_t(H_kv * na * D));
  for (int g = 0; g < H_kv; ++g)
    for (int64_t i = 0; i < na; ++i)
      std::memcpy(&Ka[size_t((g * na + i) * D)], &K[size_t((g * ld + a_pos[size_t(i)]) * D)], size_t(D) * 4);
  std::vector<float> lb(size_t(H * nb));
  for (int h = 0; h < H; ++h)
    for (int64_t j = 0; j < nb; ++j) {
      double s = 0;
      for (int d = 0; d < D; ++d) s += double(q[size_t(h * D + d)]) * K[size_t(((h / (H / H_kv)) * ld + b_pos[size_t(j)]) * D + d)];
      lb[size_t(h * nb + j)] = float(s * scale);
    }
  Dev<float> dq(q), dKa(Ka), dla(size_t(H * na)), dlb(lb), dp(size_t(H * n)), dV(V), dout(size_t(H * D));
  Dev<int32_t> dapos(a_pos), dbpos(b_pos);
  cuda::attention_logits(dq.p, dKa.p, DType::kF32, na, na, H, H_kv, D, scale, dla.p);
  cuda::concat_softmax(dla.p, na, dapos.p, dlb.p, nb, dbpos.p, H, dp.p);
  // Gather V rows in token order per KV head (row gather by index), then aggregate.
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) order[size_t(t)] = t;
  Dev<int32_t> dorder(order);
  Dev<float> dVg(size_t(H_kv * n * D));
  for (int g = 0; g < H_kv; ++g)
    cuda::gather_rows(dVg.p + g * n * D, dV.p + g * ld * D, D * 4, D * 4, dorder.p, n);
  cuda::weighted_v_sum(dp.p, dVg.p, DType::kF32, n, n, H, H_kv, D, dout.p);
  const auto got = dout.host();
  EXPECT_TRUE(test::all_close(got.data(), ref.data(), ref.size(), {2e-5, 1e-4}));
}

// Decode attention through the cuda backend (grouped float4 kernels for whole-float4 rows and
// G ≤ 8, the per-(head, token) kernels otherwise) equals the CPU backend's: GQA groups of 1-8 and
// 16, head dims 64/80/128 and 18 (not a float4 multiple), 1 to 5000 keys (one and many chunks), a
// head stride longer than the row count.
TEST(CudaKernels, DecodeAttentionMatchesCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_backend("cuda");
  struct Shape {
    int H, H_kv, D;
    int32_t n;
  };
  for (const Shape s : {Shape{32, 8, 128, 5000},
                        {28, 4, 128, 777},
                        {12, 12, 64, 300},
                        {8, 1, 80, 1000},
                        {14, 2, 64, 1},
                        {16, 1, 64, 129},
                        {6, 2, 18, 257}}) {
    const int64_t cap = s.n + 13, hs = cap * s.D;
    const auto q = test::random_vec(size_t(s.H * s.D), 30 + s.n);
    const auto K = test::random_vec(size_t(s.H_kv * hs), 31 + s.n, -2, 2);
    const auto V = test::random_vec(size_t(s.H_kv * hs), 32 + s.n);
    std::vector<float> want(size_t(s.H * s.D)), got(want.size(), NAN);
    const float scale = 1.0f / std::sqrt(float(s.D));
    for (DType t : kKvTypes) {  // the same cache elements on both sides: F32 tolerances for every type
      const KvBytes Kt(K, t), Vt(V, t);
      AttnRow row{Kt.data(), Vt.data(), hs, s.n};
      cpu->attention(attention_args(s.H, s.H_kv, s.D, scale, q.data(), {&row, 1}, want.data(), t));
      BackendArray<float> dq(*gpu, q.size()), dout(*gpu, got.size());
      BackendArray<char> dK(*gpu, Kt.bytes()), dV(*gpu, Vt.bytes());
      gpu->upload(dq.data(), q.data(), q.size() * 4);
      gpu->upload(dK.data(), Kt.data(), Kt.bytes());
      gpu->upload(dV.data(), Vt.data(), Vt.bytes());
      std::fill(got.begin(), got.end(), NAN);
      gpu->upload(dout.data(), got.data(), got.size() * 4);  // NaN poison: every element must be written
      AttnRow drow{dK.data(), dV.data(), hs, s.n};
      gpu->attention(attention_args(s.H, s.H_kv, s.D, scale, dq.data(), {&drow, 1}, dout.data(), t));
      gpu->download(got.data(), dout.data(), got.size() * 4);
      EXPECT_TRUE(test::all_close(got.data(), want.data(), want.size(), {2e-5, 1e-4}))
          << "H " << s.H << " H_kv " << s.H_kv << " D " << s.D << " n " << s.n << " kv " << dtype_name(t);
    }
  }
}

// Many query rows in one call (prefill: every row of a chunk in one pair of launches), of two
// sequences with their own K/V and causal key counts, and a head dim the
// float4 kernels do not take (each row on its own then): the CPU backend's result.
TEST(CudaKernels, PrefillAttentionMatchesCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_backend("cuda");
  for (const int D : {128, 18}) {
    const int H = 32, H_kv = 8;
    const int64_t cap = 1200, hs = cap * D;
    std::vector<int32_t> n_keys;
    for (int r = 0; r < 300; ++r) n_keys.push_back(400 + r + 1);  // sequence A, positions 400..699
    for (int r = 0; r < 5; ++r) n_keys.push_back(r + 1);          // sequence B, positions 0..4
    const int R = int(n_keys.size());
    const auto q = test::random_vec(size_t(R) * H * D, 50 + D);
    std::vector<float> K[2], V[2];
    for (int s2 = 0; s2 < 2; ++s2) {
      K[s2] = test::random_vec(size_t(H_kv * hs), 51 + s2, -2, 2);
      V[s2] = test::random_vec(size_t(H_kv * hs), 53 + s2);
    }
    auto rows_for = [&](const float* k0, const float* v0, const float* k1, const float* v1) {
      std::vector<AttnRow> rows;
      for (int r = 0; r < R; ++r)
        rows.push_back(r < 300 ? AttnRow{k0, v0, hs, n_keys[size_t(r)]}
                               : AttnRow{k1, v1, hs, n_keys[size_t(r)]});
      return rows;
    };
    const float scale = 1.0f / std::sqrt(float(D));
    std::vector<float> want(q.size()), got(q.size(), NAN);
    const auto hrows = rows_for(K[0].data(), V[0].data(), K[1].data(), V[1].data());
    cpu->attention(attention_args(H, H_kv, D, scale, q.data(), hrows, want.data()));
    BackendArray<float> dq(*gpu, q.size()), dout(*gpu, got.size()), dK0(*gpu, K[0].size()),
        dV0(*gpu, V[0].size()), dK1(*gpu, K[1].size()), dV1(*gpu, V[1].size());
    gpu->upload(dq.data(), q.data(), q.size() * 4);
    gpu->upload(dout.data(), got.data(), got.size() * 4);  // NaN poison
    gpu->upload(dK0.data(), K[0].data(), K[0].size() * 4);
    gpu->upload(dV0.data(), V[0].data(), V[0].size() * 4);
    gpu->upload(dK1.data(), K[1].data(), K[1].size() * 4);
    gpu->upload(dV1.data(), V[1].data(), V[1].size() * 4);
    const auto drows = rows_for(dK0.data(), dV0.data(), dK1.data(), dV1.data());
    gpu->attention(attention_args(H, H_kv, D, scale, dq.data(), drows, dout.data()));
    gpu->download(got.data(), dout.data(), got.size() * 4);
    EXPECT_TRUE(test::all_close(got.data(), want.data(), want.size(), {2e-5, 1e-4})) << "D " << D;
  }
}

// New K/V rows into a cache on the device equal the host implementation.
// The same bytes for F32, F16 and BF16 caches (round to nearest even on both sides), and the
// device conversion back to F32 is exact.
TEST(CudaKernels, KvWriteMatchesHost) {
  HG_REQUIRE_CUDA_DEVICE();
  const int n = 5, Hkv = 3, D = 20;
  const int64_t cap = 11, hs = cap * D;
  const auto src = test::random_vec(size_t(n * Hkv * D), 201);
  const std::vector<int32_t> pos = {0, 3, 4, 9, 10};
  auto be = make_backend("cuda");
  for (DType t : kKvTypes) {
    const size_t bytes = size_t(Hkv * hs) * dtype_size(t);
    std::vector<char> want(bytes, 0x55), got(bytes);
    write_kv_host(src.data(), n, Hkv, D, pos.data(), want.data(), hs, t);
    Dev<float> s(src);
    Dev<char> dst(std::vector<char>(bytes, 0x55));
    Dev<int32_t> p(pos);
    cuda::kv_write(s.p, n, Hkv, D, p.p, dst.p, hs, t);
    EXPECT_EQ(dst.host(), want) << dtype_name(t);
    std::vector<float> host_f32(size_t(Hkv * hs)), dev_f32(host_f32.size());
    make_cpu_backend()->convert_to_f32(want.data(), t, int64_t(host_f32.size()), host_f32.data());
    Dev<float> df(host_f32.size());
    be->convert_to_f32(dst.p, t, int64_t(host_f32.size()), df.p);
    EXPECT_EQ(std::memcmp(df.host().data(), host_f32.data(), host_f32.size() * 4), 0) << dtype_name(t);
  }
}

// The device-resident decoder: the cuda backend (weights uploaded, activations and the `full`
// KV cache in device memory) gives the CPU backend's logits, prefill and decode.
// The policy calls (max, exp-shift-sum, gather with host indices) and attention with taps
// (H2O's and Keyformer's scores) on the cuda backend against the CPU backend.
// H2O's and Keyformer's scoring and picks on the device against the CPU's: the sum rule bit for
// bit (the same F64 adds in the same order), the Gumbel softmax within F32 exp's error, the picks
// (one victim and many, with and without a recent window), SnapKV's pooling and put_rows exactly.
TEST(CudaBackend, EvictionScoresAndPicksMatchCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  auto cuda = make_backend("cuda");
  auto cpu = make_cpu_backend();
  const test::EvictionCase c = test::eviction_case({1, 37, 3000}, 23);
  for (auto rule : {PolicyOps::ScoreRule::kSum, PolicyOps::ScoreRule::kGumbelSoftmax}) {
    auto want = c.slots;
    Dev<PolicyOps::ScoreSlot> dslots(c.slots);
    Dev<float> dtaps(c.taps);
    for (auto [be, slots, taps] : {std::tuple{cpu.get(), want.data(), c.taps.data()},
                                   std::tuple{cuda.get(), dslots.p, static_cast<const float*>(dtaps.p)}}) {
      const auto rows = test::score_rows(c, slots);
      PolicyOps::ScoreRows a;
      a.rule = rule, a.H = c.H, a.H_kv = c.H_kv, a.taps = taps, a.tap_ld = c.tap_ld, a.seed = 9, a.layer = 1;
      a.rows = rows.data(), a.n_rows = int64_t(rows.size());
      be->accumulate_scores(a);
    }
    const auto got = dslots.host();
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].pos, want[i].pos) << i;
      if (rule == PolicyOps::ScoreRule::kSum) EXPECT_EQ(got[i].score, want[i].score) << i;
      else EXPECT_NEAR(got[i].score, want[i].score, 2e-6) << i;
    }
  }
  Dev<PolicyOps::ScoreSlot> dslots(c.slots);
  for (auto [recent, count] : {std::pair{0, 1}, std::pair{5, 1}, std::pair{0, 30}, std::pair{7, 2000}, std::pair{36, 1}}) {
    const auto picks = test::eviction_picks(c, c.slots.data(), recent, count);
    auto dpicks = test::eviction_picks(c, dslots.p, recent, count);
    int64_t total = 0;
    for (auto& p : picks) total = std::max(total, p.at + p.count);
    std::vector<int32_t> want(size_t(total), -1);
    Dev<int32_t> dout(want);
    cpu->pick_evictions(picks.data(), int64_t(picks.size()), want.data());
    cuda->pick_evictions(dpicks.data(), int64_t(dpicks.size()), dout.p);
    EXPECT_EQ(dout.host(), want) << "recent " << recent << " count " << count;
  }
  // SnapKV's pooling (mean and max over 5 positions) of every head's slots.
  for (bool mx : {false, true}) {
    auto want = c.slots;
    Dev<PolicyOps::ScoreSlot> dp(c.slots);
    std::vector<PolicyOps::ScorePool> hp, dv;
    for (size_t r = 0; r < c.n.size(); ++r)
      for (int g = 0; g < c.H_kv; ++g) {
        const size_t off = (r * size_t(c.H_kv) + size_t(g)) * size_t(c.slot_ld);
        hp.push_back({want.data() + off, c.n[r]}), dv.push_back({dp.p + off, c.n[r]});
      }
    cpu->pool_scores(hp.data(), int64_t(hp.size()), 5, mx);
    cuda->pool_scores(dv.data(), int64_t(dv.size()), 5, mx);
    const auto got = dp.host();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i].score, want[i].score, 1e-12) << i << " max " << mx;
  }
  std::vector<PolicyOps::ScoreSlot> src = {{1.5, 7, 0}, {2.5, 9, 0}};
  std::vector<void*> at = {dslots.p + 8, dslots.p + 3};
  cuda->put_rows(at.data(), src.data(), int64_t(sizeof(PolicyOps::ScoreSlot)), 2);
  const auto h = dslots.host();
  EXPECT_EQ(h[8].pos, 7);
  EXPECT_EQ(h[3].score, 2.5);
}

TEST(CudaBackend, PolicyOpsAndAttentionTapsMatchCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  auto cuda = make_backend("cuda");
  auto cpu = make_cpu_backend();
  for (int64_t n : {1, 1000, 70000}) {
    auto x = test::random_vec(size_t(n), 92, -30, 5);
    Dev<float> dx(x);
    EXPECT_EQ(cuda->max_value(dx.p, n), cpu->max_value(x.data(), n)) << n;
    const float s = cuda->exp_shift_sum(dx.p, n, 1.5f), sc = cpu->exp_shift_sum(x.data(), n, 1.5f);
    EXPECT_NEAR(s, sc, 1e-5 * sc) << n;
    EXPECT_TRUE(test::all_close(dx.host().data(), x.data(), x.size(), {1e-6, 1e-5})) << n;
  }
  const std::vector<float> rows = test::random_vec(500 * 5, 93);
  std::vector<int32_t> idx = {4, 499, 0, 4, 17};
  Dev<float> drows(rows), dg(idx.size() * 3);
  cuda->gather_rows(dg.p, drows.p, 12, 20, idx.data(), int64_t(idx.size()));
  std::vector<float> want(idx.size() * 3);
  cpu->gather_rows(want.data(), rows.data(), 12, 20, idx.data(), int64_t(idx.size()));
  EXPECT_EQ(dg.host(), want);
  // copy_rows: rows of two device buffers into scattered rows of a third, against the CPU's.
  {
    Dev<float> dc(idx.size() * 6);
    std::vector<float> wc(idx.size() * 6, 0.0f);
    Dev<float> zero(wc);
    std::vector<void*> dd, hd;
    std::vector<const void*> ds, hs;
    for (size_t i = 0; i < idx.size(); ++i) {
      const size_t at = (idx.size() - 1 - i) * 6;
      dd.push_back(dc.p + at), hd.push_back(wc.data() + at);
      const float* base = i % 2 ? drows.p : dg.p;
      const float* hbase = i % 2 ? rows.data() : want.data();
      const size_t off = i % 2 ? size_t(idx[i]) * 5 : i * 3;
      ds.push_back(base + off), hs.push_back(hbase + off);
    }
    cuda->copy(dc.p, zero.p, wc.size() * 4);
    cuda->copy_rows(dd.data(), ds.data(), 12, int64_t(dd.size()));
    cpu->copy_rows(hd.data(), hs.data(), 12, int64_t(hd.size()));
    EXPECT_EQ(dc.host(), wc);
  }
  // heads_logits: every KV group's logits in one launch, keys ld rows apart, against the CPU's.
  for (auto [H, Hkv, D, n] : {std::tuple{8, 2, 128, 300}, std::tuple{6, 3, 40, 17}}) {
    const int64_t ld = n + 3;
    auto q = test::random_vec(size_t(H * D), 97);
    auto K = test::random_vec(size_t(Hkv * ld * D), 98, -3, 3);
    Dev<float> dq(q), dK(K), dl(size_t(H * n));
    std::vector<float> lg(size_t(H * n));
    cpu->heads_logits(q.data(), H, Hkv, K.data(), ld, n, D, 0.125f, lg.data(), DType::kF32);
    cuda->heads_logits(dq.p, H, Hkv, dK.p, ld, n, D, 0.125f, dl.p, DType::kF32);
    EXPECT_TRUE(test::all_close(dl.host().data(), lg.data(), lg.size(), kTolF32)) << "heads_logits H " << H;
  }
  for (auto [H, Hkv, D, n] : {std::tuple{8, 2, 128, 300}, std::tuple{4, 4, 64, 33}}) {
    const int64_t ld = n + 5;  // rows of the cache and of the taps wider than the keys attended
    auto q = test::random_vec(size_t(2 * H * D), 94);
    auto K = test::random_vec(size_t(Hkv * ld * D), 95, -3, 3);
    auto V = test::random_vec(size_t(Hkv * ld * D), 96);
    Dev<float> dq(q), dK(K), dV(V), dout(q.size()), dl(size_t(2 * H * ld)), dp(size_t(2 * H * ld));
    for (int mode = 0; mode < 3; ++mode) {  // 0: both taps, 1: logits only, 2: probs only
      std::vector<float> out(q.size()), lg(size_t(2 * H * ld)), pr(lg.size());
      AttnRow hr[2] = {{K.data(), V.data(), ld * D, int32_t(n)}, {K.data(), V.data(), ld * D, int32_t(n - 3)}};
      AttentionArgs a = attention_args(H, Hkv, D, 0.125f, q.data(), hr, out.data());
      a.tap_ld = ld;
      a.logits_out = mode != 2 ? lg.data() : nullptr;
      a.probs_out = mode != 1 ? pr.data() : nullptr;
      cpu->attention(a);
      AttnRow dr[2] = {{dK.p, dV.p, ld * D, int32_t(n)}, {dK.p, dV.p, ld * D, int32_t(n - 3)}};
      AttentionArgs b = attention_args(H, Hkv, D, 0.125f, dq.p, dr, dout.p);
      b.tap_ld = ld;
      b.logits_out = mode != 2 ? dl.p : nullptr;
      b.probs_out = mode != 1 ? dp.p : nullptr;
      cuda->attention(b);
      const std::string what = "H" + std::to_string(H) + " mode " + std::to_string(mode);
      EXPECT_TRUE(test::all_close(dout.host().data(), out.data(), out.size(), kTolF32)) << what;
      for (int r = 0; r < 2; ++r)
        for (int h = 0; h < H; ++h) {
          const size_t at = size_t((r * H + h) * ld), len = size_t(r ? n - 3 : n);
          if (mode != 2) {
            EXPECT_TRUE(test::all_close(dl.host().data() + at, lg.data() + at, len, kTolF32)) << what;
          }
          if (mode != 1) {
            EXPECT_TRUE(test::all_close(dp.host().data() + at, pr.data() + at, len, kTolF32)) << what;
          }
        }
    }
  }
}

TEST(CudaBackend, DecoderLogitsMatchCpu) {
  HG_REQUIRE_CUDA_DEVICE();
  for (const char* preset : {"tiny-llama", "tiny-qwen2", "tiny-opt"}) {
    Model m = load_model(std::string("synthetic:") + preset);
    std::vector<float> logits[2];
    int i = 0;
    for (const char* name : {"cpu", "cuda"}) {
      auto be = make_backend(name);
      FullStrategy kv(*be);
      Decoder dec(m, *be, kv);
      const std::vector<int32_t> toks = {1, 20, 30, 40, 50, 60};
      std::vector<TokenRow> rows;
      for (int p = 0; p < 5; ++p) rows.push_back({0, p});
      const int32_t cap = 8, pl = 5, last = 4, zero = 0;
      kv.begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
      std::vector<float> lg(size_t(2 * m.hp.n_vocab));
      dec.forward(std::span<const int32_t>(toks.data(), 5), rows, std::span<const int32_t>(&last, 1), lg.data());
      const TokenRow r{0, 5};
      dec.forward(std::span<const int32_t>(&toks[5], 1), std::span<const TokenRow>(&r, 1),
                  std::span<const int32_t>(&zero, 1), lg.data() + m.hp.n_vocab);
      logits[i++] = lg;
    }
    EXPECT_TRUE(test::all_close(logits[1].data(), logits[0].data(), logits[0].size(), kTolGemmF32)) << preset;
  }
}

// `--device cuda`: the runtime drives the GPU from the accelerator queue, the KV cache is on the
// gpu tier (cudaMalloc), and greedy tokens equal the cpu device's for a few steps.
TEST(CudaBackend, RuntimeDeviceCudaGenerates) {
  HG_REQUIRE_CUDA_DEVICE();
  Model m = load_model("synthetic:tiny-llama");
  GenerateOptions o;
  o.n_new = 6;
  o.stop_at_eos = false;
  o.sampler.greedy = true;
  auto cpu = make_cpu_backend();
  FullStrategy kc(*cpu);
  const auto want = generate(m, *cpu, kc, {{1, 20, 30, 40}}, o);
  RuntimeConfig rc;
  rc.device = "cuda";
  Runtime rt(rc);
  ASSERT_EQ(rt.device(), DeviceKind::kCuda);
  auto kv = make_strategy("full", StrategyContext{rt.accel_backend(), &rt, &m}, {});
  o.runtime = &rt;
  const auto got = generate(m, rt.accel_backend(), *kv, {{1, 20, 30, 40}}, o);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(rt.memory().ledger().usage(Tier::kGpu).peak, 0);
  // Every strategy that declares the GPU builds on it; one that does not is refused, not run.
  for (const StrategyInfo& s : strategies()) {
    if (s.runs_on_cuda)
      EXPECT_NO_THROW(make_strategy(s.name, StrategyContext{rt.accel_backend(), &rt, &m}, {})) << s.name;
    else
      EXPECT_THROW(make_strategy(s.name, StrategyContext{rt.accel_backend(), &rt, &m}, {}), UnsupportedError) << s.name;
  }
}

// Teacher-forced logits on a runtime's accelerator queue: the prompt's last row, then one decode
// step per remaining token.
std::vector<std::vector<float>> runtime_step_logits(const Model& m, Runtime& rt, KvStrategy& kv,
                                                    const std::vector<int32_t>& toks, int prompt) {
  std::vector<std::vector<float>> out;
  rt.accel()
      .submit("run", {}, {},
              [&] {
                Decoder dec(m, rt.accel_backend(), kv);
                const int32_t cap = int32_t(toks.size()) + 1, pl = prompt, last = prompt - 1, zero = 0;
                kv.begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&pl, 1));
                std::vector<float> lg(size_t(m.hp.n_vocab));
                std::vector<TokenRow> rows;
                for (int i = 0; i < prompt; ++i) rows.push_back({0, i});
                dec.forward(std::span<const int32_t>(toks.data(), size_t(prompt)), rows,
                            std::span<const int32_t>(&last, 1), lg.data());
                out.push_back(lg);
                for (size_t i = size_t(prompt); i < toks.size(); ++i) {
                  const TokenRow r{0, int32_t(i)};
                  dec.forward(std::span<const int32_t>(&toks[i], 1), std::span<const TokenRow>(&r, 1),
                              std::span<const int32_t>(&zero, 1), lg.data());
                  out.push_back(lg);
                }
              })
      .wait();
  return out;
}

// The offloading strategies on --device cuda (staging, ring and result buffers in GPU memory,
// transfers as cudaMemcpy on the copy queue's stream, CPU attention and logits on the host) give
// the logits of the same strategy on the emulated accelerator at every teacher-forced step.
// HybridGen's ring (6 tokens) is shorter than the prompt; selecting every offloaded token keeps
// it exact, so the speculative and pre paths are compared too.
TEST(GpuStrategies, MatchTheEmulatedAcceleratorAtEveryStep) {
  HG_REQUIRE_CUDA_DEVICE();
  Model m = load_model("synthetic:tiny-llama");
  std::vector<int32_t> toks = {1};
  for (int i = 1; i < 40; ++i) toks.push_back(int32_t(3 + (i * 7919) % (m.hp.n_vocab - 3)));
  const auto cases = test::offloading_cases("1000");  // HybridGen exact: every offloaded token selected
  for (const auto& [name, params] : cases) {
    const std::string what = test::case_label(name, params);
    std::vector<std::vector<float>> got[2];
    for (int device = 0; device < 2; ++device) {
      RuntimeConfig rc;
      rc.device = device ? "cuda" : "emulated";
      Runtime rt(rc);
      auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
      got[device] = runtime_step_logits(m, rt, *kv, toks, 23);
    }
    ASSERT_EQ(got[1].size(), got[0].size());
    for (size_t s = 0; s < got[0].size(); ++s) {
      double mx = 0;
      for (float v : got[0][s]) mx = std::max(mx, double(std::abs(v)));
      ASSERT_TRUE(test::all_close(got[1][s].data(), got[0][s].data(), got[0][s].size(), {1e-3 * mx, 1e-3}))
          << what << " step " << s;
    }
  }
}

}  // namespace
}  // namespace hg
