// `hgbench calibrate`'s profile: every rate measured, finite and positive, and the saved YAML
// reads back the same. How its bandwidth compares with an independent STREAM-style read is a
// benchmark (BM_CalibrateVsStream in tests/bench/bench_kernels.cpp), not a test.
#include <cmath>
#include <string>

#include "engine/core/thread_pool.h"
#include "engine/runtime/runtime.h"
#include "test_util.h"

namespace hg {
namespace {

TEST(Calibrate, ProfileIsMeasuredAndRoundTrips) {
  CalibrateOptions o;
  o.seconds_per_measure = 0.05;
  o.buffer_bytes = int64_t(64) << 20;
  std::string notes;
  const PlatformProfile p = calibrate(o, &notes);
  for (auto [v, what] : {std::pair{p.dram_gbs, "dram_gbs"}, {p.far_gbs, "far_gbs"}, {p.cpu_flops, "cpu_flops"},
                         {p.gpu_flops, "gpu_flops"}, {p.gpu_mem_gbs, "gpu_mem_gbs"}}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << what << " = " << v << "\n" << notes;
  }
  // Fixed costs: measured, and below a millisecond on any machine.
  for (auto [v, what] : {std::pair{p.stage_us, "stage_us"}, {p.launch_us, "launch_us"}, {p.copy_us, "copy_us"}})
    EXPECT_TRUE(std::isfinite(v) && v >= 0 && v < 1000) << what << " = " << v << "\n" << notes;
  EXPECT_GT(p.stage_us, 0) << notes;
  // A microsecond per 512 B row would be a broken measurement on any DRAM.
  EXPECT_GE(p.dram_row_ns, 0.0);
  EXPECT_LT(p.dram_row_ns, 1000.0);
  const std::string out = test::temp_path("this-machine.yaml");
  save_platform(p, out, "test");
  const PlatformProfile back = load_platform(out, "");
  EXPECT_NEAR(back.dram_gbs, p.dram_gbs, 1e-3 * p.dram_gbs);
  EXPECT_NEAR(back.cpu_flops, p.cpu_flops, 1e-3 * p.cpu_flops);
  EXPECT_NEAR(back.dram_row_ns, p.dram_row_ns, 1e-3 * p.dram_row_ns + 1e-6);
  // The CPU worker's decode attention over F16 KV: measured, and no faster than a plain read of
  // the same memory could make it by more than the noise of two short measurements.
  EXPECT_GT(p.cpu_attn_gbs, 0) << notes;
  EXPECT_LT(p.cpu_attn_gbs, 3 * p.dram_gbs) << notes;
  EXPECT_NEAR(back.cpu_attn_gbs, p.cpu_attn_gbs, 1e-3 * p.cpu_attn_gbs);
  EXPECT_NEAR(back.stage_us, p.stage_us, 1e-3 * p.stage_us);
  // The attention rate per head dimension of the evaluated models, and the score-policy rate.
  ASSERT_EQ(p.gpu_attn_flops_by_dim.size(), 2u) << notes;
  for (int d : {64, 128}) {
    ASSERT_TRUE(p.gpu_attn_flops_by_dim.count(d)) << d;
    EXPECT_GT(p.gpu_attn_flops_by_dim.at(d), 0) << d;
    EXPECT_NEAR(back.gpu_attn_flops_by_dim.at(d), p.gpu_attn_flops_by_dim.at(d), 1e-3 * p.gpu_attn_flops_by_dim.at(d));
  }
  EXPECT_EQ(p.gpu_attn_flops, p.gpu_attn_flops_by_dim.at(128));
  EXPECT_GT(p.gpu_elem_eps, 0) << notes;
  EXPECT_NEAR(back.gpu_elem_eps, p.gpu_elem_eps, 1e-3 * p.gpu_elem_eps);
  // Without a GPU the "gpu" rates are the emulated accelerator's, and the notes say so.
  if (cuda_device_count_or_zero() == 0) {
    EXPECT_NE(notes.find("emulated accelerator (" + std::to_string(emulated_accel_threads()) + " thread"),
              std::string::npos)
        << notes;
  }
}

}  // namespace
}  // namespace hg
