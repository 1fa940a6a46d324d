// Feedback scheduler.
#include "baselines/hybridgen/scheduler.h"

#include <algorithm>
#include <cmath>

namespace hg {

FeedbackScheduler::FeedbackScheduler(const SchedulerConfig& c)
    : c_(c), k_(c.adaptive_k ? c.k_min : c.k_fixed), pre_(c.mode == SchedulerConfig::Mode::kPre) {}

void FeedbackScheduler::set_k_min(int64_t k_min) {
  c_.k_min = std::max<int64_t>(1, k_min);
  c_.k_max = std::max(c_.k_max, c_.k_min);
  k_ = c_.adaptive_k ? std::max(k_, c_.k_min) : c_.k_min;  // fixed K follows the ratio
}

void FeedbackScheduler::update(double t_cpu, double t_tx, double t_gpu, int64_t n_offloaded) {
  const bool slack = t_cpu + t_tx <= t_gpu;
  const bool switchable = c_.mode == SchedulerConfig::Mode::kAdaptive;
  if (!pre_) {
    if (slack) {
      if (c_.adaptive_k) k_ = std::min(c_.k_max, int64_t(std::ceil(double(k_) * c_.k_growth)));
    } else if (c_.adaptive_k && k_ > c_.k_min) {
      k_ = std::max(c_.k_min, int64_t(std::floor(double(k_) / c_.k_growth)));
    } else if (switchable) {
      pre_ = true;
    }
    return;
  }
  if (switchable && k_ > 0 && n_offloaded > 0) {
    const double post_cpu = t_cpu * double(n_offloaded) / double(std::min<int64_t>(k_, n_offloaded));
    if (post_cpu + t_tx <= t_gpu) pre_ = false;
  }
}

}  // namespace hg
