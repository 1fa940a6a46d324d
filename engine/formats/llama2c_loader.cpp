// llama2.c legacy .bin loader: 7 × i32 header (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size — negative means an unshared classifier follows — seq_len), then F32 weights in
// run.c's order, with its tokenizer.bin (`?tokenizer=PATH`, else tok<V>.bin or tokenizer.bin
// next to the model).
#include <filesystem>

#include "engine/arch/arch.h"
#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/formats/formats.h"
#include "engine/tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace hg {
namespace {

bool llama2c_probe(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && fs::path(path).extension() == ".bin";
}

Model llama2c_load(const ModelSpec& spec, const LoadOptions& opts) {
  check_spec_options(spec, {"tokenizer", "load"});
  const WeightLoad how = weight_load_option(spec);
  const auto file = std::make_shared<const MappedFile>(spec.path);
  const MappedFile& f = *file;
  ByteReader r(f);
  int32_t h[7];
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) h[i] = r.read<int32_t>(names[i]);
  // Checked before use (vocab_size's sign says whether the classifier is shared).
  for (int i = 0; i < 7; ++i)
    if (h[i] == 0 || (i != 5 && h[i] < 0) || std::abs(int64_t(h[i])) > (1 << 24))
      input_error("{}: header field {} = {} is invalid", spec.path, names[i], h[i]);
  Model m;
  m.hp.arch = "llama";
  const Architecture* arch = architectures().by_name("llama");
  m.traits = arch->traits;
  m.hp.d_model = h[0];
  m.hp.d_ff = h[1];
  m.hp.n_layers = h[2];
  m.hp.n_heads = h[3];
  m.hp.n_kv_heads = h[4];
  const bool shared = h[5] > 0;
  m.hp.n_vocab = shared ? h[5] : -h[5];
  m.hp.max_pos = h[6];
  m.hp.head_dim = m.hp.n_heads > 0 ? m.hp.d_model / m.hp.n_heads : 0;
  m.hp.norm_eps = 1e-5f;
  m.hp.rope_theta = 10000.0;
  m.hp.rope_style = RopeStyle::kInterleaved;
  m.hp.tie_embeddings = shared;
  m.hp.bos_id = 1;
  m.hp.eos_id = 2;
  validate_hparams(m.hp, spec.path);
  if (m.hp.head_dim * m.hp.n_heads != m.hp.d_model)
    input_error("{}: dim {} is not a multiple of n_heads {}", spec.path, m.hp.d_model, m.hp.n_heads);

  const int64_t d = m.hp.d_model, L = m.hp.n_layers, V = m.hp.n_vocab, ff = m.hp.d_ff,
                kvd = int64_t(m.hp.n_kv_heads) * m.hp.head_dim, T = m.hp.max_pos, hd = m.hp.head_dim;
  // In 128 bits: each field is below 2^24, so a product of three is below 2^72.
  __extension__ typedef unsigned __int128 u128;
  const u128 n_floats = u128(V) * d + u128(L) * d + u128(L) * d * d + u128(2) * L * kvd * d + u128(L) * d * d +
                        u128(L) * d + u128(3) * L * ff * d + u128(d) + u128(T) * hd +
                        (shared ? 0 : u128(V) * d);  // freq_cis real+imag: T * hd/2 each
  const u128 expect128 = 28 + n_floats * 4;
  const uint64_t expect = expect128 > u128(UINT64_MAX) ? UINT64_MAX : uint64_t(expect128);
  if (f.size() != expect)
    input_error("{}: file has {} bytes but the header (dim {}, layers {}, vocab {}{}) implies {}", spec.path, f.size(),
                d, L, V, shared ? ", shared classifier" : "", expect);
  m.weight_dtype = default_weight_dtype(DType::kF32, opts);
  m.source_dtype = "f32";
  uint64_t off = 28;
  auto take = [&](std::vector<int64_t> shape, bool matrix) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    Weight w = load_tensor(file, off, DType::kF32, matrix ? m.weight_dtype : DType::kF32, std::move(shape), how);
    off += uint64_t(n) * 4;
    return w;
  };
  m.layers.resize(size_t(L));
  m[GlobalSlot::kTokEmbd] = take({V, d}, true);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kAttnNorm] = take({d}, false);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kWq] = take({d, d}, true);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kWk] = take({kvd, d}, true);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kWv] = take({kvd, d}, true);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kWo] = take({d, d}, true);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kFfnNorm] = take({d}, false);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kWGate] = take({ff, d}, true);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kWDown] = take({d, ff}, true);
  for (int64_t l = 0; l < L; ++l) m.layers[size_t(l)][Slot::kWUp] = take({ff, d}, true);
  m[GlobalSlot::kOutNorm] = take({d}, false);
  off += uint64_t(T * hd) * 4;  // legacy RoPE tables (run.c recomputes them)
  if (!shared) m[GlobalSlot::kOutput] = take({V, d}, true);

  std::string tok_path;
  if (spec.options.count("tokenizer")) {
    tok_path = spec.options.at("tokenizer");
  } else {
    const fs::path dir = fs::path(spec.path).parent_path();
    for (auto cand : {dir / ("tok" + std::to_string(V) + ".bin"), dir / "tokenizer.bin"})
      if (fs::exists(cand)) {
        tok_path = cand.string();
        break;
      }
    if (tok_path.empty())
      input_error("{}: no tokenizer: pass ?tokenizer=PATH or put tok{}.bin or tokenizer.bin next to it", spec.path, V);
  }
  m.tokenizer = load_llama2c_tokenizer(tok_path, int(V));
  m.source = spec.path;
  return m;
}

}  // namespace

ModelFormat llama2c_format() {
  return {"llama2c", "llama2.c legacy .bin (F32) with its tokenizer.bin (?tokenizer=PATH)", llama2c_probe,
          llama2c_load};
}

}  // namespace hg
