// `null`: keeps no KV and computes no attention (the output rows are zeroed). Not a method: it
// exists so that `hgbench bench` can measure the engine's own per-step overhead (with the `null`
// backend) and so that a strategy's cost can be separated from the rest of a step.
#pragma once
#include "engine/kv/kv_strategy.h"

namespace hg {

class NullStrategy final : public KvStrategy {
 public:
  std::string_view name() const override { return "null"; }
  void begin(const KvShape& shape, std::span<const int32_t>, std::span<const int32_t>) override { shape_ = shape; }
  void append(int, std::span<const TokenRow>, const float*, const float*) override {}
  void attend(int, std::span<const TokenRow> rows, const float*, float, float* out) override;
  void fork(int32_t, int32_t, std::span<const int32_t>) override {}

 private:
  KvShape shape_;
};

}  // namespace hg
