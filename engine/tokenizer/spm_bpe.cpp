// SentencePiece-style BPE by piece score, as llama.cpp's SPM tokenizer and llama2.c's encode() do:
// prefix a space, write spaces as ▁ (U+2581), start from UTF-8 characters, repeatedly merge the
// adjacent pair whose concatenation is a piece with the highest score (leftmost on ties), and map
// characters that are not pieces to <0xXX> byte tokens.
#include <queue>

#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // ▁

size_t utf8_len(uint8_t c) { return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1; }

class SpmBpeTokenizer final : public Tokenizer {
 public:
  SpmBpeTokenizer(std::vector<std::string> pieces, std::vector<float> scores, std::vector<int32_t> types,
                  bool add_space_prefix)
      : pieces_(std::move(pieces)), scores_(std::move(scores)), types_(std::move(types)),
        add_space_prefix_(add_space_prefix) {
    if (scores_.size() != pieces_.size()) scores_.assign(pieces_.size(), 0.0f);
    if (types_.size() != pieces_.size()) types_.assign(pieces_.size(), 1);
    byte_ids_.fill(-1);
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const std::string& p = pieces_[i];
      // Byte pieces <0xHH>: exactly two hex digits (anything else is an ordinary piece).
      auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                  : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
      if (p.size() == 6 && p.rfind("<0x", 0) == 0 && p[5] == '>' && hex(p[3]) >= 0 && hex(p[4]) >= 0) {
        const int b = hex(p[3]) * 16 + hex(p[4]);
        if (byte_ids_[size_t(b)] < 0) byte_ids_[size_t(b)] = int32_t(i);
        continue;
      }
      if (types_[i] == 3 || types_[i] == 2) continue;  // control / unknown pieces never come from text
      lookup_.emplace(p, int32_t(i));
    }
    for (size_t i = 0; i < pieces_.size(); ++i)
      if (types_[i] == 2 && unk_ < 0) unk_ = int32_t(i);
  }

  std::string kind() const override { return "spm-bpe (SentencePiece-style BPE by score)"; }
  int32_t token_id(std::string_view text) const override {  // control (3) and user-defined (4) pieces
    for (size_t i = 0; i < pieces_.size(); ++i)
      if ((types_[i] == 3 || types_[i] == 4) && pieces_[i] == text) return int32_t(i);
    return -1;
  }
  int n_vocab() const override { return int(pieces_.size()); }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    if (text.empty()) return out;
    std::string s;
    if (add_space_prefix_) s += kSpace;
    for (char c : text) {
      if (c == ' ') s += kSpace;
      else s += c;
    }
    struct Sym { int prev, next; size_t off, len; };
    std::vector<Sym> sym;
    for (size_t i = 0; i < s.size();) {
      const size_t l = std::min(utf8_len(uint8_t(s[i])), s.size() - i);
      sym.push_back({int(sym.size()) - 1, int(sym.size()) + 1, i, l});
      i += l;
    }
    sym.back().next = -1;
    struct Bigram { int left, right; float score; size_t len; };
    auto cmp = [](const Bigram& a, const Bigram& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> q(cmp);
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const size_t len = sym[size_t(l)].len + sym[size_t(r)].len;
      auto it = lookup_.find(std::string_view(s).substr(sym[size_t(l)].off, len));
      if (it == lookup_.end()) return;
      q.push({l, r, scores_[size_t(it->second)], len});
    };
    for (size_t i = 1; i < sym.size(); ++i) try_add(int(i) - 1, int(i));
    while (!q.empty()) {
      const Bigram b = q.top();
      q.pop();
      Sym& l = sym[size_t(b.left)];
      Sym& r = sym[size_t(b.right)];
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != b.right) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[size_t(r.next)].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = 0; i != -1 && !sym.empty(); i = sym[size_t(i)].next) {
      const Sym& x = sym[size_t(i)];
      std::string_view piece = std::string_view(s).substr(x.off, x.len);
      auto it = lookup_.find(piece);
      if (it != lookup_.end()) {
        out.push_back(it->second);
        continue;
      }
      for (char c : piece) {
        const int32_t id = byte_ids_[uint8_t(c)];
        out.push_back(id >= 0 ? id : std::max(unk_, 0));
      }
    }
    return out;
  }

  std::string piece(int32_t id, int32_t prev) const override {
    if (id < 0 || id >= int32_t(pieces_.size()) || types_[size_t(id)] == 3) return "";
    const std::string& p = pieces_[size_t(id)];
    if (p.size() == 6 && p.rfind("<0x", 0) == 0 && p[5] == '>') return std::string(1, char(std::stoi(p.substr(3, 2), nullptr, 16)));
    std::string out;
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, kSpace) == 0) {
        out += ' ';
        i += 3;
      } else {
        out += p[i++];
      }
    }
    // The prefix space of the first word is not part of the text.
    if ((prev < 0 || prev == bos_id) && add_space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    int32_t prev = -1;
    for (int32_t id : ids) {
      out += piece(id, prev);
      prev = id;
    }
    return out;
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  bool add_space_prefix_;
  std::unordered_map<std::string_view, int32_t> lookup_;  // views into pieces_
  std::array<int32_t, 256> byte_ids_{};
  int32_t unk_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_bpe_tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
                                                  std::vector<int32_t> token_type, bool add_space_prefix) {
  return std::make_unique<SpmBpeTokenizer>(std::move(pieces), std::move(scores), std::move(token_type),
                                           add_space_prefix);
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int n_vocab) {
  // Layout: i32 max_token_length, then per token: f32 score, i32 length, bytes.
  MappedFile f(path);
  ByteReader r(f);
  const int32_t max_len = r.read<int32_t>("max_token_length");
  if (max_len <= 0 || max_len > 1024) input_error("{}: max_token_length {} is implausible", path, max_len);
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int i = 0; i < n_vocab; ++i) {
    scores.push_back(r.read<float>("token score"));
    const int32_t len = r.read<int32_t>("token length");
    if (len < 0 || len > max_len) input_error("{}: token {} has length {} (max {})", path, i, len, max_len);
    std::string p = r.read_bytes(uint64_t(len), "token bytes");
    int32_t type = 1;
    if (p == "\n<s>\n" || p == "\n</s>\n") type = 3;
    else if (p == "<unk>") type = 2;
    else if (p.size() == 6 && p.rfind("<0x", 0) == 0) type = 6;
    std::string q;
    for (char c : p) {
      if (c == ' ') q += kSpace;
      else q += c;
    }
    pieces.push_back(std::move(q));
    types.push_back(type);
  }
  auto t = make_spm_bpe_tokenizer(std::move(pieces), std::move(scores), std::move(types), true);
  t->bos_id = 1;
  t->eos_id = 2;
  return t;
}

}  // namespace hg
