// `snapkv` — SnapKV (Li et al., 2024; FasterDecoding/SnapKV, snapkv_utils.py): at the end of the
// prefill, each KV head keeps the prompt's last `window` tokens (the observation window) and the
// `capacity − window` others that the window's queries attend most: the window rows' softmax
// probabilities summed over the window (and over a KV group's query heads), pooled over `kernel`
// neighbouring positions (avg_pool1d with zero padding, or max), the top ones kept. A prompt
// shorter than the capacity is kept whole. Decode tokens are all kept (the authors compress once,
// in the prefill). Runs on the eviction engine: scores and the pick on the accelerator, the pruned
// prompt where `kv_home` puts it.
#include <algorithm>
#include <cmath>

#include "baselines/eviction.h"

namespace hg {
namespace {

class SnapKv final : public EvictingStrategy {
 public:
  SnapKv(const StrategyContext& ctx, const StrategyParams& p)
      : EvictingStrategy(ctx, "snapkv", p), window_(int32_t(p.get_int("window"))), kernel_(int(p.get_int("kernel"))),
        max_(p.get("pooling") == "max"), capacity_tokens_(int32_t(p.get_int("kv_tokens"))), kv_ratio_(p.get_float("kv_ratio")) {
    if (shared_budget() > 0) kv_ratio_ = shared_budget(), capacity_tokens_ = 0;
    if (p.get("budget_basis") == "sequence")
      input_error("strategy snapkv: budget_basis sequence does not apply (SnapKV compresses the prompt once, at its end)");
    if (kv_ratio_ <= 0 && capacity_tokens_ <= window_)
      input_error("strategy snapkv: kv_tokens ({}) must exceed window ({}), as the authors' max_capacity_prompt does",
                  capacity_tokens_, window_);
  }
  std::string_view name() const override { return "snapkv"; }
  // The prompt's tokens kept: the capacity (at least the window and one more), or all of a shorter
  // prompt; every decode token after them.
  int32_t budget(int seq, int32_t n) const override {
    const int32_t P = prompt_len(seq);
    return kept_prompt(P) + std::max(0, n - P);
  }

 protected:
  int taps() const override { return kProbs; }
  bool scores_row(int seq, int32_t pos) const override {
    const int32_t P = prompt_len(seq);
    return pos < P && pos >= P - window_;
  }
  int32_t recent_window(int) const override { return window_; }
  int pool_kernel() const override { return kernel_; }
  bool pool_max() const override { return max_; }

 private:
  int32_t kept_prompt(int32_t P) const {
    const int32_t cap = kv_ratio_ > 0 ? std::max(window_ + 1, int32_t(std::floor(kv_ratio_ * P + 1e-9))) : capacity_tokens_;
    return P < cap ? P : cap;
  }
  int32_t window_;
  int kernel_;
  bool max_;
  int32_t capacity_tokens_;
  double kv_ratio_;
};

}  // namespace

StrategyInfo snapkv_info() {
  return {"snapkv", "prompt compressed once by the observation window's pooled attention (SnapKV)",
          {{"window", ParamSpec::Type::kInt, "32", "tokens", "observation window: the prompt's last tokens, always kept", {}, 1, kNoMax},
           {"kv_tokens", ParamSpec::Type::kInt, "2048", "tokens", "prompt tokens kept, the window included (max_capacity_prompt)", {}, 2, kNoMax},
           {"kv_ratio", ParamSpec::Type::kFloat, "0", "ratio", "prompt tokens kept as a fraction of the prompt (0: kv_tokens)", {}, 0, 1},
           {"kernel", ParamSpec::Type::kInt, "5", "tokens", "pooling kernel over neighbouring positions", {}, 1, 257},
           {"pooling", ParamSpec::Type::kEnum, "avg", "", "avg (avg_pool1d, zero padded) or max", {"avg", "max"}},
           kv_home_param(), overlap_param(), budget_basis_param()},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<SnapKv>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/true, /*native_16bit_kv=*/true};
}

}  // namespace hg
