// HybridGen's feedback scheduler (the paper's Algorithm 1), a pure state machine so it can be
// tested on scripted stage times. After each step it compares the CPU stage (logits + selection)
// plus transfer time with the accelerator stage time, in either selection mode:
//   T_cpu + T_tx ≤ T_gpu (slack):  K ← min(k_max, ⌈K·k_growth⌉), and not above the offloaded
//                                  tokens (a K beyond them selects nothing more)   [adaptive K]
//   no slack:                      K ← max(k_min, ⌊K/k_growth⌋) while K > k_min;
//                                  in post at k_min (or with fixed K): switch to pre [adaptive mode]
//   pre mode: first, return to post when the post-mode CPU time fits in T_gpu − T_tx, estimated as
//             T_fixed + (T_cpu − T_fixed) · n_offloaded / min(K, n_offloaded): pre scores K tokens,
//             post scores all offloaded ones, and the part that does not depend on the token count
//             (T_fixed: the speculative query's projection) stays as it is.
// K starts at k_min (fixed K: at k_fixed). One K for all layers.
#pragma once
#include <cstdint>
#include <string>

namespace hg {

struct SchedulerConfig {
  bool adaptive_k = true;
  enum class Mode { kAdaptive, kPost, kPre } mode = Mode::kAdaptive;
  int64_t k_min = 128;
  int64_t k_max = 4096;
  int64_t k_fixed = 128;  // K when adaptive_k is false
  double k_growth = 2.0;
};

class FeedbackScheduler {
 public:
  explicit FeedbackScheduler(const SchedulerConfig& c);
  int64_t k() const { return k_; }
  int64_t k_min() const { return c_.k_min; }
  // Moves the lower bound of K (a k_min given as a fraction of the growing context): adaptive K is
  // raised to it where it is below; a fixed K becomes it.
  void set_k_min(int64_t k_min);
  // K fixed at k (K_min = K_max = k): the scheduler then chooses only the mode.
  void pin_k(int64_t k);
  bool pre() const { return pre_; }
  // Feeds one step's stage times (seconds), the number of offloaded tokens (post mode scores all of
  // them) and the part of t_cpu that does not scale with the tokens scored (t_fixed <= t_cpu).
  void update(double t_cpu, double t_tx, double t_gpu, int64_t n_offloaded, double t_fixed = 0);
  std::string mode_name() const { return pre_ ? "pre" : "post"; }

 private:
  SchedulerConfig c_;
  int64_t k_;
  bool pre_;
};

}  // namespace hg
