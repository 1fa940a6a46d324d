// llama2.c checkpoints: the 7-int header against the file size, then the weights.
#include "engine/formats/formats.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  hg::fuzz::TempDir d;
  d.write("model.bin", data, n);
  // A tokenizer that loads, so that the model's own checks are what the input meets.
  static const uint8_t tok[] = {4, 0, 0, 0};  // max_token_length 4, no tokens
  d.write("tokenizer.bin", tok, sizeof tok);
  hg::fuzz::expect_clean([&] { (void)hg::load_model("llama2c:" + d.path() + "/model.bin"); });
  return 0;
}
