// tokenizer.model files through the SentencePiece library (Debian's libsentencepiece), and the
// byte tokenizer synthetic models use.
#include <sentencepiece_processor.h>

#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    // Read here (a regular file, at most 256 MiB), then parsed by the library from the bytes.
    const auto st = sp_.LoadFromSerializedProto(read_regular_file(path, int64_t(256) << 20));
    if (!st.ok()) input_error("{}: not a SentencePiece model: {}", path, st.ToString());
    bos_id = sp_.bos_id();
    eos_id = sp_.eos_id();
  }
  std::string kind() const override { return "sentencepiece (library)"; }
  int32_t token_id(std::string_view text) const override {
    const int id = sp_.PieceToId(text);
    return id >= 0 && id < sp_.GetPieceSize() && sp_.IsControl(id) &&
                   sp_.IdToPiece(id) == text
               ? int32_t(id)
               : -1;
  }
  int n_vocab() const override { return sp_.GetPieceSize(); }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    sp_.Encode(text, &ids);
    return {ids.begin(), ids.end()};
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v;
    for (int32_t id : ids)
      if (id >= 0 && id < sp_.GetPieceSize() && !sp_.IsControl(id)) v.push_back(id);
    std::string out;
    sp_.Decode(v, &out);
    return out;
  }
  std::string piece(int32_t id, int32_t prev) const override {
    if (id < 0 || id >= sp_.GetPieceSize() || sp_.IsControl(id)) return "";
    if (prev < 0 || sp_.IsControl(prev)) return decode(std::span<const int32_t>(&id, 1));
    // Decode the pair and drop the previous piece's text so inner spaces survive.
    const int32_t two[2] = {prev, id};
    const std::string a = decode(std::span<const int32_t>(two, 1));
    const std::string b = decode(std::span<const int32_t>(two, 2));
    return b.size() >= a.size() ? b.substr(a.size()) : b;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(int n_vocab) : n_vocab_(n_vocab) {
    bos_id = 1;
    eos_id = 2;
  }
  std::string kind() const override { return "bytes (synthetic: id = 3 + byte)"; }
  int32_t token_id(std::string_view) const override { return -1; }
  int n_vocab() const override { return n_vocab_; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    for (char c : text) out.push_back(3 + int32_t(uint8_t(c)) < n_vocab_ ? 3 + int32_t(uint8_t(c)) : 0);
    return out;
  }
  std::string piece(int32_t id, int32_t) const override {
    if (id >= 3 && id < 259) return std::string(1, char(id - 3));
    if (id >= 259) return "[" + std::to_string(id) + "]";
    return "";
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += piece(id, -1);
    return out;
  }

 private:
  int n_vocab_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

std::unique_ptr<Tokenizer> make_byte_tokenizer(int n_vocab) { return std::make_unique<ByteTokenizer>(n_vocab); }

}  // namespace hg
