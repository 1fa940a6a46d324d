// Golden runs on real checkpoints: greedy generation from BOS with stories260K in three formats
// reproduces the 256 reference ids; prompted generation agrees across formats; quantized and
// half-precision GGUF copies (made here) stay close to F32.
#include <nlohmann/json.hpp>

#include "baselines/full/full.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/formats/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "test_util.h"

namespace hg {
namespace {

const char* kGguf = "models/stories260K/stories260K.gguf";
const char* kBin = "models/stories260K/stories260K.bin";
const char* kHf = "models/stories260K-hf";

std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int n, const char* backend = "cpu") {
  auto be = make_backend(backend);
  FullStrategy kv(*be);
  GenerateOptions o;
  o.n_new = n;
  o.stop_at_eos = false;
  return generate(m, *be, kv, {prompt}, o).tokens[0];
}

std::vector<int32_t> reference_ids() {
  auto j = nlohmann::json::parse(test::read_file(test::shared_path("models/stories260K/reference_greedy_bos_256.json")));
  return j["generated_ids"].get<std::vector<int32_t>>();
}

class Golden : public ::testing::TestWithParam<const char*> {};

TEST_P(Golden, GreedyFromBosReproducesReference256) {
  HG_REQUIRE_SHARED(GetParam());
  const auto ref = reference_ids();
  ASSERT_EQ(ref.size(), 256u);
  Model m = load_model(test::shared_path(GetParam()));
  EXPECT_EQ(greedy(m, {1}, 256), ref);
}

INSTANTIATE_TEST_SUITE_P(Formats, Golden, ::testing::Values(kGguf, kBin, kHf), [](const auto& i) {
  return std::string(i.index == 0 ? "gguf" : i.index == 1 ? "llama2c" : "hf");
});

TEST(Golden, PromptedGenerationAgreesAcrossFormats) {
  HG_REQUIRE_SHARED(kHf);
  const std::string prompt = "Lily and Tom went to the park. They saw";
  std::vector<std::vector<int32_t>> outs;
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : {kGguf, kBin, kHf}) {
    Model m = load_model(test::shared_path(p));
    prompts.push_back(m.tokenizer->encode_prompt(prompt));
    outs.push_back(greedy(m, prompts.back(), 48));
  }
  EXPECT_EQ(prompts[0], prompts[1]);
  EXPECT_EQ(prompts[0], prompts[2]);
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

TEST(Golden, RefBackendReproducesReferencePrefix) {
  HG_REQUIRE_SHARED(kGguf);
  const auto ref = reference_ids();
  Model m = load_model(test::shared_path(kGguf));
  const auto got = greedy(m, {1}, 64, "ref");
  EXPECT_EQ(got, std::vector<int32_t>(ref.begin(), ref.begin() + 64));
}

// Writes a copy of a GGUF file with every 2-D tensor stored as `type` (F16, BF16 or Q8_0).
std::string rewrite_gguf(const std::string& src, uint32_t type, const std::string& dst) {
  GgufFile f(src);
  // Header and key-values are copied byte for byte; the tensor directory and data are rebuilt.
  std::string head;
  auto put = [&](const void* p, size_t n) { head.append(static_cast<const char*>(p), n); };
  const uint32_t magic = 0x46554747u, version = 3;
  const uint64_t n_t = f.tensors().size();
  std::string kv_blob;
  {
    // Copy the raw kv section: it starts at byte 24 and ends where the first tensor name's length
    // field begins; find it by searching for the first tensor's name.
    const std::string raw = test::read_file(src);
    const std::string& first = f.tensors()[0].name;
    size_t at = raw.find(first, 24);
    kv_blob = raw.substr(24, at - 8 - 24);
    uint64_t n_kv;
    std::memcpy(&n_kv, raw.data() + 16, 8);
    put(&magic, 4);
    put(&version, 4);
    put(&n_t, 8);
    put(&n_kv, 8);
    head += kv_blob;
  }
  std::string data;
  for (auto& t : f.tensors()) {
    const uint64_t nlen = t.name.size();
    put(&nlen, 8);
    head += t.name;
    const uint32_t nd = uint32_t(t.ne.size());
    put(&nd, 4);
    for (auto d : t.ne) put(&d, 8);
    Weight w = f.load(t, DType::kF32);
    const float* x = w.f32();
    const int64_t n = w.numel();
    // Q8_0 needs rows of 32 (llama.cpp keeps other tensors in a float type too).
    const bool ok = t.ne.size() == 2 && (type != GgufFile::kTQ8_0 || t.ne[0] % 32 == 0);
    const uint32_t tt = ok ? type : uint32_t(GgufFile::kTF32);
    put(&tt, 4);
    while (data.size() % 32) data.push_back('\0');
    const uint64_t off = data.size();
    put(&off, 8);
    if (tt == GgufFile::kTF32) {
      data.append(reinterpret_cast<const char*>(x), size_t(n) * 4);
    } else if (tt == GgufFile::kTF16 || tt == GgufFile::kTBF16) {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = tt == GgufFile::kTF16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    } else {  // Q8_0: per 32 values, d = max|x| / 127, q = round(x / d)
      for (int64_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        for (int k = 0; k < 32; ++k) amax = std::max(amax, std::abs(x[b * 32 + k]));
        const float d = amax / 127.0f;
        const uint16_t dh = f32_to_f16(d);
        data.append(reinterpret_cast<const char*>(&dh), 2);
        for (int k = 0; k < 32; ++k) {
          const int8_t q = int8_t(d > 0 ? std::lround(x[b * 32 + k] / d) : 0);
          data.push_back(char(q));
        }
      }
    }
  }
  while (head.size() % 32) head.push_back('\0');
  test::write_file(dst, head + data);
  return dst;
}

class GgufTypes : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufTypes, HalfAndQ8CopiesStayCloseToF32) {
  HG_REQUIRE_SHARED(kGguf);
  const uint32_t type = GetParam();
  const std::string path = rewrite_gguf(test::shared_path(kGguf), type,
                                        test::temp_path("stories_" + GgufFile::type_name(type) + ".gguf"));
  Model m32 = load_model(test::shared_path(kGguf));
  Model mq = load_model(path);
  EXPECT_EQ(mq.source_dtype, GgufFile::type_name(type));
  // Greedy continuations agree on the first tokens (numerics differ slightly afterwards).
  const auto a = greedy(m32, {1}, 24), b = greedy(mq, {1}, 24);
  int same = 0;
  while (same < 24 && a[size_t(same)] == b[size_t(same)]) ++same;
  EXPECT_GE(same, type == GgufFile::kTBF16 ? 8 : 16) << GgufFile::type_name(type);
  // Weights round-trip within the type's precision.
  LoadOptions f32;
  f32.weight_dtype = DType::kF32;
  Model mq32 = load_model(path, f32);
  const Weight& w32 = m32.layers[0][Slot::kWq];
  const Weight& wq = mq32.layers[0][Slot::kWq];
  const double tol = type == GgufFile::kTF16 ? 1e-3 : type == GgufFile::kTBF16 ? 8e-3 : 1e-2;
  double max_abs = 0;
  for (int64_t i = 0; i < w32.numel(); ++i) max_abs = std::max(max_abs, double(std::abs(w32.f32()[i])));
  EXPECT_TRUE(test::all_close(wq.f32(), w32.f32(), size_t(w32.numel()), {tol * max_abs, tol}));
}

INSTANTIATE_TEST_SUITE_P(Types, GgufTypes,
                         ::testing::Values(uint32_t(GgufFile::kTF16), uint32_t(GgufFile::kTBF16), uint32_t(GgufFile::kTQ8_0)),
                         [](const auto& i) { return GgufFile::type_name(i.param); });

}  // namespace
}  // namespace hg
