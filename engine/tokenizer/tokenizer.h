// Tokenizers: text ↔ token ids. Implementations: SentencePiece-style BPE by piece scores (GGUF
// `llama` vocabularies, llama2.c tokenizer.bin), byte-level BPE by merge rank (GPT-2 / Llama-3 /
// Qwen2 / OPT: GGUF `gpt2`, tokenizer.json, encoder.json+vocab.bpe, tiktoken ranks), the
// SentencePiece library for tokenizer.model, and a byte tokenizer for synthetic models.
// Immutable after construction; encode/decode are const and thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hg {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // short description for `hgbench info`
  virtual int n_vocab() const = 0;
  // Encodes text without special tokens (BOS is added by encode_prompt).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Decodes ids to text (specials are dropped; SPM's leading space after BOS is removed).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Text of one token as it would appear when streamed after `prev`.
  virtual std::string piece(int32_t id, int32_t prev) const = 0;

  // The id of the control or added token whose text is exactly `text` (a chat template's markers
  // such as <|im_start|>, which encode() never produces from text); -1 when there is none.
  virtual int32_t token_id(std::string_view text) const = 0;

  // BOS + encode(text) when add_bos.
  std::vector<int32_t> encode_prompt(std::string_view text) const;
  int bos_id = -1;
  int eos_id = -1;
  bool add_bos = true;
  // The model's chat template as its files give it (tokenizer_config.json `chat_template`, GGUF
  // `tokenizer.chat_template`); empty when they give none.
  std::string chat_template;
};

// A loaded tokenizer has tokens and its BOS and EOS ids (-1: none) name tokens it has, else an
// InputError naming `where`: an id from a config file never reaches a tokenizer library unchecked.
void check_tokenizer(const Tokenizer& t, const std::string& where);

// SentencePiece-style BPE over pieces with scores (▁ for space, <0xXX> byte fallback).
// token_type: 1 normal, 2 unknown, 3 control, 6 byte (GGUF convention); may be empty.
std::unique_ptr<Tokenizer> make_spm_bpe_tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                                                  std::vector<int32_t> token_type, bool add_space_prefix);
// llama2.c tokenizer.bin (n_vocab from the model header).
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int n_vocab);

// Pre-tokenizer regexes of the byte-level BPE families.
enum class PreSplit { kGpt2, kLlama3, kQwen2, kStarcoder, kFalcon, kDeepseekLlm };
// Maps GGUF tokenizer.ggml.pre names to a pre-split; throws InputError for unknown names.
PreSplit pre_split_from_name(const std::string& pre, const std::string& where);

struct ByteBpeSpec {
  std::vector<std::string> tokens;   // byte-to-unicode encoded strings, index = id
  std::vector<std::string> merges;   // "a b" in rank order (GPT-2 style); empty for rank mode
  bool rank_mode = false;            // tiktoken: tokens are raw bytes, rank = id
  std::vector<bool> special;         // control tokens (never produced from text)
  std::vector<bool> user_defined;    // added tokens matched verbatim in text before the regex split
  std::string regex;                 // PCRE2 pattern (empty: use `pre`)
  PreSplit pre = PreSplit::kGpt2;
  bool ignore_merges = false;        // Llama-3: a pre-split chunk that is a token is emitted whole
};
std::unique_ptr<Tokenizer> make_byte_bpe_tokenizer(ByteBpeSpec spec, const std::string& where);
// GPT-2 file pair (encoder.json + vocab.bpe), e.g. ../shared/models/llama3.2-tokenizer.
std::unique_ptr<Tokenizer> load_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe,
                                           PreSplit pre);
// tiktoken ranks file (base64 token, rank per line), e.g. qwen.tiktoken.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, PreSplit pre);
// Hugging Face tokenizer.json with a BPE model (byte-level).
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);
// SentencePiece model file via the SentencePiece library.
std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path);
// The tokenizer embedded in a GGUF file (works on vocab-only files).
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path);
// Bytes as tokens (id = 3 + byte; 0 unk, 1 BOS, 2 EOS), for synthetic models.
std::unique_ptr<Tokenizer> make_byte_tokenizer(int n_vocab);

// GPT-2's reversible byte ↔ printable-unicode mapping.
const std::string& byte_to_unicode(uint8_t b);
// Inverse of byte_to_unicode over a whole string; returns false on a char outside the map.
bool unicode_to_bytes(std::string_view s, std::string* out);

}  // namespace hg
