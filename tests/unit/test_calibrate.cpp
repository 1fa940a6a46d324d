// `hgbench calibrate`'s dram bandwidth against an independent STREAM-style measurement (within
// 20%). Its own executable, run serially by ctest: concurrent tests would skew both figures.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "engine/core/tensor.h"
#include "engine/core/thread_pool.h"
#include "engine/runtime/runtime.h"
#include "test_util.h"

namespace hg {
namespace {

// An independent STREAM-style read measurement: OpenMP reduction over 256 MiB of doubles. The
// buffer comes from host_alloc, as calibrate's does, so both read from the same page size. With a
// std::vector (4 KiB pages on a THP `madvise` VM) CI read 27-38 GB/s in all five tries while
// calibrate read 50-53 from 2 MiB pages (2026-11-29): a difference of pages, not of the code.
double stream_read_gbs() {
  const size_t n = size_t(256) << 20 >> 3;
  std::unique_ptr<double, decltype(&std::free)> buf(static_cast<double*>(host_alloc(n * 8)), &std::free);
  if (!buf) return 0;
  double* a = buf.get();
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) a[i] = double(i % 7);
  double best = 0;
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    double s = 0;
#pragma omp parallel reduction(+ : s)
    {
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;  // 8 independent chains
#pragma omp for
      for (size_t i = 0; i < n; i += 8) {
        s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
        s4 += a[i + 4], s5 += a[i + 5], s6 += a[i + 6], s7 += a[i + 7];
      }
      s += s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile double sink = s;
    (void)sink;
    best = std::max(best, double(n) * 8 / dt / 1e9);
  }
  return best;
}

TEST(Calibrate, ProfileBandwidthWithinTwentyPercentOfStream) {
  CalibrateOptions o;
  o.seconds_per_measure = 0.3;
  o.buffer_bytes = int64_t(256) << 20;
  std::string notes;
  // Shared machines are noisy: measure the two in turn, up to five times each, and require one
  // calibrate figure to agree within 20% with the STREAM-style figure just before or just after it
  // (a real disagreement fails all of them). Both neighbours count: this machine has been seen
  // switching between ≈ 33 and ≈ 55 GB/s from one measurement to the next for a minute
  // (33 vs 52, 58 vs 33, 32 vs 57, … — each calibrate figure matching the stream before it).
  double cal = 0, stream = 0, prev_stream = 0;
  bool agree = false;
  std::string tries;
  PlatformProfile p;
  auto close = [](double c, double s) { return s > 0 && std::abs(c - s) <= 0.2 * s; };
  for (int i = 0; i < 5 && !agree; ++i) {
    p = calibrate(o, &notes);
    cal = p.dram_gbs;
    agree = close(cal, prev_stream);
    stream = stream_read_gbs();
    tries += " (" + std::to_string(cal) + " vs " + std::to_string(stream) + ")";
    agree = agree || close(cal, stream);
    prev_stream = stream;
  }
  EXPECT_TRUE(agree) << "calibrate vs STREAM-style GB/s:" << tries;
  std::printf("calibrate vs STREAM-style GB/s:%s\n", tries.c_str());
  EXPECT_GT(p.cpu_flops, 1e9);
  const std::string out = test::temp_path("this-machine.yaml");
  save_platform(p, out, "test");
  const PlatformProfile back = load_platform(out, "");
  EXPECT_NEAR(back.dram_gbs, p.dram_gbs, 1e-3 * p.dram_gbs);
  EXPECT_NEAR(back.cpu_flops, p.cpu_flops, 1e-3 * p.cpu_flops);
  // Random rows cost more than a stream on any DRAM; a cost of a microsecond per 512 B row would
  // mean a broken measurement.
  EXPECT_GT(p.dram_row_ns, 0.0);
  EXPECT_LT(p.dram_row_ns, 1000.0);
  EXPECT_NEAR(back.dram_row_ns, p.dram_row_ns, 1e-3 * p.dram_row_ns + 1e-6);
  // Without a GPU the "gpu" rates are the emulated accelerator's, measured with its threads (half
  // the machine): its SGEMM runs on fewer threads than the CPU's and is measurably slower.
  if (cuda_device_count_or_zero() == 0 && emulated_accel_threads() < num_threads()) {
    EXPECT_LT(p.gpu_flops, 0.8 * p.cpu_flops) << notes;
    EXPECT_NE(notes.find("emulated accelerator (" + std::to_string(emulated_accel_threads()) + " thread"),
              std::string::npos)
        << notes;
  }
}

}  // namespace
}  // namespace hg
