// Every CPU backend op against the `ref` oracle: odd sizes, seeded inputs in [-1, 1], tolerance
// table below. Case names carry their parameters. The kernels run at the active instruction-set
// level: the best this CPU has, or HG_CPU_ISA's (ctest runs these suites again at each lower level:
// tests/CMakeLists.txt); KernelLevels walks every level in one process.
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/gumbel.h"
#include "engine/core/cpu_features.h"
#include "engine/core/error.h"
#include "selectors/logit_topk.h"
#include "eviction_case.h"
#include "test_util.h"

namespace hg {
namespace {

// Tolerance table (atol, rtol) per op and weight type.
constexpr test::Tol kTolF32{1e-5, 1e-5};
constexpr test::Tol kTolMatmulF32{1e-4, 1e-4};   // K up to 1000: summation order differs
constexpr test::Tol kTolMatmulBf16{3e-2, 2e-2};  // activations rounded to BF16 before the GEMM
constexpr test::Tol kTolAttention{2e-5, 1e-4};
constexpr test::Tol kTolSwiglu{1e-6, 1e-5};

// Under HG_CPU_ISA=LEVEL on a CPU without that level, every test skips with this message (ctest
// reports the entry as skipped).
class CpuIsaEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("HG_CPU_ISA");
    CpuIsa isa;
    if (env && *env && parse_cpu_isa(env, &isa) && !cpu_supports(isa))
      GTEST_SKIP() << "this CPU lacks HG_CPU_ISA=" << env;
  }
};
[[maybe_unused]] ::testing::Environment* const g_isa_environment =
    ::testing::AddGlobalTestEnvironment(new CpuIsaEnvironment);

class Backends : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> ref = make_ref_backend();
};

struct MatmulCase {
  int64_t M, K, N;
  DType t;
};

class MatmulTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTest, CpuMatchesRef) {
  const auto [M, K, N, t] = GetParam();
  auto x = test::random_vec(size_t(M * K), 11);
  auto wf = test::random_vec(size_t(N * K), 12);
  auto bias = test::random_vec(size_t(N), 13);
  Weight w = convert_weight(DType::kF32, wf.data(), t, {N, K});
  std::vector<float> y(size_t(M * N)), yr(size_t(M * N));
  auto cpu = make_cpu_backend();
  auto ref = make_ref_backend();
  cpu->matmul(x.data(), M, w, bias.data(), y.data());
  // Up to 4 rows (decode) run the own GEMV: F32 activations, weights converted exactly, so the
  // F32 tolerance holds for F32 and F16 weights. BF16 weights round the activations to BF16: in
  // oneDNN (larger M), and in the GEMV's `vdpbf16ps` path where the CPU has it. The oracle then
  // sees the same rounded inputs; products of two BF16 values are exact in F32, so only the
  // summation order differs from it.
  const bool onednn_bf16 = t == DType::kBF16 && M > 4;
  const bool rounded_x = t == DType::kBF16 && (M > 4 || cpu::gemv_rounds_bf16_activations());
  if (rounded_x)
    for (auto& v : x) v = bf16_to_f32(f32_to_bf16(v));
  ref->matmul(x.data(), M, w, bias.data(), yr.data());
  EXPECT_TRUE(test::all_close(y.data(), yr.data(), y.size(), onednn_bf16 ? kTolMatmulBf16 : kTolMatmulF32));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Values(
                             MatmulCase{1, 17, 97, DType::kF32}, MatmulCase{17, 97, 33, DType::kF32},
                             MatmulCase{97, 1000, 17, DType::kF32}, MatmulCase{1, 64, 300, DType::kF32},
                             MatmulCase{1, 17, 97, DType::kBF16}, MatmulCase{17, 97, 33, DType::kBF16},
                             MatmulCase{97, 1000, 17, DType::kBF16},
                             // GEMV path (M ≤ 4): row-block and K tails, every weight type.
                             MatmulCase{2, 1000, 1030, DType::kF32}, MatmulCase{3, 33, 129, DType::kBF16},
                             MatmulCase{4, 128, 64, DType::kF32}, MatmulCase{1, 17, 97, DType::kF16},
                             MatmulCase{2, 64, 300, DType::kF16}, MatmulCase{3, 1000, 33, DType::kF16},
                             MatmulCase{4, 97, 1025, DType::kF16}, MatmulCase{1, 1000, 1030, DType::kF16},
                             // Fewer rows than the one-row GEMV's streams: parts left empty.
                             MatmulCase{1, 97, 3, DType::kBF16}, MatmulCase{1, 97, 6, DType::kF16},
                             // F16 prefill: weight blocks (64 MiB of F32) converted for oneDNN;
                             // 4096 × 4200 is two blocks.
                             MatmulCase{5, 97, 33, DType::kF16}, MatmulCase{5, 4096, 4200, DType::kF16}),
                         [](const auto& i) {
                           return "M" + std::to_string(i.param.M) + "_K" + std::to_string(i.param.K) + "_N" +
                                  std::to_string(i.param.N) + "_" + std::string(dtype_name(i.param.t));
                         });

TEST_F(Backends, NormsMatchRef) {
  for (int64_t n : {1, 17, 97, 1000}) {
    const int64_t M = 5;
    auto x = test::random_vec(size_t(M * n), 21);
    auto w = test::random_vec(size_t(n), 22);
    auto b = test::random_vec(size_t(n), 23);
    std::vector<float> y(x.size()), yr(x.size());
    cpu->rms_norm(x.data(), w.data(), M, n, 1e-5f, y.data());
    ref->rms_norm(x.data(), w.data(), M, n, 1e-5f, yr.data());
    EXPECT_TRUE(test::all_close(y.data(), yr.data(), y.size(), kTolF32)) << "rms_norm n=" << n;
    cpu->layer_norm(x.data(), w.data(), b.data(), M, n, 1e-5f, y.data());
    ref->layer_norm(x.data(), w.data(), b.data(), M, n, 1e-5f, yr.data());
    EXPECT_TRUE(test::all_close(y.data(), yr.data(), y.size(), {1e-4, 1e-4})) << "layer_norm n=" << n;
  }
}

TEST_F(Backends, RopeMatchesRefBothStyles) {
  HParams hp;
  hp.head_dim = 18;
  hp.rope_theta = 500000;
  for (RopeStyle st : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    hp.rope_style = st;
    const RopeTable t = make_rope_table(hp, {});
    const int64_t M = 7;
    const int H = 3, D = 18;
    auto x = test::random_vec(size_t(M * H * D), 31);
    auto xr = x;
    std::vector<int32_t> pos = {0, 1, 5, 17, 97, 1000, 30000};
    cpu->rope(x.data(), M, H, D, pos.data(), t);
    ref->rope(xr.data(), M, H, D, pos.data(), t);
    EXPECT_TRUE(test::all_close(x.data(), xr.data(), x.size(), {2e-5, 1e-5})) << "style " << int(st);
  }
}

// The CPU backend keeps each thread's cos/sin rows for positions below 8192 (RopeAngles): a table
// rewritten in place with other frequencies must not reuse them, and positions past the cached
// range or negative (StreamingLLM's rank shifts) are computed directly.
TEST_F(Backends, RopeAnglesFollowTheTableNotItsAddress) {
  HParams hp;
  hp.head_dim = 16;
  RopeTable t;
  for (double theta : {10000.0, 500000.0, 10000.0}) {
    hp.rope_theta = theta;
    t = make_rope_table(hp, {});  // same object, new frequencies
    const int64_t M = 7;
    const int H = 2, D = 16;
    std::vector<int32_t> pos = {0, 1, 97, 8191, 8192, 20000, -3};
    for (int call = 0; call < 2; ++call) {  // the second call reads the rows the first one kept
      auto x = test::random_vec(size_t(M * H * D), 33 + uint64_t(call));
      auto xr = x;
      cpu->rope(x.data(), M, H, D, pos.data(), t);
      ref->rope(xr.data(), M, H, D, pos.data(), t);
      EXPECT_TRUE(test::all_close(x.data(), xr.data(), x.size(), {2e-5, 1e-5})) << "theta " << theta;
    }
  }
}

TEST_F(Backends, Llama3RopeScalingFollowsTheFormula) {
  HParams hp;
  hp.head_dim = 64;
  hp.rope_theta = 500000;
  const RopeTable plain = make_rope_table(hp, {});
  hp.rope_scaling = {"llama3", 32.0, 1.0, 4.0, 8192};
  const RopeTable t = make_rope_table(hp, {});
  // Highest frequency (wavelength 2π < 8192/4) unchanged; lowest (wavelength > 8192) divided by 32.
  EXPECT_DOUBLE_EQ(t.inv_freq[0], plain.inv_freq[0]);
  EXPECT_NEAR(t.inv_freq[31], plain.inv_freq[31] / 32.0, 1e-15);
  for (size_t i = 0; i < t.inv_freq.size(); ++i) EXPECT_LE(t.inv_freq[i], plain.inv_freq[i] * (1 + 1e-12));
}

TEST_F(Backends, ActivationsMatchRef) {
  for (int64_t n : {1, 17, 97, 4099}) {
    auto g = test::random_vec(size_t(n), 41, -8, 8);
    auto u = test::random_vec(size_t(n), 42);
    std::vector<float> y(static_cast<size_t>(n)), yr(static_cast<size_t>(n));
    cpu->swiglu(g.data(), u.data(), n, y.data());
    ref->swiglu(g.data(), u.data(), n, yr.data());
    EXPECT_TRUE(test::all_close(y.data(), yr.data(), y.size(), kTolSwiglu)) << "swiglu n=" << n;
    auto a = g, ar = g;
    cpu->relu(a.data(), n);
    ref->relu(ar.data(), n);
    EXPECT_TRUE(test::all_close(a.data(), ar.data(), a.size(), {0, 0})) << "relu n=" << n;
    cpu->add(a.data(), u.data(), n);
    ref->add(ar.data(), u.data(), n);
    EXPECT_TRUE(test::all_close(a.data(), ar.data(), a.size(), kTolF32)) << "add n=" << n;
  }
}

TEST_F(Backends, ExpShiftSumMatchesLibm) {
  auto x = test::random_vec(1001, 45, -80, 0);
  auto y = x;
  const float s = cpu::exp_shift_sum(y.data(), int64_t(y.size()), -1.0f);
  double ref_sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = std::exp(double(x[i]) + 1.0);
    ref_sum += e;
    ASSERT_NEAR(y[i], e, 3e-7 * e + 1e-38) << "x=" << x[i];
  }
  EXPECT_NEAR(s, ref_sum, 1e-5 * ref_sum);
}

TEST_F(Backends, EmbedConvertsRows) {
  auto tab = test::random_vec(50 * 17, 51);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    Weight w = convert_weight(DType::kF32, tab.data(), t, {50, 17});
    std::vector<int32_t> ids = {0, 49, 7};
    std::vector<float> y(3 * 17), yr(3 * 17);
    cpu->embed(w, ids.data(), 3, y.data());
    ref->embed(w, ids.data(), 3, yr.data());
    EXPECT_TRUE(test::all_close(y.data(), yr.data(), y.size(), {0, 0}));
    ids[1] = 50;
    EXPECT_THROW(cpu->embed(w, ids.data(), 3, y.data()), InputError);
  }
}

struct AttnCase {
  int H, H_kv, D, n_rows, n_keys;
};
class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, CpuMatchesRef) {
  const auto [H, H_kv, D, n_rows, n_keys] = GetParam();
  const int64_t cap = n_keys + 3;  // head stride larger than the live keys
  auto q = test::random_vec(size_t(n_rows * H * D), 61);
  auto K = test::random_vec(size_t(H_kv * cap * D), 62, -3, 3);
  auto V = test::random_vec(size_t(H_kv * cap * D), 63);
  std::vector<AttnRow> rows;
  for (int r = 0; r < n_rows; ++r)  // causal-like: row r sees n_keys - r keys
    rows.push_back({K.data(), V.data(), cap * D, std::max(1, n_keys - r)});
  AttentionArgs a = attention_args(H, H_kv, D, 1.0f / std::sqrt(float(D)), q.data(), rows, nullptr);
  std::vector<float> out(q.size()), outr(q.size());
  a.out = out.data();
  make_cpu_backend()->attention(a);
  a.out = outr.data();
  make_ref_backend()->attention(a);
  EXPECT_TRUE(test::all_close(out.data(), outr.data(), out.size(), kTolAttention));
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnCase{1, 1, 16, 1, 1}, AttnCase{4, 2, 17, 3, 97},
                                           AttnCase{8, 2, 64, 2, 1000}, AttnCase{12, 2, 128, 1, 4099},
                                           AttnCase{6, 6, 10, 5, 33}, AttnCase{32, 8, 64, 1, 517},
                                           // Group sizes 5 and 7 (Qwen2.5-14B/7B shapes), 16 (beyond the
                                           // compiled group sizes: the generic path), D = 96 (run-time D).
                                           AttnCase{10, 2, 128, 2, 300}, AttnCase{28, 4, 128, 1, 129},
                                           AttnCase{16, 1, 64, 1, 200}, AttnCase{8, 2, 96, 1, 65},
                                           // One row, one KV head, long keys: the flash-decoding split path.
                                           AttnCase{4, 1, 64, 1, 5000}, AttnCase{2, 1, 17, 2, 3001},
                                           // G = 4, 2, 1 and 8, D = 128 over 1024 keys or more: four parts
                                           // read side by side and a remainder; the same with key limits
                                           // (two rows batched) and split (log-sum-exp merged).
                                           AttnCase{8, 2, 128, 1, 1037}, AttnCase{4, 2, 128, 2, 1200},
                                           AttnCase{4, 1, 128, 1, 5000}, AttnCase{4, 2, 128, 1, 1031},
                                           AttnCase{2, 2, 128, 2, 1100}, AttnCase{2, 1, 128, 1, 5000},
                                           AttnCase{4, 4, 128, 1, 1041}, AttnCase{2, 2, 128, 3, 1300},
                                           AttnCase{1, 1, 128, 1, 5003}, AttnCase{8, 1, 128, 1, 1100},
                                           AttnCase{16, 2, 128, 1, 2011}, AttnCase{8, 1, 128, 1, 5000},
                                           // G = 3 and 5-7 padded to 4 and 8 heads for the four parts.
                                           AttnCase{3, 1, 128, 1, 1100}, AttnCase{6, 2, 128, 2, 1050},
                                           AttnCase{14, 2, 128, 1, 1500}, AttnCase{5, 1, 128, 1, 5000},
                                           AttnCase{12, 2, 128, 1, 1030},
                                           // D = 8 (stories260K: two rows per vector), odd key counts.
                                           AttnCase{8, 4, 8, 3, 301}, AttnCase{3, 1, 8, 2, 17},
                                           AttnCase{8, 1, 8, 1, 5001}),
                         [](const auto& i) {
                           const auto& p = i.param;
                           return "H" + std::to_string(p.H) + "_Hkv" + std::to_string(p.H_kv) + "_D" +
                                  std::to_string(p.D) + "_rows" + std::to_string(p.n_rows) + "_keys" +
                                  std::to_string(p.n_keys);
                         });

// F16 and BF16 KV caches: the CPU kernel converts rows as it reads them; the oracle reads the
// same stored values, so the tolerance is the F32 one.
TEST(AttentionKvTypes, HalfPrecisionKvMatchesRef) {
  for (DType t : {DType::kF16, DType::kBF16})
    for (auto [H, Hkv, D, n] :
         {std::tuple{8, 2, 64, 1000}, std::tuple{8, 2, 64, 1003}, std::tuple{4, 4, 17, 97},
          std::tuple{32, 8, 128, 513}, std::tuple{8, 4, 8, 301}, std::tuple{8, 2, 128, 1037},
          std::tuple{4, 2, 128, 1100}, std::tuple{4, 4, 128, 1029}, std::tuple{16, 2, 128, 1050},
          std::tuple{12, 4, 128, 1040}, std::tuple{28, 4, 128, 1030}}) {
      const int64_t cap = n + 5;
      auto q = test::random_vec(size_t(H * D), 71);
      auto Kf = test::random_vec(size_t(Hkv * cap * D), 72, -3, 3);
      auto Vf = test::random_vec(size_t(Hkv * cap * D), 73);
      std::vector<uint16_t> K(Kf.size()), V(Vf.size());
      from_f32(t, Kf.data(), K.data(), K.size());
      from_f32(t, Vf.data(), V.data(), V.size());
      AttnRow row{K.data(), V.data(), cap * D, int32_t(n)};
      AttentionArgs a = attention_args(H, Hkv, D, 1.0f / std::sqrt(float(D)), q.data(), {&row, 1}, nullptr, t);
      std::vector<float> out(q.size()), outr(q.size());
      a.out = out.data();
      make_cpu_backend()->attention(a);
      a.out = outr.data();
      make_ref_backend()->attention(a);
      EXPECT_TRUE(test::all_close(out.data(), outr.data(), out.size(), kTolAttention))
          << dtype_name(t) << " H" << H << " Hkv" << Hkv << " D" << D << " n" << n;
    }
}

// The taps (H2O/Keyformer scores) through the fused one-pass kernel: logits and probabilities
// of every key, each tap alone and both together, against the oracle.
TEST(AttentionTaps, LogitsAndProbsMatchRef) {
  for (auto [H, Hkv, D, n] :
       {std::tuple{8, 2, 128, 300}, std::tuple{5, 1, 64, 77}, std::tuple{3, 3, 17, 16},
        std::tuple{8, 4, 8, 77}, std::tuple{8, 2, 128, 1100}, std::tuple{4, 2, 128, 1100},
        std::tuple{3, 3, 128, 1090}, std::tuple{8, 1, 128, 1070}, std::tuple{6, 2, 128, 1060},
        std::tuple{5, 1, 128, 1030}}) {
    auto q = test::random_vec(size_t(H * D), 81);
    auto K = test::random_vec(size_t(Hkv * n * D), 82, -3, 3);
    auto V = test::random_vec(size_t(Hkv * n * D), 83);
    AttnRow row{K.data(), V.data(), int64_t(n) * D, int32_t(n)};
    for (int mode = 0; mode < 3; ++mode) {  // 0: both taps, 1: logits only, 2: probs only
      std::vector<float> out(q.size()), outr(q.size()), lg(size_t(H * n)), lgr(lg.size()), pr(lg.size()), prr(lg.size());
      AttentionArgs a = attention_args(H, Hkv, D, 1.0f / std::sqrt(float(D)), q.data(), {&row, 1}, out.data());
      a.tap_ld = n;
      a.logits_out = mode != 2 ? lg.data() : nullptr;
      a.probs_out = mode != 1 ? pr.data() : nullptr;
      make_cpu_backend()->attention(a);
      a.out = outr.data();
      a.logits_out = mode != 2 ? lgr.data() : nullptr;
      a.probs_out = mode != 1 ? prr.data() : nullptr;
      make_ref_backend()->attention(a);
      const std::string what = fmt::format("H{} D{} n{} mode {}", H, D, n, mode);
      EXPECT_TRUE(test::all_close(out.data(), outr.data(), out.size(), kTolAttention)) << what;
      if (mode != 2) {
        EXPECT_TRUE(test::all_close(lg.data(), lgr.data(), lg.size(), kTolAttention)) << what;
      }
      if (mode != 1) {
        EXPECT_TRUE(test::all_close(pr.data(), prr.data(), pr.size(), kTolAttention)) << what;
      }
    }
  }
}

// Attention in parts (HybridGen's CPU logits, its merge): every compiled group size, D = 64/128
// (unrolled), 8 (two rows per vector) and 40 (run-time), key counts around the 16-key block, keys and values of each KV
// element type (the ref backend reads the same 16-bit rows).
TEST_F(Backends, GroupLogitsAndWeightedVMatchRef) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int G : {1, 3, 4, 8, 12})
      for (int D : {64, 128, 8, 40})
        for (int64_t n : {1, 2, 15, 16, 17, 1000}) {
          const std::string what = fmt::format("{} G {} D {} n {}", dtype_name(dt), G, D, n);
          auto q = test::random_vec(size_t(G * D), 91);
          auto Kf = test::random_vec(size_t(n * D), 92, -2, 2);
          std::vector<char> K(size_t(n * D) * dtype_size(dt));
          from_f32(dt, Kf.data(), K.data(), Kf.size());
          std::vector<float> lg(size_t(G * n), -7.0f), lgr(lg.size(), -7.0f);
          cpu->group_logits(q.data(), G, K.data(), n, D, 0.125f, lg.data(), dt);
          ref->group_logits(q.data(), G, K.data(), n, D, 0.125f, lgr.data(), dt);
          EXPECT_TRUE(test::all_close(lg.data(), lgr.data(), lg.size(), kTolAttention)) << what;
          // Every group at once (3 KV heads, rows n + 2 apart), against the per-group reference.
          if (n <= 17) {
            const int Hkv = 3;
            const int64_t ld = n + 2;
            auto qh = test::random_vec(size_t(Hkv * G * D), 93);
            auto Kh = test::random_vec(size_t(Hkv * ld * D), 94, -2, 2);
            std::vector<char> Kt(Kh.size() * dtype_size(dt));
            from_f32(dt, Kh.data(), Kt.data(), Kh.size());
            std::vector<float> hl(size_t(Hkv * G * n), -7.0f), hr(hl.size(), 7.0f);
            cpu->heads_logits(qh.data(), Hkv * G, Hkv, Kt.data(), ld, n, D, 0.125f, hl.data(), dt);
            for (int g = 0; g < Hkv; ++g)
              ref->group_logits(qh.data() + g * G * D, G, Kt.data() + g * ld * D * int64_t(dtype_size(dt)), n, D,
                                0.125f, hr.data() + g * G * n, dt);
            EXPECT_TRUE(test::all_close(hl.data(), hr.data(), hl.size(), kTolAttention)) << what << " heads_logits";
          }
          cpu->softmax_rows(lg.data(), G, n);
          std::vector<float> o(size_t(G * D)), orf(o.size());
          cpu->group_weighted_v(lg.data(), G, K.data(), n, D, o.data(), dt);
          ref->group_weighted_v(lg.data(), G, K.data(), n, D, orf.data(), dt);
          EXPECT_TRUE(test::all_close(o.data(), orf.data(), o.size(), kTolAttention)) << what;
          // The conversion strategies use to hand 16-bit keys to F32 matmuls: exact.
          std::vector<float> back(Kf.size(), -7.0f), back_ref(Kf.size(), 7.0f);
          cpu->convert_to_f32(K.data(), dt, int64_t(Kf.size()), back.data());
          ref->convert_to_f32(K.data(), dt, int64_t(Kf.size()), back_ref.data());
          EXPECT_EQ(0, std::memcmp(back.data(), back_ref.data(), back.size() * 4)) << what;
        }
}

// HybridGen's merge of CPU logits and resident keys on the host backends, per KV element type,
// against one softmax over both sets computed from the same rows in double precision.
TEST_F(Backends, MergedAttentionMatchesOneSoftmaxForEachKvType) {
  const int H = 8, H_kv = 2, D = 64, G = H / H_kv;
  const int64_t na = 37, nb = 21, ld_b = 24;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const auto q = test::random_vec(size_t(H * D), 95);
    const auto la = test::random_vec(size_t(H * na), 96, -3, 3);
    const size_t es = dtype_size(dt);
    auto rows = [&](size_t n, uint64_t seed) {
      const auto f = test::random_vec(n, seed);
      std::vector<char> r(n * es);
      from_f32(dt, f.data(), r.data(), n);
      return r;
    };
    const auto Va = rows(size_t(H_kv * na * D), 97), Kb = rows(size_t(H_kv * ld_b * D), 98),
               Vb = rows(size_t(H_kv * ld_b * D), 99);
    auto at = [&](const std::vector<char>& r, int64_t i) {
      float f;
      to_f32(dt, r.data() + i * int64_t(es), &f, 1);
      return double(f);
    };
    for (Backend* be : {cpu.get(), ref.get()}) {
      std::vector<float> out(size_t(H * D), 7.0f);
      Backend::MergedAttention m;
      m.H = H, m.H_kv = H_kv, m.D = D, m.scale = 0.125f, m.q = q.data(), m.la = la.data(), m.Va = Va.data();
      m.na = na, m.Kb = Kb.data(), m.Vb = Vb.data(), m.ld_b = ld_b, m.nb = nb, m.kv_dtype = dt, m.out = out.data();
      be->merged_attention(m);
      double worst = 0;
      for (int h = 0; h < H; ++h) {
        const int g = h / G;
        std::vector<double> p;
        for (int64_t t = 0; t < na; ++t) p.push_back(la[size_t(h * na + t)]);
        for (int64_t t = 0; t < nb; ++t) {
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += double(q[size_t(h * D + d)]) * at(Kb, (g * ld_b + t) * D + d);
          p.push_back(acc * 0.125);
        }
        const double mx = *std::max_element(p.begin(), p.end());
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t t = 0; t < na; ++t) o += p[size_t(t)] / sum * at(Va, (g * na + t) * D + d);
          for (int64_t t = 0; t < nb; ++t) o += p[size_t(na + t)] / sum * at(Vb, (g * ld_b + t) * D + d);
          worst = std::max(worst, std::abs(o - double(out[size_t(h * D + d)])));
        }
      }
      EXPECT_LT(worst, 1e-5) << dtype_name(dt) << " " << be->name();
    }
  }
}

// HybridGen's post score: the max over G of the very logits group_logits gives, bit for bit, on
// the CPU backend (the same blocks), and on the ref backend (the default: group_logits, then max);
// so logit_top_k over the scores (G = 1) picks what it picks over the [G, n] logits. A query head
// of NaN is skipped, a key of NaN scores -inf.
TEST_F(Backends, GroupLogitMaxIsTheMaxOfGroupLogits) {
  for (int G : {1, 3, 4, 8})
    for (int D : {64, 128, 8, 40})
      for (int64_t n : {1, 15, 16, 17, 1000, 1003}) {
        const std::string what = std::to_string(G) + " " + std::to_string(D) + " " + std::to_string(n);
        auto q = test::random_vec(size_t(G * D), 93);
        auto K = test::random_vec(size_t(n * D), 94, -2, 2);
        if (G > 1) q[size_t(D) + 3] = NAN;        // query head 1: all its logits NaN
        if (n > 16) K[size_t(16 * D) + 5] = NAN;  // key 16: NaN for every head
        for (Backend* be : {cpu.get(), ref.get()})
          for (DType dt : {DType::kF32, DType::kF16}) {
            std::vector<char> Kt(K.size() * dtype_size(dt));
            from_f32(dt, K.data(), Kt.data(), K.size());
            std::vector<float> lg(size_t(G * n)), score(size_t(n) + 1, 7.0f);
            be->group_logits(q.data(), G, Kt.data(), n, D, 0.125f, lg.data(), dt);
            be->group_logit_max(q.data(), G, Kt.data(), n, D, 0.125f, score.data(), dt);
            EXPECT_EQ(score[size_t(n)], 7.0f) << what << ": wrote past n";
            int64_t mismatches = 0;
            for (int64_t t = 0; t < n; ++t) {
              float m = -INFINITY;
              for (int h = 0; h < G; ++h) m = m < lg[size_t(h * n + t)] ? lg[size_t(h * n + t)] : m;
              mismatches += std::memcmp(&m, &score[size_t(t)], 4) != 0;
            }
            EXPECT_EQ(mismatches, 0) << what << " " << be->name() << " " << dtype_name(dt);
            if (n > 16) {
              EXPECT_EQ(score[16], -INFINITY) << what << " " << be->name() << " " << dtype_name(dt);
            }
            for (int32_t k : {1, 7, 64}) {
              std::vector<int32_t> by_logits, by_score;
              logit_top_k(*cpu, lg.data(), G, n, int32_t(n), k, by_logits);
              logit_top_k(*cpu, score.data(), 1, n, int32_t(n), k, by_score);
              EXPECT_EQ(by_logits, by_score) << what << " K " << k << " " << be->name() << " " << dtype_name(dt);
            }
          }
      }
}

// cpu::max_value against std::max_element: lengths around the 16- and 64-float steps, the largest
// value at each end and in the middle, NaN ignored, -inf when nothing else is there.
TEST(MaxValue, MatchesMaxElementAndIgnoresNaN) {
  for (int64_t n : {1, 15, 16, 17, 63, 64, 65, 1000, 4099}) {
    for (int64_t at : {int64_t(0), n / 2, n - 1}) {
      auto x = test::random_vec(size_t(n), 78 + uint64_t(at));
      x[size_t(at)] = 5.0f;
      EXPECT_EQ(cpu::max_value(x.data(), n), *std::max_element(x.begin(), x.end())) << n << " " << at;
      x[size_t(n / 3)] = NAN;
      if (size_t(n / 3) != size_t(at)) {
        EXPECT_EQ(cpu::max_value(x.data(), n), 5.0f) << n << " " << at;
      }
    }
  }
  const float nan[3] = {NAN, NAN, NAN};
  EXPECT_EQ(cpu::max_value(nan, 3), -INFINITY);
  EXPECT_EQ(cpu::max_value(nan, 0), -INFINITY);
}

// cpu::sum and cpu::sum_one_stream (the bandwidth references' reads) against a double-precision
// sum: lengths below, at and around the eight-stream path's threshold and with tails of every size.
TEST(Sum, MatchesDoubleSum) {
  for (int64_t n : {0, 1, 15, 16, 17, 63, 64, 65, 1000, 8191, 8192, 8193, 8192 + 15, 100003}) {
    const auto x = test::random_vec(size_t(n), 77);
    double want = 0;
    for (float v : x) want += v;
    EXPECT_NEAR(cpu::sum(x.data(), n), want, 1e-4 * std::max(1.0, std::sqrt(double(n)))) << n;
    EXPECT_NEAR(cpu::sum_one_stream(x.data(), n), want, 1e-4 * std::max(1.0, std::sqrt(double(n)))) << n;
  }
}

// cpu::gather_rows against a row-by-row copy: row sizes that are and are not whole cache lines,
// fewer rows than the prefetch distance, repeated and unsorted indices, a source stride wider than
// the row, and n = 0 (nothing written).
TEST(GatherRows, MatchesRowByRowCopy) {
  std::mt19937 g(5);
  for (int64_t row_bytes : {4, 60, 512, 4096})
    for (int64_t n : {0, 1, 3, 100, 1000}) {
      const int64_t stride = row_bytes + 12, rows = 2000;
      std::vector<char> src(size_t(rows * stride));
      for (auto& c : src) c = char(g());
      std::vector<int32_t> idx(static_cast<size_t>(n));
      for (auto& i : idx) i = int32_t(g() % uint32_t(rows));
      if (n > 2) idx[1] = idx[0];
      std::vector<char> got(size_t(n * row_bytes + 8), 'z'), want(got.size(), 'z');
      cpu::gather_rows(got.data(), src.data(), row_bytes, stride, idx.data(), n);
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(src.begin() + idx[size_t(i)] * stride, row_bytes, want.begin() + i * row_bytes);
      EXPECT_EQ(got, want) << "row_bytes " << row_bytes << " n " << n;
    }
}

// copy_rows (rows from many places in one call): the CPU backend's prefetching copy against the
// reference's row-by-row memcpy, rows from two separate buffers into scattered destinations, row
// sizes below and above a cache line, fewer rows than the prefetch distance, and n = 0.
TEST(CopyRows, CpuBackendMatchesRef) {
  auto cpu = make_cpu_backend(), ref = make_ref_backend();
  std::mt19937 g(6);
  for (int64_t row_bytes : {4, 60, 512})
    for (int64_t n : {0, 1, 5, 300}) {
      std::vector<char> a(size_t(400 * row_bytes)), b(size_t(400 * row_bytes));
      for (auto& c : a) c = char(g());
      for (auto& c : b) c = char(g());
      std::vector<char> got(size_t(2 * n * row_bytes + 8), 'z'), want(got.size(), 'z');
      std::vector<const void*> src;
      std::vector<void*> dg, dw;
      for (int64_t i = 0; i < n; ++i) {
        const auto& from = i % 2 ? a : b;
        src.push_back(from.data() + (g() % 400) * row_bytes);
        const int64_t at = (n - 1 - i) * 2 * row_bytes;  // reversed, with gaps
        dg.push_back(got.data() + at), dw.push_back(want.data() + at);
      }
      cpu->copy_rows(dg.data(), src.data(), row_bytes, n);
      ref->copy_rows(dw.data(), src.data(), row_bytes, n);
      EXPECT_EQ(got, want) << "row_bytes " << row_bytes << " n " << n;
    }
}

// The backend calls strategies' policies use (max, exp-shift-sum, gather of rows, Keyformer's noise,
// the logit top-K): the CPU backend's SIMD kernels against the ref backend's scalar loops.
TEST(PolicyOps, CpuBackendMatchesRef) {
  auto cpu = make_cpu_backend();
  auto ref = make_ref_backend();
  for (int64_t n : {0, 1, 17, 64, 1000, 4099}) {
    auto x = test::random_vec(size_t(n), 90 + uint64_t(n), -30, 5);
    if (n > 3) x[2] = NAN;
    EXPECT_EQ(cpu->max_value(x.data(), n), ref->max_value(x.data(), n)) << n;
    if (n > 3) x[2] = 0.5f;
    auto y = x, yr = x;
    const float s = cpu->exp_shift_sum(y.data(), n, 1.5f), sr = ref->exp_shift_sum(yr.data(), n, 1.5f);
    EXPECT_NEAR(s, sr, 1e-5 * std::max(1.0f, sr)) << n;
    EXPECT_TRUE(test::all_close(y.data(), yr.data(), y.size(), {1e-6, 3e-7})) << n;
    std::vector<int32_t> idx;
    for (int64_t i = 0; i < n; ++i) idx.push_back(int32_t((i * 7919) % std::max<int64_t>(n, 1)));
    std::vector<float> g(size_t(n) * 3, -1), gr(g.size(), -1);
    const std::vector<float> rows = test::random_vec(size_t(std::max<int64_t>(n, 1)) * 5, 91);
    cpu->gather_rows(g.data(), rows.data(), 12, 20, idx.data(), n);
    ref->gather_rows(gr.data(), rows.data(), 12, 20, idx.data(), n);
    EXPECT_EQ(g, gr) << n;
    // Keyformer's noise, bit for bit, and the logit top-K of two heads (x and its reverse).
    std::vector<double> noise(static_cast<size_t>(n)), noise_ref(static_cast<size_t>(n));
    cpu->gumbel_noise(0x1234567ull + uint64_t(n), idx.data(), n, noise.data());
    ref->gumbel_noise(0x1234567ull + uint64_t(n), idx.data(), n, noise_ref.data());
    if (n > 0) {  // memcmp's pointers must not be null, which an empty vector's data() may be
      EXPECT_EQ(std::memcmp(noise.data(), noise_ref.data(), noise.size() * sizeof(double)), 0) << n;
    }
    std::vector<float> two(x);
    two.insert(two.end(), x.rbegin(), x.rend());
    for (int32_t K : {1, int32_t(n / 3), int32_t(n)}) {
      std::vector<int32_t> sel(size_t(n) + 1, -1), sel_ref(sel);
      EXPECT_EQ(cpu->logit_top_k(two.data(), 2, n, int32_t(n), K, sel.data()),
                ref->logit_top_k(two.data(), 2, n, int32_t(n), K, sel_ref.data()))
          << n << " K " << K;
      EXPECT_EQ(sel, sel_ref) << n << " K " << K;
    }
  }
}

// The eviction score ops (H2O's and Keyformer's policy on the accelerator): the sum rule against a
// scalar loop in the same order (bit for bit), the Gumbel softmax against a float64 softmax of the
// same noise, both on the CPU and the ref backend; the picks against a full sort of the candidates.
TEST(PolicyOps, EvictionScoresAndPicksMatchScalar) {
  auto cpu = make_cpu_backend();
  auto ref = make_ref_backend();
  const test::EvictionCase c = test::eviction_case({1, 37, 300}, 17);
  const int G = c.H / c.H_kv;
  for (auto rule : {PolicyOps::ScoreRule::kSum, PolicyOps::ScoreRule::kGumbelSoftmax}) {
    auto got = c.slots, got_ref = c.slots, want = c.slots;
    for (auto [be, slots] : {std::pair{cpu.get(), &got}, std::pair{ref.get(), &got_ref}}) {
      const auto rows = test::score_rows(c, slots->data());
      PolicyOps::ScoreRows a;
      a.rule = rule, a.H = c.H, a.H_kv = c.H_kv, a.taps = c.taps.data(), a.tap_ld = c.tap_ld, a.seed = 5, a.layer = 3;
      a.rows = rows.data(), a.n_rows = int64_t(rows.size());
      be->accumulate_scores(a);
    }
    const auto rows = test::score_rows(c, want.data());
    for (size_t r = 0; r < rows.size(); ++r)
      for (int g = 0; g < c.H_kv; ++g)
        for (int h = 0; h < G; ++h) {
          const float* tap = c.taps.data() + (int64_t(r) * c.H + g * G + h) * c.tap_ld;
          auto* sl = rows[r].slots + g * c.slot_ld;
          std::vector<double> z(size_t(rows[r].n));
          double mx = -INFINITY, sum = 0;
          for (int32_t t = 0; t < rows[r].n; ++t) {
            z[size_t(t)] = rule == PolicyOps::ScoreRule::kSum
                               ? double(tap[t])
                               : (double(tap[t]) + gumbel::draw(gumbel::stream(5, 3, 0, rows[r].pos, g * G + h), sl[t].pos)) /
                                     rows[r].tau;
            mx = std::max(mx, z[size_t(t)]);
          }
          if (rule == PolicyOps::ScoreRule::kGumbelSoftmax)
            for (auto& v : z) sum += (v = std::exp(v - mx));
          for (int32_t t = 0; t < rows[r].n; ++t)
            sl[t].score += rule == PolicyOps::ScoreRule::kSum ? z[size_t(t)] : z[size_t(t)] / sum;
        }
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].pos, want[i].pos);
      if (rule == PolicyOps::ScoreRule::kSum) {
        EXPECT_EQ(got[i].score, want[i].score) << i;
        EXPECT_EQ(got_ref[i].score, want[i].score) << i;
      } else {  // F32 softmax: relative error ~1e-6 of a probability
        EXPECT_NEAR(got[i].score, want[i].score, 2e-6) << i;
        EXPECT_NEAR(got_ref[i].score, want[i].score, 2e-6) << i;
      }
    }
  }
  // Picks: lowest (score, position) outside the `recent` newest positions.
  for (auto [recent, count] : {std::pair{0, 1}, std::pair{5, 1}, std::pair{0, 30}, std::pair{7, 200}, std::pair{36, 1}}) {
    const auto picks = test::eviction_picks(c, c.slots.data(), recent, count);
    int64_t total = 0;
    for (auto& p : picks) total = std::max(total, p.at + p.count);
    std::vector<int32_t> out(size_t(total), -1), out_ref(out);
    cpu->pick_evictions(picks.data(), int64_t(picks.size()), out.data());
    ref->pick_evictions(picks.data(), int64_t(picks.size()), out_ref.data());
    EXPECT_EQ(out, out_ref);
    for (auto& p : picks) {
      std::vector<int32_t> by_pos(size_t(p.n));
      std::iota(by_pos.begin(), by_pos.end(), 0);
      std::sort(by_pos.begin(), by_pos.end(), [&](int32_t a, int32_t b) { return p.slots[a].pos > p.slots[b].pos; });
      std::vector<int32_t> cand(by_pos.begin() + std::min(p.recent, p.n), by_pos.end());
      std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) {
        return p.slots[a].score < p.slots[b].score || (p.slots[a].score == p.slots[b].score && p.slots[a].pos < p.slots[b].pos);
      });
      ASSERT_GE(int32_t(cand.size()), p.count);
      EXPECT_EQ(std::vector<int32_t>(out.begin() + p.at, out.begin() + p.at + p.count),
                std::vector<int32_t>(cand.begin(), cand.begin() + p.count))
          << "recent " << recent << " count " << count << " n " << p.n;
    }
  }
  // SnapKV's pooling: a zero-padded mean and a max over 3 positions.
  std::vector<PolicyOps::ScoreSlot> pool(5);
  for (int i = 0; i < 5; ++i) pool[size_t(i)].score = double(i * i);  // 0 1 4 9 16
  PolicyOps::ScorePool item{pool.data(), 5};
  auto mean = pool;
  PolicyOps::ScorePool mean_item{mean.data(), 5};
  cpu->pool_scores(&mean_item, 1, 3, false);
  EXPECT_EQ(mean[0].score, 1.0 / 3);
  EXPECT_EQ(mean[2].score, 14.0 / 3);
  EXPECT_EQ(mean[4].score, 25.0 / 3);
  cpu->pool_scores(&item, 1, 3, true);
  EXPECT_EQ(pool[0].score, 1.0);
  EXPECT_EQ(pool[4].score, 16.0);
  // put_rows: records scattered from a host array.
  std::vector<PolicyOps::ScoreSlot> dst(10), src = {{1.5, 7, 0}, {2.5, 9, 0}};
  std::vector<void*> at = {&dst[8], &dst[3]};
  cpu->put_rows(at.data(), src.data(), int64_t(sizeof(PolicyOps::ScoreSlot)), 2);
  EXPECT_EQ(dst[8].pos, 7);
  EXPECT_EQ(dst[3].score, 2.5);
}

// cpu::sum_rows (the gathers' random-row reference pass) against a double-precision sum of the same
// rows: row lengths below, at and above one 16-float vector, a stride wider than the row (floats
// between rows must not be counted), repeated indices and n = 0.
TEST(SumRows, MatchesScalarSum) {
  std::mt19937 g(6);
  for (int64_t row : {1, 15, 16, 33, 128})
    for (int64_t n : {0, 1, 7, 500}) {
      const int64_t stride = row + 5, rows = 900;
      const auto src = test::random_vec(size_t(rows * stride), 78);
      std::vector<int32_t> idx(static_cast<size_t>(n));
      for (auto& i : idx) i = int32_t(g() % uint32_t(rows));
      if (n > 2) idx[2] = idx[0];
      double want = 0;
      for (int32_t i : idx)
        for (int64_t j = 0; j < row; ++j) want += src[size_t(i * stride + j)];
      EXPECT_NEAR(cpu::sum_rows(src.data(), row, stride, idx.data(), n), want,
                  1e-4 * std::max(1.0, std::sqrt(double(n * row))))
          << "row " << row << " n " << n;
    }
}

}  // namespace
}  // namespace hg

namespace hg {
namespace {

// Restores the active level when it goes out of scope.
struct ScopedCpuIsa {
  CpuIsa prev;
  explicit ScopedCpuIsa(CpuIsa isa) : prev(set_active_cpu_isa(isa)) {}
  ~ScopedCpuIsa() { set_active_cpu_isa(prev); }
};

TEST(CpuFeatures, LevelsAreOrderedAndTheActiveOneIsSupported) {
  const auto levels = supported_cpu_isas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), CpuIsa::kPortable);
  EXPECT_EQ(levels.back(), best_cpu_isa());
  for (size_t i = 1; i < levels.size(); ++i) EXPECT_LT(int(levels[i - 1]), int(levels[i]));
  EXPECT_TRUE(cpu_supports(active_cpu_isa()));
  for (CpuIsa i : {CpuIsa::kPortable, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    CpuIsa back;
    ASSERT_TRUE(parse_cpu_isa(cpu_isa_name(i), &back));
    EXPECT_EQ(back, i);
  }
  CpuIsa unused;
  EXPECT_FALSE(parse_cpu_isa("avx2", &unused));
  if (!cpu_supports(CpuIsa::kAvx512Bf16)) {
    EXPECT_THROW(set_active_cpu_isa(CpuIsa::kAvx512Bf16), InputError);
  }
  EXPECT_GT(last_level_cache_bytes(), 0);
}

// Each level this CPU has, with each vendor's tuning, against the oracle, in one process: the
// decode GEMV in every weight type (with the BF16 rounding of x where that level's GEMV does it)
// and the fused attention in every KV type (G = 4, D = 64: the shape whose logits differ by
// vendor), and the levels against each other where their arithmetic is the same.
TEST(KernelLevels, EveryLevelMatchesRef) {
  const int64_t K = 1000, N = 97;
  auto x = test::random_vec(size_t(2 * K), 91);
  auto wf = test::random_vec(size_t(N * K), 92);
  const int H = 8, Hkv = 2, D = 64, n = 1003;  // G = 4
  auto q = test::random_vec(size_t(H * D), 93);
  auto Kf = test::random_vec(size_t(Hkv * n * D), 94, -3, 3);
  auto Vf = test::random_vec(size_t(Hkv * n * D), 95);
  auto ref = make_ref_backend();
  std::vector<std::pair<CpuIsa, std::vector<float>>> f16_gemv;  // per level, for the cross-check
  const CpuTuning tuning = cpu_tuning();
  for (CpuIsa isa : supported_cpu_isas())
  for (CpuTuning vendor : {CpuTuning::kIntel, CpuTuning::kAmd}) {
    ScopedCpuIsa scoped(isa);
    set_cpu_tuning(vendor);
    SCOPED_TRACE(std::string(cpu_isa_name(isa)) + ", " + std::string(cpu_tuning_name(vendor)) + " tuning");
    auto cpu = make_cpu_backend();
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
      for (int M : {1, 2}) {  // one x row and two take different row blocks per pass
        Weight w = convert_weight(DType::kF32, wf.data(), t, {N, K});
        std::vector<float> y(size_t(M * N)), yr(y.size());
        cpu->matmul(x.data(), M, w, nullptr, y.data());
        auto xr = x;
        if (t == DType::kBF16 && cpu::gemv_rounds_bf16_activations())
          for (auto& v : xr) v = bf16_to_f32(f32_to_bf16(v));
        ref->matmul(xr.data(), M, w, nullptr, yr.data());
        EXPECT_TRUE(test::all_close(y.data(), yr.data(), y.size(), kTolMatmulF32))
            << dtype_name(t) << ", M = " << M;
        if (t == DType::kF16 && M == 2) f16_gemv.emplace_back(isa, y);
      }
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      std::vector<uint16_t> K16(Kf.size()), V16(Vf.size());
      const void* Kp = Kf.data();
      const void* Vp = Vf.data();
      if (t != DType::kF32) {
        from_f32(t, Kf.data(), K16.data(), K16.size());
        from_f32(t, Vf.data(), V16.data(), V16.size());
        Kp = K16.data(), Vp = V16.data();
      }
      AttnRow row{Kp, Vp, int64_t(n) * D, n};
      AttentionArgs a = attention_args(H, Hkv, D, 0.125f, q.data(), {&row, 1}, nullptr, t);
      std::vector<float> out(q.size()), outr(q.size());
      a.out = out.data();
      cpu->attention(a);
      a.out = outr.data();
      ref->attention(a);
      EXPECT_TRUE(test::all_close(out.data(), outr.data(), out.size(), kTolAttention)) << dtype_name(t);
    }
  }
  set_cpu_tuning(tuning);
  // F16 weights are converted exactly at every level: the levels differ only in summation order.
  for (size_t i = 1; i < f16_gemv.size(); ++i)
    EXPECT_TRUE(test::all_close(f16_gemv[i].second.data(), f16_gemv[0].second.data(), f16_gemv[0].second.size(),
                                kTolMatmulF32))
        << cpu_isa_name(f16_gemv[i].first) << " vs " << cpu_isa_name(f16_gemv[0].first);
}

}  // namespace
}  // namespace hg
