// GGUF: header, key/values, tensor table (offsets, types and shapes against the file size), the
// embedded tokenizer, and a whole model load from the file.
#include "engine/formats/formats.h"
#include "engine/formats/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  hg::fuzz::MemFile f(data, n);
  hg::fuzz::expect_clean([&] {
    hg::GgufFile g(f.path());
    for (auto& t : g.tensors()) (void)g.load(t, hg::DType::kF32);
  });
  hg::fuzz::expect_clean([&] { (void)hg::load_gguf_tokenizer(f.path())->encode("Hello world, 123!"); });
  hg::fuzz::expect_clean([&] { (void)hg::load_model("gguf:" + f.path()); });
  return 0;
}
