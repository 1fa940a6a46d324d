// HybridGen's feedback scheduler (the paper's Algorithm 1), a pure state machine so it can be
// tested on scripted stage times. After each step it compares the CPU stage (logits + selection)
// plus transfer time with the accelerator stage time:
//   post mode, T_cpu + T_tx ≤ T_gpu (slack):  K ← min(k_max, ⌈K·k_growth⌉)             [adaptive K]
//   post mode, no slack:                      K ← max(k_min, ⌊K/k_growth⌋) while K > k_min;
//                                             at k_min (or with fixed K): switch to pre  [adaptive mode]
//   pre mode: return to post when the post-mode CPU time, estimated as T_cpu · n_offloaded / K
//             (pre scores K tokens, post scores all n_offloaded), plus T_tx fits in T_gpu.
// K starts at k_min in post (fixed K: at k_fixed). One K for all layers.
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
  // Moves the lower bound of K (a k_min given as a fraction of the growing context): adaptive K is
  // raised to it where it is below; a fixed K becomes it.
  void set_k_min(int64_t k_min);
  bool pre() const { return pre_; }
  // Feeds one step's stage times (seconds) and the number of offloaded tokens scored in post mode.
  void update(double t_cpu, double t_tx, double t_gpu, int64_t n_offloaded);
  std::string mode_name() const { return pre_ ? "pre" : "post"; }

 private:
  SchedulerConfig c_;
  int64_t k_;
  bool pre_;
};

}  // namespace hg
