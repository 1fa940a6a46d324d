// Read-bandwidth references for benchmarks that report a ratio to the machine's bandwidth.
//
// On a shared machine the bandwidth moves by 2x within minutes, so a reference measured once is
// not a fair denominator. A ReadProbe pass right after each timed kernel call (or decode step)
// sees the same moment: the ratio of each pair, and the median over pairs, is what the
// benchmarks report (paired_ratio).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"

namespace hg {

// How a reference pass reads: cpu::sum's eight prefetched streams per thread (the best read this
// machine does: the references' default), or cpu::sum_one_stream's plain reduction (one
// plain stream per thread; reported beside the default as a weaker yardstick).
enum class ReadPass { kEightStreams, kOneStream };

// One read-only pass over p[0, n), in ranges the current threads take as they come free (as the
// decode GEMV splits its rows): GB/s.
double read_pass_gbs(const float* p, int64_t n, ReadPass how = ReadPass::kEightStreams);

// One read-only pass over the rows src + idx[i] · row_floats, i < n (cpu::sum_rows per range of the
// index list, taken as for read_pass_gbs): GB/s of the rows' bytes. The random-access reference
// for gathers, whose rows defeat the streaming that read_pass_gbs measures.
double rows_read_pass_gbs(const float* src, int64_t row_floats, const int32_t* idx, int64_t n);

// A buffer read in turn: each pass reads the next `bytes` (wrapping), so the region a pass reads
// was last touched a whole buffer ago: from memory when the buffer is well over the LLC.
class ReadProbe {
 public:
  // buffer_bytes 0: max(512 MiB, three times the last-level cache).
  explicit ReadProbe(int64_t buffer_bytes = 0);
  // GB/s of one pass over `bytes` (clamped to [64 KiB, buffer]).
  double pass_gbs(int64_t bytes, ReadPass how = ReadPass::kEightStreams);

 private:
  AlignedBuffer buf_;
  int64_t n_ = 0, pos_ = 0;  // floats
};

// Median of v (the mean of the middle two for an even count); 0 for an empty v.
double median(std::vector<double> v);
// Mean of v (NaN for an empty v) and its sample standard deviation (n − 1; 0 below two values).
double mean(const std::vector<double>& v);
double sample_sd(const std::vector<double>& v);

// Pairs of (kernel GB/s, reference GB/s) taken back to back; ratio() is the median of the
// per-pair ratios, gbs() and ref_gbs() the medians of each side.
struct PairedRatio {
  std::vector<double> kernel, ref;
  void add(double kernel_gbs, double ref_gbs) { kernel.push_back(kernel_gbs), ref.push_back(ref_gbs); }
  std::vector<double> ratios() const;  // per pair, in order
  double ratio() const { return median(ratios()); }
  double gbs() const { return median(kernel); }
  double ref_gbs() const { return median(ref); }
  size_t size() const { return kernel.size(); }
};

}  // namespace hg
