// HybridGen's feedback scheduler (Algorithm 1) on scripted stage times.
#include "baselines/hybridgen/scheduler.h"
#include "test_util.h"

namespace hg {
namespace {

TEST(FeedbackScheduler, FullSchedulerRaisesLowersSwitchesAndReturns) {
  SchedulerConfig c;  // adaptive K, adaptive mode
  c.k_min = 128;
  c.k_max = 1024;
  c.k_growth = 2.0;
  FeedbackScheduler s(c);
  EXPECT_EQ(s.k(), 128);
  EXPECT_FALSE(s.pre());
  s.update(1, 1, 5, 10000);  // slack: 2 <= 5 → K up
  EXPECT_EQ(s.k(), 256);
  s.update(1, 1, 5, 10000);
  s.update(1, 1, 5, 10000);
  EXPECT_EQ(s.k(), 1024);
  s.update(1, 1, 5, 10000);  // capped at k_max
  EXPECT_EQ(s.k(), 1024);
  s.update(6, 1, 5, 10000);  // CPU bottleneck → K down
  EXPECT_EQ(s.k(), 512);
  s.update(6, 1, 5, 10000);
  s.update(6, 1, 5, 10000);
  EXPECT_EQ(s.k(), 128);
  EXPECT_FALSE(s.pre());
  s.update(6, 1, 5, 10000);  // at k_min and still the bottleneck → pre
  EXPECT_TRUE(s.pre());
  EXPECT_EQ(s.k(), 128);
  // In pre, the CPU scored 128 of 10000 tokens: post would cost 0.1 · 10000/128 ≈ 7.8 > 5 − 1, so
  // it stays in pre, and with slack in pre, K rises as in post (Algorithm 1 in either mode).
  s.update(0.1, 1, 5, 10000);
  EXPECT_TRUE(s.pre());
  EXPECT_EQ(s.k(), 256);
  // Fewer offloaded tokens (or a slower accelerator): 0.1 · 1000/256 ≈ 0.39 + 1 <= 5 → post.
  s.update(0.1, 1, 5, 1000);
  EXPECT_FALSE(s.pre());
  EXPECT_EQ(s.k(), 256);
}

// The estimate of post mode from pre scales only the part of the CPU stage that scores tokens: the
// speculative query's projection (t_fixed) costs the same in both modes.
TEST(FeedbackScheduler, ReturnToPostScalesOnlyTheScoringPart) {
  SchedulerConfig c;
  c.k_min = 128;
  FeedbackScheduler s(c);
  s.update(6, 0, 5, 1280);  // at k_min, no slack → pre
  ASSERT_TRUE(s.pre());
  // t_cpu 1.0 of which 0.9 is the projection: post ≈ 0.9 + 0.1 · 1280/128 = 1.9 <= 2 → post.
  // Scaling the whole stage would give 10 > 2 and keep it in pre.
  s.update(1.0, 0, 2, 1280, 0.9);
  EXPECT_FALSE(s.pre());
  // Without a fixed part the same times keep it in pre.
  FeedbackScheduler t(c);
  t.update(6, 0, 5, 1280);
  t.update(1.0, 0, 2, 1280, 0.0);
  EXPECT_TRUE(t.pre());
}

// K never rises above the offloaded tokens (nor k_min's floor): a larger K selects nothing more.
TEST(FeedbackScheduler, KIsClampedToTheOffloadedTokens) {
  SchedulerConfig c;
  c.k_min = 128;
  c.k_max = 4096;
  c.mode = SchedulerConfig::Mode::kPost;
  FeedbackScheduler s(c);
  for (int i = 0; i < 8; ++i) s.update(1, 0, 5, 300);
  EXPECT_EQ(s.k(), 300);
  for (int i = 0; i < 4; ++i) s.update(1, 0, 5, 3086);
  EXPECT_EQ(s.k(), 3086);  // 300 → 600 → 1200 → 2400 → capped at 3086, not 4800 → 4096
  s.update(1, 0, 5, 3086);
  EXPECT_EQ(s.k(), 3086);
  FeedbackScheduler u(c);  // fewer offloaded tokens than k_min: K stays at k_min
  u.update(1, 0, 5, 50);
  EXPECT_EQ(u.k(), 128);
}

// A pinned K (a matched budget's share) neither grows with slack nor shrinks under pressure; the
// scheduler still switches the mode where the mode is adaptive.
TEST(FeedbackScheduler, APinnedKStaysAndOnlyTheModeMoves) {
  SchedulerConfig c;
  c.k_min = 16;
  c.k_max = 4096;
  FeedbackScheduler s(c);
  s.pin_k(200);
  for (int i = 0; i < 6; ++i) s.update(1, 0, 5, 3000);  // slack: an adaptive K would double each step
  EXPECT_EQ(s.k(), 200);
  EXPECT_FALSE(s.pre());
  s.update(5, 0, 1, 3000);  // the CPU stage late: K cannot shrink below the pin, so the mode switches
  EXPECT_EQ(s.k(), 200);
  EXPECT_TRUE(s.pre());
  s.pin_k(0);
  EXPECT_EQ(s.k(), 1);  // at least one token
}

TEST(FeedbackScheduler, SixAblationConfigurations) {
  auto run = [](bool adaptive_k, SchedulerConfig::Mode mode) {
    SchedulerConfig c;
    c.adaptive_k = adaptive_k;
    c.mode = mode;
    c.k_min = 100;
    c.k_fixed = 300;
    c.k_max = 800;
    FeedbackScheduler s(c);
    std::vector<std::pair<int64_t, bool>> trace;
    for (int i = 0; i < 3; ++i) s.update(1, 0, 2, 5000), trace.emplace_back(s.k(), s.pre());   // slack
    for (int i = 0; i < 6; ++i) s.update(3, 0, 2, 5000), trace.emplace_back(s.k(), s.pre());   // bottleneck
    return trace;
  };
  using M = SchedulerConfig::Mode;
  // Fixed-K Post: K and mode never change.
  for (auto [k, pre] : run(false, M::kPost)) EXPECT_TRUE(k == 300 && !pre);
  // Fixed-K Pre: pre throughout.
  for (auto [k, pre] : run(false, M::kPre)) EXPECT_TRUE(k == 300 && pre);
  // Fixed-K Adaptive: K fixed, switches to pre at the first bottleneck.
  auto fa = run(false, M::kAdaptive);
  EXPECT_FALSE(fa[2].second);
  EXPECT_TRUE(fa[3].second);
  for (auto [k, pre] : fa) EXPECT_EQ(k, 300);
  // Adaptive-K Post: K moves within [k_min, k_max], never pre.
  auto ap = run(true, M::kPost);
  EXPECT_EQ(ap[2].first, 800);
  EXPECT_EQ(ap.back().first, 100);
  for (auto [k, pre] : ap) EXPECT_FALSE(pre);
  // Adaptive-K Pre: always pre, and K moves as in Adaptive-K Post.
  auto apre = run(true, M::kPre);
  for (auto [k, pre] : apre) EXPECT_TRUE(pre);
  for (size_t i = 0; i < apre.size(); ++i) EXPECT_EQ(apre[i].first, ap[i].first) << "update " << i;
  // Full scheduler: K up, down to k_min, then pre.
  auto full = run(true, M::kAdaptive);
  // Six configurations, six different (K, mode) traces.
  const std::vector<std::vector<std::pair<int64_t, bool>>> all = {
      run(false, M::kPost), run(false, M::kPre), fa, ap, apre, full};
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = i + 1; j < all.size(); ++j) EXPECT_NE(all[i], all[j]) << "configurations " << i << " and " << j;
  EXPECT_EQ(full[2].first, 800);
  EXPECT_TRUE(full.back().second);
  EXPECT_EQ(full.back().first, 100);
}

}  // namespace
}  // namespace hg
