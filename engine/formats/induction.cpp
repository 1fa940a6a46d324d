// The `synthetic:induction` preset: a two-layer Llama whose weights are written, not drawn, so that
// it retrieves. Layer 0's heads 0-5 are previous-token heads: head h writes the code of the token
// h + 1 positions back into a subspace of its own (its query and key are constants that RoPE's
// fastest rotations turn into a score peaked at that offset). Layer 1's head 0 is an induction
// head: it matches the last kGram tokens (the current one and the five before it) against the
// kGram tokens before every earlier position, in the dimensions RoPE leaves unrotated, and copies
// the token at the best match into the subspace the LM head reads. The FFNs are zero. It
// continues any repeated byte sequence whose preceding kGram bytes occur once before: a passkey.
#include "engine/formats/induction.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/core/error.h"

namespace hg {
namespace {

constexpr int kVocab = 259;        // the byte tokenizer: 3 specials + 256 bytes
constexpr int kModel = 384;        // residual width
constexpr int kHeads = 8, kHeadDim = 256;
constexpr int kGram = 6;           // tokens matched by the induction head
constexpr int kCode = 34;          // dimensions of a token's code
constexpr int kPosPairs = 24;      // RoPE pairs 0..23 carry the position; the rest barely rotate
constexpr double kTheta = 1e30;    // RoPE base: pair 24 turns 0.078 rad over 32K positions
constexpr int kMinDistance = 10;   // Hamming distance between any two codes
// Residual layout: dimension 0 is a constant; then the token's code; then the codes of the tokens
// 1..kGram back (layer 0's heads); then the copied code (layer 1's head 0), which the LM head reads.
constexpr int kConst = 0;
constexpr int tok_dim(int c) { return 1 + c; }
constexpr int prev_dim(int back, int c) { return 1 + back * kCode + c; }  // back = 1..kGram
constexpr int out_dim(int c) { return 1 + (kGram + 1) * kCode + c; }
static_assert(out_dim(kCode - 1) < kModel);
static_assert(2 * (kHeadDim / 2 - kPosPairs) >= kGram * kCode);
// Score scales (logit margins of about 30 against the nearest rival, docs/accuracy.md).
constexpr double kPosAmp = 26;     // previous-token heads' query and key amplitude
constexpr double kMatchAmp = 28.5; // induction head's query and key amplitude
constexpr double kOutGain = 5;     // LM head

// ±1/√kCode codes, kMinDistance apart: drawn from a fixed stream, each kept if far from all before.
std::vector<std::vector<float>> token_codes() {
  std::mt19937_64 rng(0x1d0c7105u);
  std::vector<std::vector<int>> bits;
  while (int(bits.size()) < kVocab) {
    std::vector<int> b(kCode);
    for (int& x : b) x = int(rng() & 1);
    bool far = true;
    for (const auto& o : bits) {
      int d = 0;
      for (int c = 0; c < kCode; ++c) d += b[size_t(c)] != o[size_t(c)];
      far = far && d >= kMinDistance;
    }
    if (far) bits.push_back(std::move(b));
  }
  std::vector<std::vector<float>> codes(kVocab, std::vector<float>(kCode));
  for (int t = 0; t < kVocab; ++t)
    for (int c = 0; c < kCode; ++c) codes[size_t(t)][size_t(c)] = float((bits[size_t(t)][size_t(c)] ? 1 : -1) / std::sqrt(double(kCode)));
  return codes;
}

float* f32(Weight& w) {
  HG_CHECK(w.dtype == DType::kF32);
  return static_cast<float*>(w.buf.data());
}

// The dimensions of head-local pair p: p and p + D/2 (RoPE's half style).
int content_dim(int slot, int c) {  // slot 0..kGram-1, c < kCode: the unrotated dimensions in order
  const int k = slot * kCode + c, pairs = kHeadDim / 2 - kPosPairs;
  return k < pairs ? kPosPairs + k : kHeadDim / 2 + kPosPairs + (k - pairs);
}

}  // namespace

HParams induction_hparams() {
  HParams hp;
  hp.arch = "llama";
  hp.d_model = kModel;
  hp.n_layers = 2;
  hp.n_heads = kHeads;
  hp.n_kv_heads = kHeads;
  hp.head_dim = kHeadDim;
  hp.d_ff = 64;
  hp.n_vocab = kVocab;
  hp.max_pos = 131072;
  hp.rope_theta = kTheta;
  hp.tie_embeddings = false;
  hp.norm_eps = 1e-6f;
  hp.rope_style = RopeStyle::kHalf;
  hp.bos_id = 1;
  hp.eos_id = 2;
  return hp;
}

void write_induction_model(Model& m) {
  const HParams& hp = m.hp;
  if (hp.d_model != kModel || hp.head_dim != kHeadDim || hp.n_heads != kHeads || hp.n_kv_heads != kHeads ||
      hp.n_vocab != kVocab || hp.n_layers < 2)
    input_error("synthetic:induction: its weights are written for its own shape (kv_heads and layers < 2 change it)");
  const auto codes = token_codes();
  const int D = kHeadDim, half = D / 2;
  // RMSNorm divides by the rms over kModel: the embedding's norm² is 2 (constant + unit code);
  // after layer 0 it is about 2 + kGram (each copied code a unit vector).
  const double in0 = std::sqrt(kModel / 2.0), in1 = std::sqrt(kModel / double(2 + kGram));
  float* emb = f32(m[GlobalSlot::kTokEmbd]);
  for (int t = 0; t < kVocab; ++t) {
    emb[int64_t(t) * kModel + kConst] = 1;
    for (int c = 0; c < kCode; ++c) emb[int64_t(t) * kModel + tok_dim(c)] = codes[size_t(t)][size_t(c)];
  }
  // Layer 0: head h = back - 1. q·k = A² Σ_p cos(θ_p (m − n − back)) over the position pairs.
  {
    LayerWeights& L = m.layers[0];
    float *wq = f32(L[Slot::kWq]), *wk = f32(L[Slot::kWk]), *wv = f32(L[Slot::kWv]), *wo = f32(L[Slot::kWo]);
    for (int back = 1; back <= kGram; ++back) {
      const int h = back - 1;
      for (int p = 0; p < kPosPairs; ++p) {
        const double th = std::pow(kTheta, -2.0 * p / D);
        wq[int64_t(h * D + p) * kModel + kConst] = float(kPosAmp * std::cos(th * back) / in0);
        wq[int64_t(h * D + p + half) * kModel + kConst] = float(-kPosAmp * std::sin(th * back) / in0);
        wk[int64_t(h * D + p) * kModel + kConst] = float(kPosAmp / in0);
      }
      for (int c = 0; c < kCode; ++c) {
        wv[int64_t(h * D + c) * kModel + tok_dim(c)] = float(1 / in0);        // the token's code
        wo[int64_t(prev_dim(back, c)) * (kHeads * D) + h * D + c] = 1.0f;     // to its subspace
      }
    }
  }
  // Layer 1, head 0: query slot s holds the code of the token s back (0: the current one), key slot
  // s the code of the token s + 1 back; the value is the token's own code, written to the output.
  {
    LayerWeights& L = m.layers[1];
    float *wq = f32(L[Slot::kWq]), *wk = f32(L[Slot::kWk]), *wv = f32(L[Slot::kWv]), *wo = f32(L[Slot::kWo]);
    for (int s = 0; s < kGram; ++s)
      for (int c = 0; c < kCode; ++c) {
        const int row = content_dim(s, c);
        wq[int64_t(row) * kModel + (s == 0 ? tok_dim(c) : prev_dim(s, c))] = float(kMatchAmp / in1);
        wk[int64_t(row) * kModel + prev_dim(s + 1, c)] = float(kMatchAmp / in1);
      }
    for (int c = 0; c < kCode; ++c) {
      wv[int64_t(c) * kModel + tok_dim(c)] = float(1 / in1);
      wo[int64_t(out_dim(c)) * (kHeads * D) + c] = 1.0f;
    }
  }
  // The LM head: each token's code over the output subspace (the final norm's scale folded in).
  const double in2 = std::sqrt(kModel / double(3 + kGram));
  float* out = f32(m[GlobalSlot::kOutput]);
  for (int t = 0; t < kVocab; ++t)
    for (int c = 0; c < kCode; ++c)
      out[int64_t(t) * kModel + out_dim(c)] = float(kOutGain * codes[size_t(t)][size_t(c)] * std::sqrt(double(kCode)) / in2);
}

}  // namespace hg
