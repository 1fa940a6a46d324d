// F16/BF16 conversions against the F16C hardware converter and known values.
#include <fmt/format.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/core/thread_pool.h"
#include "test_util.h"

namespace hg {
namespace {

TEST(DType, F16MatchesHardwareOnRandomAndSpecialValues) {
  std::vector<float> v = test::random_vec(20000, 1, -70000.0f, 70000.0f);
  auto small = test::random_vec(20000, 2, -1e-4f, 1e-4f);  // subnormal range of F16
  v.insert(v.end(), small.begin(), small.end());
  v.insert(v.end(), {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e-8f, 5.96e-8f, INFINITY, -INFINITY});
  for (float x : v) {
    const uint16_t hw = _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(f32_to_f16(x), hw) << "x = " << x;
    ASSERT_EQ(f16_to_f32(hw), _cvtsh_ss(hw)) << "h = " << hw;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = f16_to_f32(uint16_t(h)), b = _cvtsh_ss(uint16_t(h));
    if (std::isnan(b)) ASSERT_TRUE(std::isnan(a));
    else ASSERT_EQ(a, b) << "h = " << h;
  }
}

// from_f32's F16 rows (F16C where the build has it, 8 at a time, then a scalar tail) equal the
// scalar f32_to_f16 value by value; a NaN stays a NaN.
TEST(DType, F16RowsMatchTheScalarConversion) {
  std::vector<float> v = test::random_vec(4099, 3, -70000.0f, 70000.0f);
  auto small = test::random_vec(4099, 4, -1e-4f, 1e-4f);
  v.insert(v.end(), small.begin(), small.end());
  v.insert(v.end(),
           {0.0f, -0.0f, 65520.0f, -65519.0f, 6.1e-5f, 5.96e-8f, 2.9e-8f, INFINITY, -INFINITY, NAN, -NAN});
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), v.size()}) {
    std::vector<uint16_t> row(n + 1, 0xabcd);
    from_f32(DType::kF16, v.data(), row.data(), n);
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(v[i]))
        ASSERT_TRUE(std::isnan(f16_to_f32(row[i]))) << "i = " << i;
      else
        ASSERT_EQ(row[i], f32_to_f16(v[i])) << "x = " << v[i];
    }
    EXPECT_EQ(row[n], 0xabcd) << "wrote past n = " << n;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly between two BF16 values: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);  // 1 + 3·2^-8 rounds up to even
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, ParseNames) {
  DType t;
  EXPECT_TRUE(parse_dtype("bf16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_FALSE(parse_dtype("q4_0", &t));
}

}  // namespace
}  // namespace hg

namespace hg {
namespace {

// convert_weight splits rows across the pool as the decode GEMV does: the result is the same
// with any thread count, and consumed() is told each byte of the source exactly once.
TEST(ConvertWeight, ParallelCopyMatchesSerialAndReleasesEverySourceByteOnce) {
  const int64_t rows = 1000, cols = 37;  // 16 blocks of 64 rows, the last one short
  auto src = test::random_vec(size_t(rows * cols), 5);
  const int saved = num_threads();
  for (DType to : {DType::kF32, DType::kF16, DType::kBF16}) {
    set_num_threads(1);
    const Weight serial = convert_weight(DType::kF32, src.data(), to, {rows, cols});
    set_num_threads(2);
    std::mutex mu;
    std::vector<std::pair<size_t, size_t>> told;
    const Weight parallel = convert_weight(DType::kF32, src.data(), to, {rows, cols}, [&](size_t off, size_t n) {
      std::lock_guard<std::mutex> lock(mu);
      told.emplace_back(off, n);
    });
    ASSERT_EQ(serial.bytes(), parallel.bytes());
    EXPECT_EQ(std::memcmp(serial.buf.data(), parallel.buf.data(), serial.bytes()), 0) << dtype_name(to);
    std::sort(told.begin(), told.end());
    size_t next = 0;
    for (auto [off, n] : told) {
      EXPECT_EQ(off, next);
      next = off + n;
    }
    EXPECT_EQ(next, src.size() * sizeof(float)) << dtype_name(to);
  }
  set_num_threads(saved);
}

// The decode GEMV's split: every index once, in contiguous ranges of at least the grain (but the
// last), the first range a 1/(threads + 1) share when the work allows it.
TEST(ThreadPool, RangesCoverEachIndexOnceInRunsOfAtLeastTheGrain) {
  const int saved = num_threads();
  for (int threads : {1, 2, 3})
    for (int64_t n : {0, 1, 5, 64, 1000, 4096})
      for (int64_t grain : {1, 7, 64}) {
        set_num_threads(threads);
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        parallel_ranges(n, grain, [&](int64_t b, int64_t e) {
          std::lock_guard<std::mutex> lock(mu);
          ranges.emplace_back(b, e);
        });
        const std::string what = fmt::format("{} threads, n {}, grain {}", threads, n, grain);
        std::sort(ranges.begin(), ranges.end());
        int64_t next = 0;
        for (auto [b, e] : ranges) {
          EXPECT_EQ(b, next) << what;
          EXPECT_TRUE(e - b >= grain || e == n) << what << ": [" << b << ", " << e << ")";
          next = e;
        }
        EXPECT_EQ(next, n) << what;
        if (numa_nodes_bound() == 1 && n / grain >= 4 * threads) {
          EXPECT_EQ(ranges.front().second, threads == 1 ? n : std::max(grain, n / (threads + 1))) << what;
        }
      }
  set_num_threads(saved);
}

}  // namespace
}  // namespace hg
