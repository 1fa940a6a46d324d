// A Hugging Face directory with weights: the input is config.json and model.safetensors joined by
// kSplit (seeds: a real checkpoint's pair), so that mutations reach the checks between the two —
// tensor names, shapes and dtypes against the configured architecture, tied heads, every layer;
// and special files in the directory (make_special).
#include <sys/stat.h>

#include <filesystem>
#include <string_view>

#include "engine/formats/formats.h"
#include "fuzz_util.h"

// An input that starts with kSpecial and a digit makes one file of the directory special instead
// (its bytes still follow): 0 config.json a FIFO, 1 model.safetensors a link to /dev/zero, 2
// tokenizer.model a directory, 3 config.json a link loop. Each must be one InputError naming it.
void make_special(const std::string& dir, char which) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d(dir);
  switch (which) {
    case '0':
      fs::remove(d / "config.json", ec), (void)::mkfifo((d / "config.json").c_str(), 0600);
      break;
    case '1':
      fs::remove(d / "model.safetensors", ec), fs::create_symlink("/dev/zero", d / "model.safetensors", ec);
      break;
    case '2':
      fs::create_directory(d / "tokenizer.model", ec);
      break;
    case '3':
      fs::remove(d / "config.json", ec), fs::create_symlink(d / "config.json", d / "config.json", ec);
      break;
    default:
      break;
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  static constexpr std::string_view kSplit = "\n--hgbench-safetensors--\n", kSpecial = "@special:";
  std::string_view in(reinterpret_cast<const char*>(data), n);
  char special = 0;
  if (in.substr(0, kSpecial.size()) == kSpecial && in.size() > kSpecial.size()) {
    special = in[kSpecial.size()];
    in.remove_prefix(kSpecial.size() + 1);
    data += kSpecial.size() + 1, n -= kSpecial.size() + 1;
  }
  const size_t at = in.find(kSplit);
  if (at == std::string_view::npos) return 0;
  hg::fuzz::TempDir d;
  d.write("config.json", data, at);
  d.write("model.safetensors", data + at + kSplit.size(), n - at - kSplit.size());
  if (special) make_special(d.path(), special);
  hg::fuzz::expect_clean([&] { (void)hg::load_model("hf:" + d.path()); });
  return 0;
}
