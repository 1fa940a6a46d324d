// `full`: every token's K and V kept in one contiguous store; exact attention by the backend.
// The oracle the other strategies are compared with. (The accelerator tier and its capacity
// arrive with the runtime; for now the store is host memory.)
#pragma once
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/decoder/kv_store.h"
#include "engine/decoder/kv_strategy.h"

namespace hg {

class FullStrategy final : public KvStrategy {
 public:
  explicit FullStrategy(Backend& backend) : be_(backend) {}
  std::string_view name() const override { return "full"; }
  void begin(const KvShape& shape, std::span<const int32_t> capacity) override;
  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override;
  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override;
  const KvStore& store() const { return store_; }

 private:
  Backend& be_;
  KvStore store_;
  std::vector<AttnRow> attn_rows_;
};

}  // namespace hg
