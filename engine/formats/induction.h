// The `synthetic:induction` preset (induction.cpp): a Llama whose weights are written so that it
// copies what followed an earlier occurrence of its last six tokens — a model that can retrieve.
#pragma once
#include "engine/core/model.h"

namespace hg {

HParams induction_hparams();
// Writes the weights of a model of induction_hparams()' shapes whose weights are F32 and zero
// (norm weights one). InputError if the shape was changed (kv_heads, fewer than 2 layers).
void write_induction_model(Model& m);

}  // namespace hg
