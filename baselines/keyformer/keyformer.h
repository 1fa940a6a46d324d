// Keyformer's seeded Gumbel noise as free functions (the strategy itself is registered by
// keyformer_info(); its scores are PolicyOps::accumulate_scores with ScoreRule::kGumbelSoftmax).
#pragma once
#include <cstdint>

namespace hg {

class Backend;
class PolicyOps;

// g ~ Gumbel(0, 1) for one (seed, layer, stream, query row position, head, key position): −log(−log u)
// (engine/backend/gumbel.h). The strategy draws from stream 0 for every sequence.
double keyformer_gumbel(uint64_t seed, int layer, int stream, int row, int head, int32_t pos);
// out[i] = keyformer_gumbel(seed, layer, seq, row, head, pos[i]) for i < n, on `host`'s kernel.
void keyformer_gumbel_n(PolicyOps& host, uint64_t seed, int layer, int stream, int row, int head, const int32_t* pos,
                        int32_t n, double* out);

// The modeled cost of Keyformer's score (PolicyOps::ScoreRule::kGumbelSoftmax) per score, in elements of the host backend's
// exp_shift_sum (the unit of a profile's gpu.elem_gops): docs/performance.md, "Tuning choices".
inline constexpr double kKeyformerScoreElems = 19;

}  // namespace hg
