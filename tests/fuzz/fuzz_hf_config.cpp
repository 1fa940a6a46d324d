// A Hugging Face directory's config.json (architecture, shapes, RoPE scaling) as load_model reads it.
#include "engine/formats/formats.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  hg::fuzz::TempDir d;
  d.write("config.json", data, n);
  hg::fuzz::expect_clean([&] { (void)hg::load_model("hf:" + d.path()); });
  return 0;
}
