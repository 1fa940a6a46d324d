// `streamingllm` — attention sinks plus a sliding window: keep the first `sinks` tokens and the
// newest `window` (the paper's setting: 4 sinks, 1024-token window). `positions: cache` (default,
// as mit-han-lab/streaming-llm pos_shift): keys are stored before RoPE and rotated each step at
// their position within the cache, the query at the current token's cache position; `original`
// keeps each key at its text position (kvpress without KeyRerotationPress). Models with learned
// positions (OPT) have nothing to re-rotate: both settings behave as `original`.
#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "baselines/eviction.h"
#include "selectors/sinks_recent.h"

namespace hg {
namespace {

class StreamingLlm final : public EvictingStrategy {
 public:
  StreamingLlm(const StrategyContext& ctx, const StrategyParams& p)
      : EvictingStrategy(ctx, "streamingllm", p), sinks_(int32_t(p.get_int("sinks"))), window_(int32_t(p.get_int("window"))),
        cache_pos_(p.get("positions") == "cache"), kv_ratio_(p.get_float("kv_ratio")) {
    if (sinks_ < 0 || window_ < 1) input_error("strategy streamingllm: sinks must be >= 0 and window >= 1");
    if (kv_ratio_ < 0 || kv_ratio_ > 1) input_error("strategy streamingllm: kv_ratio must be in [0, 1]");
    if (shared_budget() > 0) kv_ratio_ = shared_budget();
  }
  std::string_view name() const override { return "streamingllm"; }
  // With kv_ratio, the window is the rest of kv_ratio·n after the sinks (at least one token).
  int32_t budget(int, int32_t n) const override {
    return kv_ratio_ > 0 ? sinks_ + std::max(1, int32_t(std::floor(kv_ratio_ * n)) - sinks_) : sinks_ + window_;
  }

 protected:
  bool cache_positions() const override { return cache_pos_; }
  int taps() const override { return 0; }
  void victims(int layer, int seq, int g, int32_t count, std::vector<int32_t>& slots) override {
    // What the sinks + most recent set of the remaining size leaves out, oldest first.
    const int32_t n = store().count(layer, seq, g);
    const int32_t* pos = store().positions(layer, seq, g);
    const SinksAndRecent keep = sinks_and_recent(n, n - count, sinks_);
    if (keep.recent - keep.sinks != count)
      throw std::logic_error("streamingllm: fewer non-sink tokens than must be evicted");
    slots.resize(size_t(n));
    std::iota(slots.begin(), slots.end(), 0);
    first_in_order(slots, keep.recent, [&](int32_t a, int32_t b) { return pos[a] < pos[b]; });
    slots.erase(slots.begin(), slots.begin() + keep.sinks);
  }

 private:
  int32_t sinks_, window_;
  bool cache_pos_;
  double kv_ratio_;
};

}  // namespace

StrategyInfo streamingllm_info() {
  return {"streamingllm", "attention sinks + sliding window of the newest tokens (StreamingLLM)",
          {{"sinks", ParamSpec::Type::kInt, "4", "tokens", "first tokens always kept", {}, 0, kNoMax},
           {"window", ParamSpec::Type::kInt, "1024", "tokens", "newest tokens kept", {}, 1, kNoMax},
           {"kv_ratio", ParamSpec::Type::kFloat, "0", "ratio",
            "instead of window: sinks + window = this fraction of the current context (0: window)", {}, 0, 1},
           {"positions", ParamSpec::Type::kEnum, "cache", "", "RoPE positions of kept keys", {"cache", "original"}},
           kv_home_param(), overlap_param(), budget_basis_param()},
          [](const StrategyContext& c, const StrategyParams& p) { return std::make_unique<StreamingLlm>(c, p); },
          /*runs_on_cuda=*/true, /*budgeted=*/true, /*native_16bit_kv=*/true};
}

}  // namespace hg
