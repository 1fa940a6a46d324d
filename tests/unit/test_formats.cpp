// Model files: bad input gives an InputError naming the file and the problem (truncated or
// corrupted GGUF / safetensors / .bin, config.json with a missing field, unknown architecture);
// HF directories written here from synthetic llama/qwen2/opt weights (single and sharded
// safetensors) load back to the same logits.
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "baselines/full/full.h"
#include "engine/arch/arch.h"
#include "engine/core/process_memory.h"
#include "engine/decoder/generate.h"
#include "engine/formats/formats.h"
#include "engine/formats/gguf_writer.h"
#include "engine/formats/safetensors.h"
#include "engine/tokenizer/tokenizer.h"
#include "hf_writer.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace hg {
namespace {

// Expects load_model(path) to throw an InputError whose one-line message contains `what`.
void expect_input_error(const std::string& spec, const std::string& what) {
  try {
    load_model(spec);
    ADD_FAILURE() << spec << ": loaded, expected an error containing '" << what << "'";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(what), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
}

TEST(Formats, TruncatedGgufNamesTheFile) {
  HG_REQUIRE_SHARED("models/stories260K/stories260K.gguf");
  const std::string src = test::read_file(test::shared_path("models/stories260K/stories260K.gguf"));
  for (size_t n : {size_t(0), size_t(3), size_t(20), size_t(1000), src.size() / 3, src.size() - 1}) {
    const std::string p = test::temp_path("trunc_" + std::to_string(n) + ".gguf");
    test::write_file(p, src.substr(0, n));
    expect_input_error("gguf:" + p, p);
  }
}

TEST(Formats, CorruptedGgufIsAnError) {
  HG_REQUIRE_SHARED("models/stories260K/stories260K.gguf");
  const std::string src = test::read_file(test::shared_path("models/stories260K/stories260K.gguf"));
  auto corrupt = [&](size_t at, const std::string& bytes, const std::string& what) {
    std::string s = src;
    s.replace(at, bytes.size(), bytes);
    const std::string p = test::temp_path("corrupt_" + std::to_string(at) + ".gguf");
    test::write_file(p, s);
    expect_input_error("gguf:" + p, what);
  };
  corrupt(0, "GGUX", "bad magic");
  corrupt(4, std::string("\x07\0\0\0", 4), "version 7");
  corrupt(24, std::string("\xff\xff\xff\xff\xff\xff\0\0", 8), "implausible");  // first key length
  corrupt(8, std::string("\xff\xff\xff\x0f\0\0\0\0", 8), "implausible");       // tensor count
}

TEST(Formats, TruncatedLlama2cBin) {
  HG_REQUIRE_SHARED("models/stories260K/stories260K.bin");
  const std::string src = test::read_file(test::shared_path("models/stories260K/stories260K.bin"));
  const std::string dir = test::temp_path("l2c");
  fs::create_directories(dir);
  fs::copy_file(test::shared_path("models/stories260K/tok512.bin"), dir + "/tok512.bin", fs::copy_options::overwrite_existing);
  for (size_t n : {size_t(10), size_t(28), src.size() / 2}) {
    const std::string p = dir + "/m" + std::to_string(n) + ".bin";
    test::write_file(p, src.substr(0, n));
    expect_input_error(p, p);
  }
  std::string bad = src;
  const int32_t neg_layers = -5;
  std::memcpy(bad.data() + 8, &neg_layers, 4);
  test::write_file(dir + "/neg.bin", bad);
  expect_input_error(dir + "/neg.bin", "n_layers");
  expect_input_error(test::shared_path("models/stories260K/stories260K.bin") + "?tokenizer=/nonexistent/tok.bin",
                     "/nonexistent/tok.bin");
}

// Copies the stories260K HF directory into a temp dir so tests can damage it.
std::string copy_hf(const std::string& name) {
  const std::string dir = test::temp_path(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (auto& e : fs::directory_iterator(test::shared_path("models/stories260K-hf")))
    fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
  for (auto& e : fs::directory_iterator(dir)) fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write);
  return dir;
}

TEST(Formats, HfConfigErrorsNameFileAndField) {
  HG_REQUIRE_SHARED("models/stories260K-hf/config.json");
  const std::string dir = copy_hf("hf_cfg");
  auto cfg = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& what) {
    auto c = cfg;
    edit(c);
    test::write_file(dir + "/config.json", c.dump());
    expect_input_error(dir, what);
  };
  with([](auto& c) { c.erase("hidden_size"); }, "config.json: missing field 'hidden_size'");
  with([](auto& c) { c["num_attention_heads"] = "eight"; }, "'num_attention_heads' must be an integer");
  with([](auto& c) { c["architectures"] = {"FooForCausalLM"}; }, "unknown architecture 'FooForCausalLM'");
  with([](auto& c) { c["num_key_value_heads"] = 3; }, "not a multiple of KV head count 3");
  with([](auto& c) { c["rope_scaling"] = {{"rope_type", "yarn"}}; }, "rope_type 'yarn'");
  with([](auto& c) { c["intermediate_size"] = 100; }, "expected [100, 64]");
  with([](auto& c) { c["hidden_act"] = 5; }, "field 'hidden_act' must be a string");
  with([](auto& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", "x"}}; }, "'factor' must be a number");
  with([](auto& c) { c["rope_scaling"] = {{"rope_type", "llama3"}, {"low_freq_factor", 4}}; }, "0 < low_freq_factor < high");
  test::write_file(dir + "/config.json", "{ not json");
  expect_input_error(dir, "invalid JSON");
}

TEST(Formats, HfSafetensorsDamage) {
  HG_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  const std::string dir = copy_hf("hf_st");
  const std::string st = test::read_file(dir + "/model.safetensors");
  test::write_file(dir + "/model.safetensors", st.substr(0, st.size() - 100));
  expect_input_error(dir, "truncated");
  std::string bad = st;
  bad[8] = '#';  // the JSON header's opening brace
  test::write_file(dir + "/model.safetensors", bad);
  expect_input_error(dir, "model.safetensors: header is not valid JSON");
  test::write_file(dir + "/model.safetensors", st.substr(0, 4));
  expect_input_error(dir, "model.safetensors: truncated");
}

// Header fields are checked before anything is sized from them: a layer count far beyond any real
// model, a count that does not fit 32 bits (it must not wrap to a small one), a negative epsilon and
// a zero RoPE theta are one-line errors naming the file and field, not allocations or a silent load.
TEST(Formats, HeaderFieldsAreBoundedBeforeAllocation) {
  const Model m = load_model("synthetic:tiny-llama");
  const std::string dir = test::write_hf(m, "hf_bounds", 1);
  const auto cfg = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& what) {
    auto c = cfg;
    edit(c);
    test::write_file(dir + "/config.json", c.dump());
    expect_input_error(dir, what);
  };
  with([](auto& c) { c["num_hidden_layers"] = 10000000; }, "layer count 10000000 is above the supported maximum 1024");
  with([](auto& c) { c["num_hidden_layers"] = 4294967301LL; }, "field 'num_hidden_layers' = 4294967301 does not fit");
  with([](auto& c) { c["vocab_size"] = 4294967296LL; }, "'vocab_size' = 4294967296 does not fit");
  with([](auto& c) { c["rms_norm_eps"] = -1; }, "norm epsilon must be positive");
  with([](auto& c) { c["rope_theta"] = 0; }, "field 'rope_theta' must be positive");
  // GGUF: the block count patched in an exported file (a u32 after its key and type).
  const std::string gguf = test::temp_path("bounds.gguf");
  write_gguf(m, gguf);
  std::string bytes = test::read_file(gguf);
  const size_t at = bytes.find("llama.block_count");
  ASSERT_NE(at, std::string::npos);
  const uint32_t huge = 100000000;
  std::memcpy(&bytes[at + std::strlen("llama.block_count") + 4], &huge, 4);
  test::write_file(gguf, bytes);
  expect_input_error(gguf, "layer count 100000000 is above the supported maximum 1024");
}

// safetensors as strict as the format's own reader: the tensors tile the data buffer exactly
// (no overlap, no gap, nothing after), and a shape's element count may not wrap.
TEST(Formats, SafetensorsOffsetsTileTheBufferAndShapesDoNotWrap) {
  const std::string p = test::temp_path("tiles.safetensors");
  auto write = [&](const std::string& header, size_t data_bytes) {
    std::string h = header;
    while (h.size() % 8) h += ' ';
    const uint64_t n = h.size();
    std::string out(reinterpret_cast<const char*>(&n), 8);
    out += h + std::string(data_bytes, '\0');
    test::write_file(p, out);
  };
  auto expect = [&](const std::string& what) {
    try {
      SafetensorsFile f(p);
      ADD_FAILURE() << "accepted, expected '" << what << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16);
  EXPECT_NO_THROW(SafetensorsFile f(p));
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 16);
  expect("tensor 'b' overlaps the tensor before it");
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20);
  expect("a gap of 4 bytes before tensor 'b'");
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 16);
  expect("the tensors cover 8 bytes of data but the file holds 16");
  write(R"({"z":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  expect("overflows a 64-bit element count");
  write(R"({"z":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  EXPECT_NO_THROW(SafetensorsFile f(p));  // zero elements: no overflow in the product
  write(R"({"z":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8);
  expect("shape must be a list of integers");
}

std::vector<float> last_logits(const Model& m) {
  auto be = make_cpu_backend();
  FullStrategy kv(*be);
  Decoder dec(m, *be, kv);
  std::vector<int32_t> toks = {1, 70, 80, 90, 250};
  std::vector<TokenRow> rows;
  for (int i = 0; i < 5; ++i) rows.push_back({0, i});
  const int32_t cap = 5;
  kv.begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&cap, 1));
  std::vector<float> lg(size_t(m.hp.n_vocab));
  const int32_t want = 4;
  dec.forward(toks, rows, std::span<const int32_t>(&want, 1), lg.data());
  return lg;
}

class HfRoundTrip : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(HfRoundTrip, WrittenDirectoryLoadsToTheSameLogits) {
  const auto [preset, shards] = GetParam();
  Model m = load_model("synthetic:" + preset);
  const std::string dir = test::write_hf(m, "hf_" + preset + "_" + std::to_string(shards), shards);
  Model h = load_model(dir);
  EXPECT_EQ(h.hp.arch, m.hp.arch);
  EXPECT_EQ(h.format, "hf");
  const auto a = last_logits(m), b = last_logits(h);
  EXPECT_TRUE(test::all_close(b.data(), a.data(), a.size(), {0, 0}));
  EXPECT_EQ(h.tokenizer->encode("hi"), (std::vector<int32_t>{'h', 'i'}));
}

INSTANTIATE_TEST_SUITE_P(Archs, HfRoundTrip,
                         ::testing::Combine(::testing::Values("tiny-llama", "tiny-qwen2", "tiny-opt"), ::testing::Values(1, 3)),
                         [](const auto& i) {
                           std::string s = std::get<0>(i.param) + "_shards" + std::to_string(std::get<1>(i.param));
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// `hgbench export`: a synthetic Llama-3 model (rotate-half RoPE, llama3 frequency scaling) written
// as GGUF loads back as llama.cpp would read it — interleaved RoPE with permuted q/k rows and
// rope_freqs factors — and gives the same logits, in each weight type.
TEST(Formats, GgufExportLoadsToTheSameLogits) {
  for (const char* dt : {"f32", "f16", "bf16"}) {
    Model m = load_model(std::string("synthetic:tiny-llama?dtype=") + dt);
    ASSERT_EQ(m.hp.rope_style, RopeStyle::kHalf);
    ASSERT_FALSE(m.hp.rope_scaling.type.empty());
    const std::string path = test::temp_path(std::string("export_") + dt + ".gguf");
    write_gguf(m, path);
    Model g = load_model(path);
    EXPECT_EQ(g.format, "gguf");
    EXPECT_EQ(g.hp.rope_style, RopeStyle::kInterleaved);
    EXPECT_EQ(g.weight_dtype, m.weight_dtype) << dt;
    EXPECT_EQ(g.tokenizer->n_vocab(), m.hp.n_vocab);
    const auto a = last_logits(m), b = last_logits(g);
    EXPECT_TRUE(test::all_close(b.data(), a.data(), a.size(), {2e-5, 1e-4})) << dt;
  }
  // Other architectures are refused with a message, and nothing is left behind.
  const std::string bad = test::temp_path("export_opt.gguf");
  EXPECT_THROW(write_gguf(load_model("synthetic:tiny-opt"), bad), UnsupportedError);
  EXPECT_FALSE(std::filesystem::exists(bad));
}

// Loading holds every weight once: a loader copies each tensor out of the file's mapping and
// drops the mapping's pages (load=copy), or uses the mapping itself (load=map), so the load's peak
// resident memory grows by the weights' bytes (plus the tokenizer and bookkeeping), not by twice
// them. GGUF, sharded safetensors and llama2.c; the stories110m shape with 4 layers in F32 (310 MB
// of weights). The peak is the kernel's VmHWM, reset through /proc/self/clear_refs before the load.

// Writes an F32 Llama model (untied) as a llama2.c .bin in run.c's order, and a tokenizer.bin of
// placeholder pieces beside it; returns the .bin's path.
std::string write_llama2c(const Model& m, const std::string& name) {
  const HParams& hp = m.hp;
  const std::string dir = test::temp_path(name);
  std::filesystem::create_directories(dir);
  std::ofstream f(dir + "/model.bin", std::ios::binary);
  const int32_t h[7] = {hp.d_model, hp.d_ff, hp.n_layers, hp.n_heads, hp.n_kv_heads, -hp.n_vocab, hp.max_pos};
  f.write(reinterpret_cast<const char*>(h), sizeof h);
  auto put = [&](const Weight& w) {
    std::vector<float> v(size_t(w.numel()));
    to_f32(w.dtype, w.buf.data(), v.data(), v.size());
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
  };
  put(m[GlobalSlot::kTokEmbd]);
  for (Slot s : {Slot::kAttnNorm, Slot::kWq, Slot::kWk, Slot::kWv, Slot::kWo, Slot::kFfnNorm, Slot::kWGate,
                 Slot::kWDown, Slot::kWUp})
    for (auto& l : m.layers) put(l[s]);
  put(m[GlobalSlot::kOutNorm]);
  const std::vector<float> rope(size_t(hp.max_pos) * size_t(hp.head_dim), 0.0f);  // cos and sin tables, unused
  f.write(reinterpret_cast<const char*>(rope.data()), std::streamsize(rope.size() * 4));
  put(m[GlobalSlot::kOutput]);
  std::ofstream t(dir + "/tokenizer.bin", std::ios::binary);
  const int32_t max_len = 16;
  t.write(reinterpret_cast<const char*>(&max_len), 4);
  for (int i = 0; i < hp.n_vocab; ++i) {
    const std::string piece = i == 0 ? "<unk>" : i == 1 ? "\n<s>\n" : i == 2 ? "\n</s>\n" : "t" + std::to_string(i);
    const float score = -float(i);
    const int32_t len = int32_t(piece.size());
    t.write(reinterpret_cast<const char*>(&score), 4);
    t.write(reinterpret_cast<const char*>(&len), 4);
    t.write(piece.data(), len);
  }
  return dir + "/model.bin";
}

TEST(Formats, LoadingHoldsTheWeightsOnce) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "resident-memory bounds do not hold under AddressSanitizer's shadow memory";
#endif
  Model m = load_model("synthetic:stories110m?layers=4");
  const int64_t weights = m.weight_bytes();
  const std::string gguf = test::temp_path("rss_110m.gguf");
  write_gguf(m, gguf);
  const std::string hf = test::write_hf(m, "rss_110m_hf", 3);
  const std::string l2c = "llama2c:" + write_llama2c(m, "rss_110m_llama2c");
  for (const std::string& path : {gguf, hf, l2c, gguf + "?load=map", hf + "?load=map", l2c + "?load=map"}) {
    if (!reset_peak_resident()) GTEST_SKIP() << "cannot reset the peak resident memory (/proc/self/clear_refs)";
    const int64_t before = process_memory().resident_bytes;
    Model g = load_model(path);
    const int64_t peak = process_memory().peak_resident_bytes;
    ASSERT_GT(before, 0);
    const double grown = double(peak - before);
    EXPECT_LT(grown, 1.1 * double(weights) + 48e6)
        << path << ": the load's peak grew by " << grown / 1e6 << " MB for " << weights / 1e6 << " MB of weights";
    EXPECT_EQ(g.weight_bytes(), weights);
    // Every tensor is F32 in the file and in the engine: mapped whole, or not at all.
    EXPECT_EQ(g.mapped_weight_bytes, path.ends_with("?load=map") ? weights : 0) << path;
  }
  std::filesystem::remove(gguf);
  std::filesystem::remove_all(hf);
  std::filesystem::remove_all(test::temp_path("rss_110m_llama2c"));
}

// load=map gives views of the file with the same bytes as load=copy; a weight converted to another
// type is a copy either way; an unknown load option is an input error.
TEST(Formats, MappedWeightsHoldTheFilesBytes) {
  Model m = load_model("synthetic:stories110m?layers=1&dtype=f16");
  const std::string gguf = test::temp_path("map_15m.gguf");
  write_gguf(m, gguf);
  const std::string hf = test::write_hf(m, "map_15m_hf", 2);
  for (const std::string& path : {gguf, hf}) {
    Model copied = load_model(path), mapped = load_model(path + "?load=map");
    LoadOptions to_f32;
    to_f32.weight_dtype = DType::kF32;
    Model converted = load_model(path + "?load=map", to_f32);
    EXPECT_EQ(copied.mapped_weight_bytes, 0) << path;
    EXPECT_GT(mapped.mapped_weight_bytes, 0) << path;
    int64_t matrices = 0;
    std::vector<const Weight*> a, b, c;
    copied.for_each_weight([&](const Weight& w) { a.push_back(&w); });
    mapped.for_each_weight([&](const Weight& w) { b.push_back(&w); });
    converted.for_each_weight([&](const Weight& w) { c.push_back(&w); });
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i]->empty()) continue;
      EXPECT_FALSE(a[i]->mapped());
      EXPECT_TRUE(b[i]->mapped()) << path << " weight " << i;
      ASSERT_EQ(a[i]->bytes(), b[i]->bytes());
      EXPECT_EQ(std::memcmp(a[i]->buf.data(), b[i]->buf.data(), a[i]->bytes()), 0) << path << " weight " << i;
      if (a[i]->dtype == DType::kF16) {
        ++matrices;
        EXPECT_FALSE(c[i]->mapped()) << "converted to F32, so copied";
      }
    }
    EXPECT_GT(matrices, 0);
    expect_input_error(path + "?load=mmap", "load=mmap: expected map or copy");
  }
  // Tensors at odd offsets (a header not padded) cannot be views: they are copied, same bytes.
  std::vector<std::pair<std::string, const Weight*>> one = {{"w", &m.layers[0][Slot::kWq]}};
  const std::string odd = test::temp_path("odd.safetensors");
  test::write_safetensors(odd, one, false);
  SafetensorsFile f(odd);
  const Weight w = f.load(*f.find("w"), DType::kF16, WeightLoad::kMap);
  EXPECT_FALSE(w.mapped());
  EXPECT_EQ(std::memcmp(w.buf.data(), m.layers[0][Slot::kWq].buf.data(), w.bytes()), 0);
  std::filesystem::remove(odd);
  std::filesystem::remove(gguf);
  std::filesystem::remove_all(hf);
}

TEST(Formats, OptProjectedEmbeddingsAreRejected) {
  Model m = load_model("synthetic:tiny-opt");
  const std::string dir = test::write_hf(m, "hf_opt350", 1);
  auto c = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  c["word_embed_proj_dim"] = 32;
  test::write_file(dir + "/config.json", c.dump());
  expect_input_error(dir, "word_embed_proj_dim 32 != hidden_size 64");
}

TEST(Formats, SpecsAndProbing) {
  expect_input_error("/nonexistent/model.gguf", "/nonexistent/model.gguf: no such file");
  expect_input_error("zip:/tmp/x", "unknown format 'zip'");
  // A name the OS refuses (longer than NAME_MAX) is no file, not a filesystem exception.
  expect_input_error("/tmp/" + std::string(300, 'm') + ".gguf", "no such file");
  const std::string p = test::temp_path("readme.txt");
  test::write_file(p, "hello");
  expect_input_error(p, "not a recognised model");
  auto s = parse_model_spec("llama2c:/a/b.bin?tokenizer=/c/t.bin");
  EXPECT_EQ(s.format, "llama2c");
  EXPECT_EQ(s.path, "/a/b.bin");
  EXPECT_EQ(s.options.at("tokenizer"), "/c/t.bin");
}

}  // namespace
}  // namespace hg
