// StreamingLLM's kept set, which HybridGen's pre mode also scores: of n tokens in position order,
// the first min(sinks, k) (the attention sinks) and the most recent rest of k.
#pragma once
#include <algorithm>
#include <cstdint>

namespace hg {

// Keeps ranks [0, sinks) and [recent, n); k >= n keeps every one, k <= 0 none.
struct SinksAndRecent {
  int32_t sinks = 0;
  int32_t recent = 0;
};

inline SinksAndRecent sinks_and_recent(int32_t n, int32_t k, int32_t sinks) {
  k = std::clamp(k, 0, std::max(n, 0));
  const int32_t s = std::clamp(sinks, 0, k);
  return {s, std::max(s, n - (k - s))};
}

}  // namespace hg
