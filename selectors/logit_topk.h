// Logit top-K: the K positions whose score, the largest logit over a group of G query heads, is
// highest. HybridGen's `post` mode (over the offloaded keys) and InfiniGen's speculative fetch (over
// all cached keys) select this way, per KV head, on every decode step and layer.
//
// Positions come out in increasing order; ties go to the lower position; NaN logits are ignored (a
// position whose G logits are all NaN scores -inf); K ≥ n gives every position, K ≤ 0 none. The
// selection is a policy op (PolicyOps::logit_top_k): the reference is std::nth_element over
// (−score, position) and a sort; the CPU kernel takes the K-th score from the candidates that pass a
// lower bound from a strided sample of up to 1024 scores (about 2K pass; a sample that lets fewer
// than K pass costs a second pass with every position a candidate), with no sort.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/backend/policy_ops.h"

namespace hg {

// out ← the selection of logits [G][ld] over n positions, on `host` (a backend with host memory).
inline void logit_top_k(PolicyOps& host, const float* logits, int G, int64_t ld, int32_t n, int32_t K,
                        std::vector<int32_t>& out) {
  out.resize(size_t(std::clamp(K, 0, std::max(n, 0))));
  out.resize(size_t(host.logit_top_k(logits, G, ld, n, K, out.data())));
}

}  // namespace hg
