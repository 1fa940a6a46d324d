// GGUF v3 writer. Layout (gguf spec): header (magic, version, tensor count, kv count), key-values,
// tensor infos (name, dims in ggml order, type, offset from the data start), padding to the
// alignment, tensor data (each tensor aligned).
#include "engine/formats/gguf_writer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/arch/arch.h"
#include "engine/backend/backend.h"
#include "engine/core/atomic_file.h"
#include "engine/core/error.h"
#include "engine/formats/gguf.h"

namespace hg {
namespace {

constexpr uint64_t kAlign = 32;

class Out {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f32(float v) { raw(&v, 4); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  void pad() { buf_.append(size_t((kAlign - buf_.size() % kAlign) % kAlign), '\0'); }
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

struct Kv {
  std::string key;
  std::function<void(Out&)> write;  // type tag and value
};

Kv kv_u32(std::string k, uint32_t v) {
  return {std::move(k), [v](Out& o) { o.u32(GgufFile::kU32), o.u32(v); }};
}
Kv kv_f32(std::string k, float v) {
  return {std::move(k), [v](Out& o) { o.u32(GgufFile::kF32), o.f32(v); }};
}
Kv kv_str(std::string k, std::string v) {
  return {std::move(k), [v](Out& o) { o.u32(GgufFile::kString), o.str(v); }};
}
Kv kv_bool(std::string k, bool v) {
  return {std::move(k), [v](Out& o) {
            o.u32(GgufFile::kBool);
            const uint8_t b = v ? 1 : 0;
            o.raw(&b, 1);
          }};
}

uint32_t ggml_type(DType t) {
  switch (t) {
    case DType::kF32: return GgufFile::kTF32;
    case DType::kF16: return GgufFile::kTF16;
    case DType::kBF16: return GgufFile::kTBF16;
  }
  return GgufFile::kTF32;
}

struct TensorOut {
  std::string name;
  const Weight* w = nullptr;
  int permute_heads = 0;  // > 0: rotate-half rows → interleaved pairs, per head of D rows
};

}  // namespace

void write_gguf(const Model& m, const std::string& path) {
  const HParams& hp = m.hp;
  if (hp.arch != "llama")
    throw UnsupportedError(fmt::format("export: architecture '{}' is not supported (llama only)", hp.arch));
  if (hp.n_vocab < 259) throw UnsupportedError(fmt::format("export: vocabulary of {} < 259 entries", hp.n_vocab));
  const std::string a = "llama.";
  const int D = hp.head_dim;

  // Generated vocabulary: <unk>, <s>, </s>, <0x00>…<0xFF>, then placeholders.
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  auto add = [&](std::string t, float s, int32_t ty) {
    tokens.push_back(std::move(t)), scores.push_back(s), types.push_back(ty);
  };
  add("<unk>", 0, 2), add("<s>", 0, 3), add("</s>", 0, 3);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, 6);
  for (int i = int(tokens.size()); i < hp.n_vocab; ++i) add(fmt::format("\xe2\x96\x81t{}", i), -float(i), 1);

  std::vector<Kv> kvs = {
      kv_str("general.architecture", "llama"),
      kv_str("general.name", "hgbench export of " + m.source),
      kv_u32("general.alignment", uint32_t(kAlign)),
      kv_u32("general.file_type", m.weight_dtype == DType::kF32 ? 0u : m.weight_dtype == DType::kF16 ? 1u : 32u),
      kv_u32(a + "context_length", uint32_t(hp.max_pos)),
      kv_u32(a + "embedding_length", uint32_t(hp.d_model)),
      kv_u32(a + "block_count", uint32_t(hp.n_layers)),
      kv_u32(a + "feed_forward_length", uint32_t(hp.d_ff)),
      kv_u32(a + "attention.head_count", uint32_t(hp.n_heads)),
      kv_u32(a + "attention.head_count_kv", uint32_t(hp.n_kv_heads)),
      kv_u32(a + "attention.key_length", uint32_t(D)),
      kv_u32(a + "attention.value_length", uint32_t(D)),
      kv_u32(a + "rope.dimension_count", uint32_t(D)),
      kv_f32(a + "rope.freq_base", float(hp.rope_theta)),
      kv_f32(a + "attention.layer_norm_rms_epsilon", hp.norm_eps),
      kv_u32(a + "vocab_size", uint32_t(hp.n_vocab)),
      kv_str("tokenizer.ggml.model", "llama"),
      {"tokenizer.ggml.tokens",
       [&](Out& o) {
         o.u32(GgufFile::kArray), o.u32(GgufFile::kString), o.u64(tokens.size());
         for (auto& t : tokens) o.str(t);
       }},
      {"tokenizer.ggml.scores",
       [&](Out& o) {
         o.u32(GgufFile::kArray), o.u32(GgufFile::kF32), o.u64(scores.size());
         for (float s : scores) o.f32(s);
       }},
      {"tokenizer.ggml.token_type",
       [&](Out& o) {
         o.u32(GgufFile::kArray), o.u32(GgufFile::kI32), o.u64(types.size());
         for (int32_t t : types) o.i32(t);
       }},
      kv_u32("tokenizer.ggml.unknown_token_id", 0),
      kv_u32("tokenizer.ggml.bos_token_id", 1),
      kv_u32("tokenizer.ggml.eos_token_id", 2),
      kv_bool("tokenizer.ggml.add_bos_token", true),
  };

  // Llama-3 frequency scaling as llama.cpp expects it: factors dividing the base frequencies.
  Weight rope_freqs;
  if (!hp.rope_scaling.type.empty()) {
    const RopeTable scaled = make_rope_table(hp, {});
    std::vector<float> f(static_cast<size_t>(D / 2));
    for (int i = 0; i < D / 2; ++i) {
      const double base = std::pow(hp.rope_theta, -2.0 * i / D);
      f[size_t(i)] = float(base / scaled.inv_freq[size_t(i)]);
    }
    rope_freqs = convert_weight(DType::kF32, f.data(), DType::kF32, {int64_t(D / 2)});
  }

  std::vector<TensorOut> ts;
  for (auto s : global_slots(m.traits, hp.tie_embeddings)) ts.push_back({gguf_tensor_name(s), &m[s], 0});
  if (!rope_freqs.empty()) ts.push_back({"rope_freqs.weight", &rope_freqs, 0});
  const bool permute = hp.rope_style == RopeStyle::kHalf;
  for (int l = 0; l < hp.n_layers; ++l)
    for (auto s : layer_slots(m.traits)) {
      const int heads = !permute ? 0 : s == Slot::kWq ? hp.n_heads : s == Slot::kWk ? hp.n_kv_heads : 0;
      ts.push_back({gguf_tensor_name(s, l), &m.layers[size_t(l)][s], heads});
    }

  Out o;
  o.raw("GGUF", 4);
  o.u32(3);
  o.u64(ts.size());
  o.u64(kvs.size());
  for (auto& kv : kvs) {
    o.str(kv.key);
    kv.write(o);
  }
  uint64_t off = 0;
  for (auto& t : ts) {
    o.str(t.name);
    const auto& shape = t.w->shape;
    o.u32(uint32_t(shape.size()));
    for (auto it = shape.rbegin(); it != shape.rend(); ++it) o.u64(uint64_t(*it));  // ggml order
    o.u32(ggml_type(t.w->dtype));
    o.u64(off);
    off += (t.w->bytes() + kAlign - 1) / kAlign * kAlign;
  }
  o.pad();

  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    input_error("export: {} is a directory; give the name of the GGUF file to write", path);
  // Written beside its name and renamed into place (engine/core/atomic_file.h): whole or absent.
  AtomicFile f(path);
  const auto put = [&](const char* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f.file()) != n)
      throw IoError(fmt::format("{}: write failed (disk full?); nothing written", path));
  };
  put(o.bytes().data(), o.bytes().size());
  static const char zeros[kAlign] = {};
  for (auto& t : ts) {
    const char* p = static_cast<const char*>(t.w->buf.data());
    const size_t bytes = t.w->bytes();
    if (t.permute_heads > 0) {
      // GGUF row (h, 2i + j) = HF row (h, i + j·D/2): rotate-half pairs become adjacent.
      const size_t row = bytes / size_t(t.w->rows());
      for (int h = 0; h < t.permute_heads; ++h)
        for (int r = 0; r < D; ++r) {
          const int src = h * D + (r / 2) + (r % 2) * (D / 2);
          put(p + size_t(src) * row, row);
        }
    } else {
      put(p, bytes);
    }
    put(zeros, (kAlign - bytes % kAlign) % kAlign);
  }
  f.commit();
}

}  // namespace hg
