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

void FeedbackScheduler::pin_k(int64_t k) { c_.k_min = c_.k_max = k_ = std::max<int64_t>(1, k); }

void FeedbackScheduler::update(double t_cpu, double t_tx, double t_gpu, int64_t n_offloaded, double t_fixed) {
  const bool slack = t_cpu + t_tx <= t_gpu;
  const bool switchable = c_.mode == SchedulerConfig::Mode::kAdaptive;
  if (pre_ && switchable && k_ > 0 && n_offloaded > 0) {
    const double fixed = std::clamp(t_fixed, 0.0, t_cpu);
    const double scored = double(std::min<int64_t>(k_, n_offloaded));
    const double post_cpu = fixed + (t_cpu - fixed) * double(n_offloaded) / scored;
    if (post_cpu + t_tx <= t_gpu) {
      pre_ = false;
      return;
    }
  }
  if (slack) {
    if (c_.adaptive_k) {
      int64_t next = int64_t(std::ceil(double(k_) * c_.k_growth));
      if (n_offloaded > 0) next = std::min(next, std::max(c_.k_min, n_offloaded));
      k_ = std::max(k_, std::min(c_.k_max, next));
    }
  } else if (c_.adaptive_k && k_ > c_.k_min) {
    k_ = std::max(c_.k_min, int64_t(std::floor(double(k_) / c_.k_growth)));
  } else if (!pre_ && switchable) {
    pre_ = true;
  }
}

}  // namespace hg
