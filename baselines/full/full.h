// `full`: every token's K and V kept in one contiguous store; exact attention by the backend.
// The oracle the other strategies are compared with. With a runtime, the store is allocated on
// the `gpu` tier, so a KV cache larger than gpu_memory_bytes is an out-of-memory result.
#pragma once
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv/kv_store.h"
#include "engine/kv/kv_strategy.h"
#include "engine/runtime/runtime.h"

namespace hg {

class FullStrategy final : public KvStrategy {
 public:
  // requested: the kv_dtype asked for, when the store's differs (reported in effective_params()).
  explicit FullStrategy(Backend& backend, Runtime* runtime = nullptr, DType kv_dtype = DType::kF32,
                        DType requested = DType::kF32)
      : be_(backend), rt_(runtime), kv_dtype_(kv_dtype), requested_(requested) {}
  std::string_view name() const override { return "full"; }
  DType kv_dtype() const override { return kv_dtype_; }
  std::map<std::string, std::string> effective_params() const override {
    if (kv_dtype_ == requested_) return {};
    return {{"kv_dtype", std::string(dtype_name(kv_dtype_))}};
  }
  void begin(const KvShape& shape, std::span<const int32_t> capacity, std::span<const int32_t> prompt_len) override;
  void append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) override;
  void attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) override;
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override;
  const KvStore& store() const { return store_; }

 private:
  Backend& be_;
  Runtime* rt_;
  DType kv_dtype_, requested_;
  KvStore store_;
  std::vector<AttnRow> attn_rows_;
};

}  // namespace hg
