// The speculative query.
#include "baselines/speculation.h"

namespace hg {

void speculative_query(Backend& be, const Model& m, int norm_layer, int layer, const float* x, int64_t M,
                       const int32_t* pos, const RopeTable* rope, float* h, float* q) {
  const LayerWeights& n = m.layers[size_t(norm_layer)];
  const LayerWeights& w = m.layers[size_t(layer)];
  const int64_t d = m.hp.d_model;
  if (m.traits.norm == NormKind::kRms)
    be.rms_norm(x, n[Slot::kAttnNorm].f32(), M, d, m.hp.norm_eps, h);
  else
    be.layer_norm(x, n[Slot::kAttnNorm].f32(), n[Slot::kAttnNormB].f32(), M, d, m.hp.norm_eps, h);
  be.matmul(h, M, w[Slot::kWq], w[Slot::kBq].empty() ? nullptr : w[Slot::kBq].f32(), q);
  if (rope) be.rope(q, M, m.hp.n_heads, m.hp.head_dim, pos, *rope);
}

}  // namespace hg
