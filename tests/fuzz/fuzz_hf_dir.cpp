// A Hugging Face directory with weights: the input is config.json and model.safetensors joined by
// kSplit (seeds: a real checkpoint's pair), so that mutations reach the checks between the two —
// tensor names, shapes and dtypes against the configured architecture, tied heads, every layer.
#include <string_view>

#include "engine/formats/formats.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  static constexpr std::string_view kSplit = "\n--hgbench-safetensors--\n";
  const std::string_view in(reinterpret_cast<const char*>(data), n);
  const size_t at = in.find(kSplit);
  if (at == std::string_view::npos) return 0;
  hg::fuzz::TempDir d;
  d.write("config.json", data, at);
  d.write("model.safetensors", data + at + kSplit.size(), n - at - kSplit.size());
  hg::fuzz::expect_clean([&] { (void)hg::load_model("hf:" + d.path()); });
  return 0;
}
