// The speculative query HybridGen and InfiniGen build for layer i+1 while layer i runs: from layer
// i's residual input, a norm, layer i+1's W_q (+ bias) and RoPE at each row's position.
#pragma once
#include <cstdint>

#include "engine/backend/backend.h"
#include "engine/core/model.h"

namespace hg {

// x [M, d_model] → q [M, H·D] on `be`, with the attention norm of layer `norm_layer` (HybridGen
// takes layer's own, as the paper's Figure 12 does; InfiniGen layer − 1's, the input layer i's
// attention saw) and W_q of `layer`. h is [M, d_model] scratch; x, h and q are in be's memory; pos
// is a host array; rope null for learned positions.
void speculative_query(Backend& be, const Model& m, int norm_layer, int layer, const float* x, int64_t M,
                       const int32_t* pos, const RopeTable* rope, float* h, float* q);

}  // namespace hg
