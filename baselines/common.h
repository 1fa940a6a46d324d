// Helpers the strategies share: runtime checks, per-sequence grouping of token rows, and the
// AttentionArgs they hand to a backend.
#pragma once
#include <map>
#include <span>
#include <type_traits>
#include <vector>

#include "baselines/registry.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/runtime/runtime.h"

namespace hg {

// The runtime a strategy needs (tiers, queues, transfers); InputError when the run has none.
Runtime& require_runtime(const StrategyContext& ctx, const char* strategy);

// Whole layers of `layer_bytes` each that stay on the accelerator within its KV budget when the
// others stream through two staging layers of the same size: all of them when all fit, none
// without a budget.
int layers_within_budget(int64_t budget, int64_t layer_bytes, int n_layers);

// Lowest position among `rows` per sequence: the tokens [0, first) were stored by earlier calls.
std::map<int32_t, int32_t> first_new_position(std::span<const TokenRow> rows);

// A whole-prompt prefill: when the call's rows hold every position of `seq` below n, writes that
// sequence's keys and values — the decoder's rows k, v [.., H_kv, D], row i at index at[i] (i when
// `at` is empty) — into dk, dv [H_kv, n, D] on the accelerator (one write per run of
// consecutive rows) and returns true; nothing is read back over the link. False otherwise.
// dk, dv hold elements of type dt.
bool write_own_kv(Backend& be, std::span<const TokenRow> rows, std::span<const size_t> at, int32_t seq, int32_t n,
                  const float* k, const float* v, int H_kv, int D, void* dk, void* dv, DType dt);

// Host view of n floats that may live in the accelerator's memory: p itself on a host backend,
// else a copy downloaded into `staging` (on the calling thread: inside a transfer's body, the copy
// queue's). The array must be complete: a transfer waits for the submitting thread's device work.
const float* host_view(Backend& be, const float* p, size_t n, std::vector<float>& staging);

AttentionArgs attention_args(const KvShape& s, std::span<const AttnRow> rows, const float* q, float scale, float* out,
                             DType kv_dtype = DType::kF32);

// A buffer a strategy keeps between calls: grown on `tier` to at least `bytes` when smaller (its
// contents are not kept), else left as it is. With `slack` it grows by half again at least when
// the tier has room for that, so that a buffer following a cache that grows by a token per step
// reallocates rarely.
// The shared KV element type as a strategy resolved it: the type it stores and moves, the bytes of
// n elements of it, and the effective_params() entry when it differs from the request.
class KvElement {
 public:
  KvElement() = default;
  KvElement(const StrategyContext& ctx, const StrategyParams& p)
      : requested_(requested_kv_dtype(p)), dtype_(effective_kv_dtype(ctx, p)) {}
  DType dtype() const { return dtype_; }
  int64_t bytes(int64_t elems) const { return elems * int64_t(dtype_size(dtype_)); }
  // Byte address of element `elems` of an array of this type.
  template <class P>
  auto at(P* p, int64_t elems) const {
    using C = std::conditional_t<std::is_const_v<P>, const char, char>;
    return reinterpret_cast<C*>(p) + bytes(elems);
  }
  std::map<std::string, std::string> effective() const {
    if (dtype_ == requested_) return {};
    return {{"kv_dtype", std::string(dtype_name(dtype_))}};
  }

 private:
  DType requested_ = DType::kF32, dtype_ = DType::kF32;
};

void grow_allocation(MemorySystem& mem, Tier tier, Allocation& a, int64_t bytes, bool slack = false,
                     MemUse use = MemUse::kOther);

}  // namespace hg
