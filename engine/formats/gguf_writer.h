// GGUF v3 writer for `hgbench export`: one random-weights file that both hgbench and llama.cpp
// load, so the two engines can be compared on the same bytes. Llama-architecture models
// only; matrices in the model's weight type (F32, F16, BF16), norms F32. RoPE follows llama.cpp's
// convention: rotate-half models get their q/k rows permuted to interleaved pairs, and Llama-3
// scaling is written as rope_freqs.weight. The vocabulary is a generated SentencePiece-style one
// (<unk>, <s>, </s>, 256 byte pieces, then placeholder pieces): the weights are random, so the
// text is meaningless anyway, and llama.cpp needs a vocabulary of n_vocab entries.
#pragma once
#include <string>

#include "engine/core/model.h"

namespace hg {

// Writes `m` to `path` (through `path`.tmp and a rename: a failure leaves no partial file).
// Throws UnsupportedError for architectures other than llama, InputError for I/O errors.
void write_gguf(const Model& m, const std::string& path);

}  // namespace hg
