// Synthetic models: random weights from a seed with the real shapes of the paper's models (and
// small ones for tests), so that performance sweeps cost what the real model costs. Values are
// uniform with variance 1/fan_in so activations stay O(1) through depth. Deterministic for a
// given seed regardless of thread count.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "engine/arch/arch.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/decoder/host_estimate.h"
#include "engine/formats/formats.h"
#include "engine/formats/induction.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

HParams shape(const char* arch, int d, int L, int H, int Hkv, int D, int ff, int V, int max_pos, double theta,
              bool tie, float eps = 1e-5f) {
  HParams hp;
  hp.arch = arch;
  hp.d_model = d;
  hp.n_layers = L;
  hp.n_heads = H;
  hp.n_kv_heads = Hkv;
  hp.head_dim = D;
  hp.d_ff = ff;
  hp.n_vocab = V;
  hp.max_pos = max_pos;
  hp.rope_theta = theta;
  hp.tie_embeddings = tie;
  hp.norm_eps = eps;
  hp.rope_style = RopeStyle::kHalf;
  hp.bos_id = 1;
  hp.eos_id = 2;
  if (std::string_view(arch) == "opt") hp.pos_offset = 2;
  return hp;
}

HParams llama3(HParams hp, double factor) {
  hp.rope_scaling.type = "llama3";
  hp.rope_scaling.factor = factor;
  hp.rope_scaling.low_freq_factor = 1.0;
  hp.rope_scaling.high_freq_factor = 4.0;
  hp.rope_scaling.original_max_pos = 8192;
  return hp;
}

std::vector<SyntheticPreset> make_presets() {
  std::vector<SyntheticPreset> p;
  auto add = [&](const char* name, HParams hp) { p.push_back({name, hp.arch, hp, {}}); };
  // Shapes from ../shared/MODELS.md (the models' published config.json).
  add("opt-1.3b", shape("opt", 2048, 24, 32, 32, 64, 8192, 50272, 2048, 0, true));
  add("opt-2.7b", shape("opt", 2560, 32, 32, 32, 80, 10240, 50272, 2048, 0, true));
  add("opt-6.7b", shape("opt", 4096, 32, 32, 32, 128, 16384, 50272, 2048, 0, true));
  add("opt-13b", shape("opt", 5120, 40, 40, 40, 128, 20480, 50272, 2048, 0, true));
  add("llama-3.2-1b", llama3(shape("llama", 2048, 16, 32, 8, 64, 8192, 128256, 131072, 500000, true), 32));
  add("llama-3.2-3b", llama3(shape("llama", 3072, 28, 24, 8, 128, 8192, 128256, 131072, 500000, true), 32));
  add("llama-3.1-8b", llama3(shape("llama", 4096, 32, 32, 8, 128, 14336, 128256, 131072, 500000, false), 8));
  add("qwen2.5-1.5b", shape("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, 32768, 1e6, true, 1e-6f));
  add("qwen2.5-3b", shape("qwen2", 2048, 36, 16, 2, 128, 11008, 151936, 32768, 1e6, true, 1e-6f));
  add("qwen2.5-7b", shape("qwen2", 3584, 28, 28, 4, 128, 18944, 152064, 32768, 1e6, false, 1e-6f));
  add("qwen2.5-14b", shape("qwen2", 5120, 48, 40, 8, 128, 13824, 152064, 32768, 1e6, false, 1e-6f));
  // Beyond the paper's models, for modeled studies (their published config.json).
  add("llama-3.1-70b", llama3(shape("llama", 8192, 80, 64, 8, 128, 28672, 128256, 131072, 500000, false), 8));
  add("mistral-7b", shape("llama", 4096, 32, 32, 8, 128, 14336, 32768, 32768, 1e6, false));
  // llama2.c's stories110M shape (the 110M reference point of docs/performance.md).
  add("stories110m", shape("llama", 768, 12, 12, 12, 64, 2048, 32000, 1024, 10000, false));
  // Small models for tests: odd head dims and GQA ratios on purpose.
  add("tiny-llama", [] {
    HParams hp = llama3(shape("llama", 64, 2, 4, 2, 16, 96, 300, 512, 10000, false), 4);
    hp.rope_scaling.original_max_pos = 64;
    return hp;
  }());
  add("tiny-qwen2", shape("qwen2", 48, 2, 4, 2, 12, 80, 300, 512, 1e6, true, 1e-6f));
  add("tiny-opt", shape("opt", 64, 2, 4, 4, 16, 128, 300, 512, 0, true));
  // Written weights: previous-token and induction heads (induction.h), a model that retrieves.
  p.push_back({"induction", "llama", induction_hparams(), write_induction_model});
  return p;
}

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills w with `offset + scale * U(-1, 1)` from stream (seed, id); chunks are seeded independently.
void fill(Weight& w, uint64_t seed, uint64_t id, float scale, float offset) {
  const int64_t n = w.numel();
  constexpr int64_t kChunk = 1 << 16;
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  const size_t es = dtype_size(w.dtype);
  parallel_for(n_chunks, [&](int64_t c) {
    uint64_t s = seed * 0x100000001b3ull ^ (id << 32) ^ uint64_t(c) * 0x9e3779b97f4a7c15ull;
    const int64_t b = c * kChunk, e = std::min(n, b + kChunk);
    // The chunk as F32, then converted as a row: F16 goes through the hardware converter. Making
    // `synthetic:llama-3.2-1b?dtype=f16` took 11.6 s on 2 threads with one f32_to_f16 call per
    // value, and 2.3 s this way (BF16: 2.5 s, now 0.85 s).
    std::vector<float> v(size_t(e - b));
    for (auto& x : v)
      x = offset + scale * (float(int64_t(splitmix(s) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f);
    from_f32(w.dtype, v.data(), static_cast<char*>(w.buf.data()) + size_t(b) * es, v.size());
  });
}

int parse_int(const ModelSpec& s, const char* key, int dflt) {
  auto it = s.options.find(key);
  if (it == s.options.end()) return dflt;
  int v = 0;
  auto [p, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
  if (ec != std::errc() || p != it->second.data() + it->second.size() || v < 0)
    input_error("synthetic:{}: option {}={} must be a non-negative integer", s.path, key, it->second);
  return v;
}

Model synthetic_load(const ModelSpec& spec, const LoadOptions& opts) {
  check_spec_options(spec, {"layers", "kv_heads", "dtype", "seed", "hidden", "heads", "head_dim", "ffn", "vocab", "max_pos"});
  const SyntheticPreset* preset = nullptr;
  for (auto& p : synthetic_presets())
    if (p.name == spec.path) preset = &p;
  if (!preset) {
    std::string names;
    for (auto& p : synthetic_presets()) names += (names.empty() ? "" : ", ") + p.name;
    input_error("synthetic:{}: unknown preset (expected one of: {})", spec.path, names);
  }
  const Architecture* arch = architectures().by_name(preset->arch);
  Model m;
  m.hp = preset->hp;
  m.traits = arch->traits;
  const int layers = parse_int(spec, "layers", m.hp.n_layers);
  if (layers <= 0) input_error("synthetic:{}: layers must be positive", spec.path);
  m.hp.n_layers = layers;
  // Any other shape of the preset's architecture: hidden size, query heads (head_dim follows
  // hidden / heads unless given), FFN, vocabulary and positions.
  const bool reshaped = spec.options.count("hidden") || spec.options.count("heads") || spec.options.count("head_dim") ||
                        spec.options.count("ffn") || spec.options.count("vocab") || spec.options.count("max_pos");
  if (reshaped && preset->write)
    input_error("synthetic:{}: its weights are written for its own shape; hidden, heads, head_dim, ffn, vocab and "
                "max_pos do not apply",
                spec.path);
  for (auto [key, field] : {std::pair{"hidden", &m.hp.d_model}, {"heads", &m.hp.n_heads}, {"ffn", &m.hp.d_ff},
                            {"vocab", &m.hp.n_vocab}, {"max_pos", &m.hp.max_pos}})
    if (spec.options.count(key)) {
      const int v = parse_int(spec, key, 0);
      if (v <= 0) input_error("synthetic:{}: {} must be positive", spec.path, key);
      *field = v;
    }
  if (spec.options.count("hidden") || spec.options.count("heads")) m.hp.head_dim = m.hp.d_model / std::max(1, m.hp.n_heads);
  if (spec.options.count("head_dim")) m.hp.head_dim = parse_int(spec, "head_dim", 0);
  const bool derived_dim = (spec.options.count("hidden") || spec.options.count("heads")) && !spec.options.count("head_dim");
  if (m.hp.head_dim <= 0 || (derived_dim && m.hp.head_dim * m.hp.n_heads != m.hp.d_model))
    input_error("synthetic:{}: hidden {} is not heads {} × a head dimension (give head_dim)", spec.path, m.hp.d_model,
                m.hp.n_heads);
  if (spec.options.count("heads") && !spec.options.count("kv_heads") && std::string_view(preset->arch) == "opt")
    m.hp.n_kv_heads = m.hp.n_heads;
  if (m.hp.n_kv_heads > m.hp.n_heads || m.hp.n_heads % m.hp.n_kv_heads != 0) m.hp.n_kv_heads = m.hp.n_heads;
  // Grouped-query attention with another KV head count (a divisor of the query heads).
  const int kv_heads = parse_int(spec, "kv_heads", m.hp.n_kv_heads);
  if (kv_heads <= 0 || m.hp.n_heads % kv_heads != 0)
    input_error("synthetic:{}: kv_heads={} must divide the {} query heads", spec.path, kv_heads, m.hp.n_heads);
  if (kv_heads != m.hp.n_kv_heads && std::string_view(preset->arch) == "opt")
    input_error("synthetic:{}: kv_heads: OPT has one KV head per query head", spec.path);
  m.hp.n_kv_heads = kv_heads;
  const uint64_t seed = uint64_t(parse_int(spec, "seed", 1234));
  DType dt = default_weight_dtype(DType::kF32, opts);
  if (spec.options.count("dtype") && !parse_dtype(spec.options.at("dtype"), &dt))
    input_error("synthetic:{}: dtype={} (expected f32, f16 or bf16)", spec.path, spec.options.at("dtype"));
  m.weight_dtype = dt;
  m.source_dtype = std::string(dtype_name(dt));
  // The maxima every file format obeys, then the weights' bytes against the machine, before any is made.
  validate_hparams(m.hp, "synthetic:" + spec.path);
  const bool written = preset->write && !opts.phantom_weights;
  if (!opts.phantom_weights) {
    auto bytes_of = [&](auto slots) {
      double b = 0;
      for (auto slot : slots) {
        double n = double(slot_is_matrix(slot) && !written ? dtype_size(dt) : 4);
        for (int64_t d : slot_shape(slot, m.hp)) n *= double(d);
        b += n;
      }
      return b;
    };
    const double bytes = bytes_of(global_slots(m.traits, m.hp.tie_embeddings)) +
                         bytes_of(layer_slots(m.traits)) * double(m.hp.n_layers);
    require_host_memory({int64_t(std::min(bytes, 9.0e18)), fmt::format("{} layers of weights", m.hp.n_layers)},
                        "synthetic:" + spec.path);
  }
  uint64_t id = 0;
  auto make = [&](auto slot, Weight& w) {
    const auto sh = slot_shape(slot, m.hp);
    const bool matrix = slot_is_matrix(slot);
    w = make_weight(matrix && !written ? dt : DType::kF32, sh, opts.phantom_weights);
    if (opts.phantom_weights) return;
    if (written) {  // zero, norm weights one; the preset writes the rest, then matrices take dt
      const std::string_view name = slot_name(slot);
      const bool norm = name.find("norm") != std::string_view::npos && name.find("bias") == std::string_view::npos;
      std::fill_n(static_cast<float*>(w.buf.data()), w.numel(), norm ? 1.0f : 0.0f);
      return;
    }
    const std::string_view name = slot_name(slot);
    float scale = 0.1f, offset = 0.0f;
    if (name.find("norm") != std::string_view::npos && name.find("bias") == std::string_view::npos) offset = 1.0f;
    else if (name == "tok_embd" || name == "output") scale = 1.0f;
    else if (name == "pos_embd") scale = 0.5f;
    else if (matrix) scale = std::sqrt(3.0f / float(sh[1]));
    if (name == "output") scale = std::sqrt(3.0f / float(sh[1]));
    fill(w, seed, id++, scale, offset);
  };
  for (auto s : global_slots(m.traits, m.hp.tie_embeddings)) make(s, m[s]);
  m.layers.resize(size_t(m.hp.n_layers));
  for (auto& l : m.layers)
    for (auto s : layer_slots(m.traits)) make(s, l[s]);
  if (written) {
    preset->write(m);
    auto to_dt = [&](auto slot, Weight& w) {
      if (slot_is_matrix(slot) && dt != DType::kF32) w = convert_weight(DType::kF32, w.buf.data(), dt, w.shape);
    };
    for (auto s : global_slots(m.traits, m.hp.tie_embeddings)) to_dt(s, m[s]);
    for (auto& l : m.layers)
      for (auto s : layer_slots(m.traits)) to_dt(s, l[s]);
  }
  m.tokenizer = make_byte_tokenizer(m.hp.n_vocab);
  m.source = "synthetic:" + spec.path;
  return m;
}

bool synthetic_probe(const std::string&) { return false; }

}  // namespace

const std::vector<SyntheticPreset>& synthetic_presets() {
  static const std::vector<SyntheticPreset> p = make_presets();
  return p;
}

ModelFormat synthetic_format() {
  return {"synthetic",
          "random weights with a preset's real shapes: synthetic:<preset>[?layers=N&kv_heads=N&dtype=bf16&seed=S], any "
          "other shape of its architecture with hidden, heads, head_dim, ffn, vocab, max_pos",
          synthetic_probe, synthetic_load};
}

}  // namespace hg
