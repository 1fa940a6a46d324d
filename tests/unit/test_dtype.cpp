// F16/BF16 conversions against the F16C hardware converter and known values.
#include <immintrin.h>

#include "engine/core/dtype.h"
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
