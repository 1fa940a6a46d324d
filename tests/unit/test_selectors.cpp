// Token selectors against their slow references.
#include <cmath>
#include <limits>

#include "engine/backend/backend.h"
#include "selectors/logit_topk.h"
#include "selectors/sinks_recent.h"
#include "tests/unit/test_util.h"

namespace hg {
namespace {

// The selection's CPU kernel (at the level under test) and its reference.
struct TopKBackends {
  std::unique_ptr<Backend> cpu = make_cpu_backend(), reference = make_ref_backend();
};
TopKBackends& backends() {
  static TopKBackends b;
  return b;
}

// Logits [G][ld] for n positions. `levels` > 0 rounds them to that many distinct values, so that
// many scores tie; `specials` writes ±0, ±inf and NaN into some of them.
std::vector<float> logits_for(int G, int64_t ld, int32_t n, uint64_t seed, int levels, bool specials) {
  std::vector<float> l = test::random_vec(size_t(G) * size_t(ld), seed, -8.0f, 8.0f);
  if (levels > 0)
    for (auto& x : l) x = std::round(x * float(levels) / 16.0f);
  if (specials) {
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN()};
    std::mt19937_64 r(seed + 1);
    for (int i = 0; i < n / 8 + 1; ++i) l[size_t(r() % l.size())] = sp[r() % 5];
  }
  return l;
}

TEST(LogitTopK, EqualsTheNthElementReferenceWithTiesAndSpecialValues) {
  struct Case {
    int G;
    int32_t n, K;
    int levels;
    bool specials;
  };
  const Case cases[] = {
      {4, 15363, 128, 0, false},   // HybridGen post, the 1B model at 16K
      {4, 15363, 4096, 0, false},  // k_max
      {1, 1000, 999, 0, false},   {8, 2048, 1, 0, false},   {4, 5000, 2500, 0, false},
      {4, 20000, 300, 3, false},  // few distinct scores: the K-th score is shared by thousands
      {4, 20000, 7000, 2, false}, {2, 4096, 64, 40, false}, {4, 3000, 100, 0, true},
      {4, 3000, 2900, 6, true},   {7, 333, 17, 0, true},    {1, 64, 64, 0, false},
      {3, 10, 0, 0, false},       {3, 10, 25, 0, false},
  };
  uint64_t seed = 11;
  for (const Case& c : cases) {
    const int64_t ld = c.n + 13;  // rows further apart than n, as in a larger buffer
    const auto l = logits_for(c.G, ld, c.n, seed++, c.levels, c.specials);
    std::vector<int32_t> fast, ref;
    logit_top_k(*backends().cpu, l.data(), c.G, ld, c.n, c.K, fast);
    logit_top_k(*backends().reference, l.data(), c.G, ld, c.n, c.K, ref);
    EXPECT_EQ(fast.size(), size_t(std::clamp(c.K, 0, c.n))) << "G=" << c.G << " n=" << c.n << " K=" << c.K;
    EXPECT_EQ(fast, ref) << "G=" << c.G << " n=" << c.n << " K=" << c.K << " levels=" << c.levels;
  }
}

TEST(LogitTopK, ASampleThatMissesTheKthScoreStillSelectsExactly) {
  // High scores exactly at the strided sample's positions (t = i·n/1024) and low ones elsewhere:
  // the bound taken from the sample lets only those 1024 pass, fewer than K, so every position
  // must become a candidate.
  const int32_t n = 8192, K = 1500;
  std::vector<float> l = test::random_vec(size_t(n), 21, -1.0f, 0.0f);
  for (int32_t i = 0; i < 1024; ++i) l[size_t(int64_t(i) * n / 1024)] = 1.0f + float(i % 5);
  std::vector<int32_t> fast, ref;
  logit_top_k(*backends().cpu, l.data(), 1, n, n, K, fast);
  logit_top_k(*backends().reference, l.data(), 1, n, n, K, ref);
  EXPECT_EQ(fast.size(), size_t(K));
  EXPECT_EQ(fast, ref);
}

TEST(LogitTopK, ASampleBelowTheKthScoreStillSelectsExactly) {
  // Low scores exactly at the strided sample's positions and high ones elsewhere: the sample puts
  // both bounds below every unsampled score, so more than K positions lie above the upper bound
  // and none of them may be taken as certain.
  const int32_t n = 8192, K = 300;
  std::vector<float> l = test::random_vec(size_t(n), 22, 0.0f, 1.0f);
  for (int32_t i = 0; i < 1024; ++i) l[size_t(int64_t(i) * n / 1024)] = -1.0f - float(i % 7);
  std::vector<int32_t> fast, ref;
  logit_top_k(*backends().cpu, l.data(), 1, n, n, K, fast);
  logit_top_k(*backends().reference, l.data(), 1, n, n, K, ref);
  EXPECT_EQ(fast.size(), size_t(K));
  EXPECT_EQ(fast, ref);
}

TEST(LogitTopK, TiesGoToTheLowerPositionAndNaNIsIgnored) {
  // Scores: position 0..5 = {1, 3, 3, NaN→-inf, 3, 2}; K = 2 takes positions 1 and 2 (not 4).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float l[2][6] = {{1, 3, -1, nan, 3, 2}, {0, 0, 3, nan, 1, -5}};
  for (Backend* be : {backends().cpu.get(), backends().reference.get()}) {
    std::vector<int32_t> out;
    logit_top_k(*be, &l[0][0], 2, 6, 6, 2, out);
    EXPECT_EQ(out, (std::vector<int32_t>{1, 2})) << be->name();
    logit_top_k(*be, &l[0][0], 2, 6, 6, 4, out);
    EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 4, 5})) << be->name();
    logit_top_k(*be, &l[0][0], 2, 6, 6, 5, out);  // then 1.0 at position 0, before the all-NaN position
    EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 4, 5})) << be->name();
  }
}

TEST(SinksAndRecent, KeepsTheFirstSinksAndTheNewestRest) {
  auto check = [](int32_t n, int32_t k, int32_t sinks, int32_t want_sinks, int32_t want_recent) {
    const SinksAndRecent r = sinks_and_recent(n, k, sinks);
    EXPECT_EQ(r.sinks, want_sinks) << n << " " << k << " " << sinks;
    EXPECT_EQ(r.recent, want_recent) << n << " " << k << " " << sinks;
    EXPECT_EQ(r.sinks + (n - r.recent), std::clamp(k, 0, n));
  };
  check(100, 10, 4, 4, 94);   // 4 sinks + the newest 6
  check(100, 3, 4, 3, 100);   // fewer than the sinks: the first 3 only
  check(10, 20, 4, 4, 4);     // k beyond n keeps everything
  check(10, 0, 4, 0, 10);     // nothing
  check(10, 10, 0, 0, 0);     // no sinks: the newest 10
}

}  // namespace
}  // namespace hg
