// Logit top-K: the K positions whose score, the largest logit over a group of G query heads, is
// highest. HybridGen's `post` mode (over the offloaded keys) and InfiniGen's speculative fetch (over
// all cached keys) select this way, per KV head, on every decode step and layer.
#pragma once
#include <cstdint>
#include <vector>

namespace hg {

// Positions of the K highest scores, score(t) = max over h < G of logits[h * ld + t], t < n, in
// increasing order. Ties go to the lower position; NaN logits are ignored (a position whose G
// logits are all NaN scores -inf). K ≥ n gives every position, K ≤ 0 none.
//
// The K-th score comes from the candidates that pass a lower bound taken from a strided sample of
// 1024 scores (about 2K pass); positions are then taken in order. A sample that lets fewer than K
// pass (structured scores) only costs a second pass with every position a candidate. No sort.
void logit_top_k(const float* logits, int G, int64_t ld, int32_t n, int32_t K, std::vector<int32_t>& out);

// The slow reference logit_top_k is tested and benchmarked against: std::nth_element over
// (−score, position) pairs, then a sort of the K positions (what the strategies ran before).
void logit_top_k_reference(const float* logits, int G, int64_t ld, int32_t n, int32_t K,
                           std::vector<int32_t>& out);

}  // namespace hg
