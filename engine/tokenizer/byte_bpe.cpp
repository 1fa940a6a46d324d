// Byte-level BPE (GPT-2 family): split text with the family's regex (PCRE2, Unicode properties),
// map each chunk's bytes to GPT-2's printable alphabet, then merge adjacent symbols by lowest
// merge rank until none applies. Rank mode (tiktoken files) ranks a pair by the id of its
// concatenated bytes instead of a merges list.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

const char* regex_of(PreSplit p) {
  switch (p) {
    case PreSplit::kGpt2:
      return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    case PreSplit::kLlama3:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreSplit::kQwen2:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreSplit::kStarcoder:  // two passes: digits split off first, then GPT-2's rules on the rest
      return R"(\p{N})" "\x1f" R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    case PreSplit::kFalcon:  // three passes: punctuation runs, GPT-2's rules, then digits in threes
      return R"([\p{P}\$\+<=>\^~\|`]+)" "\x1f" R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))"
             "\x1f" R"([0-9][0-9][0-9])";
    case PreSplit::kDeepseekLlm:  // six passes: line breaks, letter runs (Latin, Greek, Cyrillic and other cased
                                  // scripts), ASCII and full-width punctuation, trailing space, CJK, digits
      return R"([\r\n])" "\x1f" R"(\s?[)"
             R"(A-Za-z\x{b5}\x{c0}-\x{d6}\x{d8}-\x{f6}\x{f8}-\x{1ba}\x{1bc}-\x{1bf}\x{1c4}-\x{293})"
             R"(\x{295}-\x{2af}\x{370}-\x{373}\x{376}\x{377}\x{37b}-\x{37d}\x{37f}\x{386}\x{388}-\x{38a})"
             R"(\x{38c}\x{38e}-\x{3a1}\x{3a3}-\x{3f5}\x{3f7}-\x{481}\x{48a}-\x{52f}\x{531}-\x{556})"
             R"(\x{10a0}-\x{10c5}\x{13a0}-\x{13f5}\x{13f8}-\x{13fd}\x{1c90}-\x{1cba}\x{1cbd}-\x{1cbf})"
             R"(\x{1d00}-\x{1d2b}\x{1d6b}-\x{1d77}\x{1d79}-\x{1d9a}\x{1e00}-\x{1f15}\x{1f18}-\x{1f1d})"
             R"(\x{1f20}-\x{1f45}\x{1f48}-\x{1f4d}\x{1f50}-\x{1f57}\x{1f59}\x{1f5b}\x{1f5d}\x{1f5f}-\x{1f7d})"
             R"(\x{1f80}-\x{1fb4}\x{1fb6}-\x{1fbc}\x{1fbe}\x{1fc2}-\x{1fc4}\x{1fc6}-\x{1fcc})"
             R"(\x{1fd0}-\x{1fd3}\x{1fd6}-\x{1fdb}\x{1fe0}-\x{1fec}\x{1ff2}-\x{1ff4}\x{1ff6}-\x{1ffc})"
             R"(\x{2102}\x{2107}\x{210a}-\x{2113}\x{2115}\x{2119}-\x{211d}\x{2124}\x{2126}\x{2128})"
             R"(\x{212a}-\x{212d}\x{212f}-\x{2134}\x{2139}\x{213c}-\x{213f}\x{2145}-\x{2149}\x{214e}\x{2183})"
             R"(\x{2184}\x{2c00}-\x{2c7b}\x{2c7e}-\x{2ce4}\x{2ceb}-\x{2cee}\x{2cf2}\x{2cf3}\x{a640}-\x{a66d})"
             R"(\x{a680}-\x{a69b}\x{a722}-\x{a76f}\x{a771}-\x{a787}\x{a78b}-\x{a78e}\x{ab70}-\x{abbf})"
             R"(\x{fb00}-\x{fb06}\x{fb13}-\x{fb17}\x{ff21}-\x{ff3a}\x{ff41}-\x{ff5a}\x{10400}-\x{1044f})"
             R"(\x{104b0}-\x{104d3}\x{104d8}-\x{104fb}\x{10c80}-\x{10cb2}\x{10cc0}-\x{10cf2})"
             R"(\x{118a0}-\x{118df}\x{1e900}-\x{1e943})"
             R"(]+)"
             "\x1f" R"(\s?[\x{21}-\x{2f}\x{3a}-\x{7e}\x{ff01}-\x{ff0f}\x{ff1a}-\x{ff5e}\x{2018}-\x{201f}\x{3000}-\x{3002}]+)"
             "\x1f" R"(\s+$)" "\x1f" R"([\x{4e00}-\x{9fa5}\x{800}-\x{4e00}\x{ac00}-\x{d7ff}]+)" "\x1f" R"(\p{N}+)";
  }
  return "";
}

// One pre-tokenizer pass.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      input_error("{}: pre-tokenizer regex does not compile at offset {}: {}", where, off,
                  reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // best effort; interpretation works without it
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Splits text into consecutive chunks; text between matches becomes its own chunk.
  std::vector<std::string_view> split(std::string_view text) const {
    std::vector<std::string_view> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (b > pos) out.push_back(text.substr(pos, b - pos));
      if (e == b) {  // empty match: step one byte to make progress
        e = b + 1;
      }
      out.push_back(text.substr(b, e - b));
      pos = e;
    }
    if (pos < text.size()) out.push_back(text.substr(pos));
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

// Several passes applied in sequence (llama.cpp's regex lists): each pass splits every chunk of
// the previous one. Patterns are separated by \x1f.
class RegexChain {
 public:
  RegexChain(const std::string& patterns, const std::string& where) {
    size_t pos = 0;
    for (;;) {
      const size_t at = patterns.find('\x1f', pos);
      passes_.push_back(std::make_unique<Regex>(patterns.substr(pos, at == std::string::npos ? at : at - pos), where));
      if (at == std::string::npos) break;
      pos = at + 1;
    }
  }
  std::vector<std::string_view> split(std::string_view text) const {
    std::vector<std::string_view> chunks = passes_[0]->split(text);
    for (size_t p = 1; p < passes_.size(); ++p) {
      std::vector<std::string_view> next;
      for (auto c : chunks)
        for (auto d : passes_[p]->split(c)) next.push_back(d);
      chunks.swap(next);
    }
    return chunks;
  }

 private:
  std::vector<std::unique_ptr<Regex>> passes_;
};

class ByteBpeTokenizer final : public Tokenizer {
 public:
  ByteBpeTokenizer(ByteBpeSpec spec, const std::string& where)
      : spec_(std::move(spec)), regex_(spec_.regex.empty() ? regex_of(spec_.pre) : spec_.regex, where) {
    spec_.special.resize(spec_.tokens.size(), false);
    spec_.user_defined.resize(spec_.tokens.size(), false);
    for (size_t i = 0; i < spec_.tokens.size(); ++i) {
      if (spec_.user_defined[i] && !spec_.tokens[i].empty()) user_.emplace_back(spec_.tokens[i], int32_t(i));
      else if (!spec_.special[i] && !spec_.tokens[i].empty()) ids_.emplace(spec_.tokens[i], int32_t(i));
    }
    // Longest first, so that "   " wins over "  " at the same position.
    std::stable_sort(user_.begin(), user_.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
    for (size_t r = 0; r < spec_.merges.size(); ++r) {
      const std::string& m = spec_.merges[r];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) input_error("{}: merge {} '{}' is not 'a b'", where, r, m);
      ranks_.emplace(m, int32_t(r));
    }
  }

  std::string kind() const override {
    return spec_.rank_mode ? "byte-level BPE (tiktoken ranks)" : "byte-level BPE (GPT-2 merges)";
  }
  int n_vocab() const override { return int(spec_.tokens.size()); }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    if (user_.empty()) {
      encode_plain(text, out);
      return out;
    }
    // User-defined (added, non-control) tokens are cut out verbatim first, as llama.cpp and HF do.
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const std::pair<std::string, int32_t>* hit = nullptr;
      for (auto& u : user_)
        if (text.compare(i, u.first.size(), u.first) == 0) {
          hit = &u;
          break;
        }
      if (!hit) {
        ++i;
        continue;
      }
      encode_plain(text.substr(start, i - start), out);
      out.push_back(hit->second);
      i += hit->first.size();
      start = i;
    }
    encode_plain(text.substr(start), out);
    return out;
  }

  void encode_plain(std::string_view text, std::vector<int32_t>& out) const {
    std::vector<std::string> sym;
    for (std::string_view chunk : regex_.split(text)) {
      sym.clear();
      if (spec_.rank_mode) {
        for (char c : chunk) sym.emplace_back(1, c);
      } else {
        for (char c : chunk) sym.push_back(byte_to_unicode(uint8_t(c)));
      }
      if (spec_.ignore_merges) {
        std::string whole;
        for (auto& s : sym) whole += s;
        auto it = ids_.find(whole);
        if (it != ids_.end()) {
          out.push_back(it->second);
          continue;
        }
      }
      while (sym.size() > 1) {
        int32_t best = std::numeric_limits<int32_t>::max();
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
          const int32_t r = pair_rank(sym[i], sym[i + 1]);
          if (r < best) {
            best = r;
            at = i;
          }
        }
        if (best == std::numeric_limits<int32_t>::max()) break;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + std::ptrdiff_t(at) + 1);
      }
      for (auto& s : sym) {
        auto it = ids_.find(s);
        if (it != ids_.end()) {
          out.push_back(it->second);
          continue;
        }
        // Not a token (only with an incomplete vocabulary): fall back to single bytes.
        std::string bytes = s;
        if (!spec_.rank_mode) {
          bytes.clear();
          unicode_to_bytes(s, &bytes);
        }
        for (char c : bytes) {
          auto jt = ids_.find(spec_.rank_mode ? std::string(1, c) : byte_to_unicode(uint8_t(c)));
          if (jt != ids_.end()) out.push_back(jt->second);
        }
      }
    }
  }

  int32_t token_id(std::string_view text) const override {
    for (size_t i = 0; i < spec_.tokens.size(); ++i)
      if ((spec_.special[i] || spec_.user_defined[i]) && piece_text(int32_t(i)) == text) return int32_t(i);
    return -1;
  }

  std::string piece(int32_t id, int32_t /*prev*/) const override {
    if (id < 0 || id >= int32_t(spec_.tokens.size()) || spec_.special[size_t(id)]) return "";
    return piece_text(id);
  }

  // A token's text, control tokens included.
  std::string piece_text(int32_t id) const {
    const std::string& t = spec_.tokens[size_t(id)];
    if (spec_.rank_mode) return t;
    std::string out;
    if (!unicode_to_bytes(t, &out)) return t;  // added tokens are stored as plain text
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += piece(id, -1);
    return out;
  }

 private:
  int32_t pair_rank(const std::string& a, const std::string& b) const {
    key_.clear();
    if (spec_.rank_mode) {
      key_ += a;
      key_ += b;
      auto it = ids_.find(key_);
      return it == ids_.end() ? std::numeric_limits<int32_t>::max() : it->second;
    }
    key_ += a;
    key_ += ' ';
    key_ += b;
    auto it = ranks_.find(key_);
    return it == ranks_.end() ? std::numeric_limits<int32_t>::max() : it->second;
  }

  ByteBpeSpec spec_;
  RegexChain regex_;
  std::unordered_map<std::string, int32_t> ids_;
  std::unordered_map<std::string, int32_t> ranks_;
  std::vector<std::pair<std::string, int32_t>> user_;
  static thread_local std::string key_;
};
thread_local std::string ByteBpeTokenizer::key_;

std::string read_text(const std::string& path) { return read_regular_file(path, int64_t(256) << 20); }

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view in, std::string* out) {
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const int v = base64_value(c);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xFF));
    }
  }
  return true;
}

}  // namespace

PreSplit pre_split_from_name(const std::string& pre, const std::string& where) {
  if (pre.empty() || pre == "default" || pre == "gpt-2" || pre == "gpt2" || pre == "mpt" || pre == "olmo" ||
      pre == "jais")
    return PreSplit::kGpt2;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "smaug-bpe" || pre == "dbrx") return PreSplit::kLlama3;
  if (pre == "qwen2") return PreSplit::kQwen2;
  if (pre == "starcoder" || pre == "refact") return PreSplit::kStarcoder;
  if (pre == "falcon") return PreSplit::kFalcon;
  if (pre == "deepseek-llm") return PreSplit::kDeepseekLlm;
  input_error("{}: tokenizer pre-split '{}' is not supported (expected gpt-2, mpt, llama-bpe, qwen2, starcoder, "
              "refact, falcon, deepseek-llm)", where, pre);
}

std::unique_ptr<Tokenizer> make_byte_bpe_tokenizer(ByteBpeSpec spec, const std::string& where) {
  return std::make_unique<ByteBpeTokenizer>(std::move(spec), where);
}

std::unique_ptr<Tokenizer> load_gpt2_files(const std::string& encoder_json, const std::string& vocab_bpe,
                                           PreSplit pre) {
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_text(encoder_json));
  } catch (const nlohmann::json::exception& e) {
    input_error("{}: invalid JSON: {}", encoder_json, e.what());
  }
  if (!enc.is_object()) input_error("{}: expected an object of token → id", encoder_json);
  ByteBpeSpec spec;
  spec.pre = pre;
  spec.ignore_merges = pre == PreSplit::kLlama3;
  const int64_t max_id = int64_t(enc.size()) + 65536;  // ids are dense
  for (auto& [tok, id] : enc.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::min<int64_t>(max_id, 1 << 24))
      input_error("{}: id of '{}' is not a valid integer below {}", encoder_json, tok, max_id);
    const size_t i = size_t(id.get<int64_t>());
    if (spec.tokens.size() <= i) spec.tokens.resize(i + 1);
    spec.tokens[i] = tok;
  }
  std::istringstream in(read_text(vocab_bpe));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    spec.merges.push_back(line);
  }
  auto t = make_byte_bpe_tokenizer(std::move(spec), vocab_bpe);
  t->add_bos = false;
  return t;
}

std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, PreSplit pre) {
  ByteBpeSpec spec;
  spec.pre = pre;
  spec.rank_mode = true;
  const std::string text = read_text(path);
  // Ranks are dense (0..N−1, a few gaps at most): one far beyond the file's entries is an error,
  // not a vocabulary of millions of empty tokens.
  const long max_rank = long(std::count(text.begin(), text.end(), '\n')) + 65536;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    std::string bytes;
    if (sp == std::string::npos || !base64_decode(std::string_view(line).substr(0, sp), &bytes))
      input_error("{}:{}: expected 'base64 rank'", path, lineno);
    long rank = -1;
    try {
      rank = std::stol(line.substr(sp + 1));
    } catch (...) {
    }
    if (rank < 0 || rank > (1 << 24)) input_error("{}:{}: rank is not a valid integer", path, lineno);
    if (rank > max_rank) input_error("{}:{}: rank {} is far beyond the file's {} entries", path, lineno, rank, lineno);
    if (spec.tokens.size() <= size_t(rank)) spec.tokens.resize(size_t(rank) + 1);
    spec.tokens[size_t(rank)] = bytes;
  }
  auto t = make_byte_bpe_tokenizer(std::move(spec), path);
  t->add_bos = false;
  return t;
}

namespace {
std::unique_ptr<Tokenizer> hf_tokenizer_from_json(const nlohmann::json& j, const std::string& path);
}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    input_error("{}: invalid JSON: {}", path, e.what());
  }
  if (!j.is_object()) input_error("{}: expected a JSON object with 'model'", path);
  // A field of an unexpected JSON type anywhere below is the file's error, named with it.
  try {
    return hf_tokenizer_from_json(j, path);
  } catch (const nlohmann::json::exception& e) {
    input_error("{}: a field has an unexpected type ({})", path, e.what());
  }
}

namespace {
std::unique_ptr<Tokenizer> hf_tokenizer_from_json(const nlohmann::json& j, const std::string& path) {
  const auto& model = j.at("model");
  if (!model.is_object() || model.value("type", "") != "BPE")
    input_error("{}: field 'model.type' must be BPE (byte-level BPE tokenizers only)", path);
  if (!model.contains("vocab") || !model.at("vocab").is_object()) input_error("{}: missing field 'model.vocab'", path);
  ByteBpeSpec spec;
  const int64_t max_id = int64_t(model.at("vocab").size()) + 65536;  // ids are dense
  for (auto& [tok, id] : model.at("vocab").items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::min<int64_t>(max_id, 1 << 24))
      input_error("{}: model.vocab id of '{}' is not a valid integer below {}", path, tok, max_id);
    const size_t i = size_t(id.get<int64_t>());
    if (spec.tokens.size() <= i) spec.tokens.resize(i + 1);
    spec.tokens[i] = tok;
  }
  if (model.contains("merges") && model.at("merges").is_array()) {
    for (auto& m : model.at("merges")) {
      if (m.is_string()) spec.merges.push_back(m.get<std::string>());
      else if (m.is_array() && m.size() == 2) spec.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      else input_error("{}: model.merges entries must be 'a b' or [a, b]", path);
    }
  }
  spec.ignore_merges = model.value("ignore_merges", false);
  spec.special.assign(spec.tokens.size(), false);
  if (j.contains("added_tokens") && j.at("added_tokens").is_array()) {
    for (auto& a : j.at("added_tokens")) {
      const int64_t id = a.value("id", int64_t(-1));
      if (id < 0 || id > std::min<int64_t>(max_id, 1 << 24)) input_error("{}: added_tokens entry without a valid id", path);
      if (spec.tokens.size() <= size_t(id)) {
        spec.tokens.resize(size_t(id) + 1);
        spec.special.resize(size_t(id) + 1, false);
      }
      spec.tokens[size_t(id)] = a.value("content", "");
      spec.special[size_t(id)] = a.value("special", false);
      if (spec.user_defined.size() < spec.tokens.size()) spec.user_defined.resize(spec.tokens.size(), false);
      spec.user_defined[size_t(id)] = !a.value("special", false);
    }
  }
  // Pre-tokenizer: the Split regex when present (Llama-3, Qwen2), else GPT-2's (ByteLevel use_regex).
  std::function<void(const nlohmann::json&)> find_split = [&](const nlohmann::json& p) {
    if (!p.is_object()) return;
    if (p.value("type", "") == "Split" && p.contains("pattern") && p.at("pattern").is_object() &&
        p.at("pattern").contains("Regex") && spec.regex.empty())
      spec.regex = p.at("pattern").at("Regex").get<std::string>();
    if (p.contains("pretokenizers") && p.at("pretokenizers").is_array())
      for (auto& q : p.at("pretokenizers")) find_split(q);
  };
  if (j.contains("pre_tokenizer")) find_split(j.at("pre_tokenizer"));
  auto t = make_byte_bpe_tokenizer(std::move(spec), path);
  t->add_bos = false;
  return t;
}
}  // namespace

}  // namespace hg
