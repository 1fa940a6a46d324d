// Shared tokenizer helpers: prompt encoding and GPT-2's byte ↔ unicode table.
#include "engine/tokenizer/tokenizer.h"

#include <array>

#include "engine/core/error.h"

namespace hg {

void check_tokenizer(const Tokenizer& t, const std::string& where) {
  const int n = t.n_vocab();
  if (n < 1) input_error("{}: the tokenizer has no tokens", where);
  for (auto [name, id] : {std::pair{"bos_token_id", t.bos_id}, {"eos_token_id", t.eos_id}})
    if (id < -1 || id >= n) input_error("{}: {} {} is not a token of the tokenizer's {}", where, name, id, n);
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<int32_t> ids;
  if (add_bos && bos_id >= 0) ids.push_back(bos_id);
  auto t = encode(text);
  ids.insert(ids.end(), t.begin(), t.end());
  return ids;
}

namespace {
std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

struct ByteMap {
  std::array<std::string, 256> fwd;
  std::unordered_map<std::string, uint8_t> inv;
  ByteMap() {
    // Printable bytes map to themselves; the rest to U+0100 onwards, in byte order.
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      fwd[size_t(b)] = utf8(printable ? uint32_t(b) : next++);
      inv[fwd[size_t(b)]] = uint8_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().fwd[b]; }

bool unicode_to_bytes(std::string_view s, std::string* out) {
  const auto& inv = byte_map().inv;
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = uint8_t(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    auto it = inv.find(std::string(s.substr(i, len)));
    if (it == inv.end()) return false;
    out->push_back(char(it->second));
    i += len;
  }
  return true;
}

}  // namespace hg
