// Tokenizer files: tokenizer.json, encoder.json + vocab.bpe (the input split at its first NUL),
// tiktoken ranks and llama2.c's tokenizer.bin; each loaded one, then used to encode and decode.
#include <cstring>

#include "engine/tokenizer/tokenizer.h"
#include "fuzz_util.h"

namespace {
void exercise(const hg::Tokenizer& t) {
  const auto ids = t.encode("Hello world, héllo 123 <|end|>\n");
  (void)t.decode(ids);
  for (auto id : ids) (void)t.piece(id, -1);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  if (n == 0) return 0;
  const uint8_t which = data[0] % 4;
  data += 1, n -= 1;
  if (which == 0) {
    hg::fuzz::MemFile f(data, n);
    hg::fuzz::expect_clean([&] { exercise(*hg::load_hf_tokenizer_json(f.path())); });
  } else if (which == 1) {
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, n));
    const size_t a = nul ? size_t(nul - data) : n;
    hg::fuzz::MemFile enc(data, a), bpe(data + std::min(n, a + 1), n - std::min(n, a + 1));
    hg::fuzz::expect_clean([&] { exercise(*hg::load_gpt2_files(enc.path(), bpe.path(), hg::PreSplit::kGpt2)); });
  } else if (which == 2) {
    hg::fuzz::MemFile f(data, n);
    hg::fuzz::expect_clean([&] { exercise(*hg::load_tiktoken(f.path(), hg::PreSplit::kQwen2)); });
  } else {
    hg::fuzz::MemFile f(data, n);
    hg::fuzz::expect_clean([&] { exercise(*hg::load_llama2c_tokenizer(f.path(), 512)); });
  }
  return 0;
}
