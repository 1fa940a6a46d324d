// safetensors: the 8-byte header length, the JSON header, dtypes, shapes and data offsets against the
// file size, and loading every tensor it declares.
#include "engine/formats/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  hg::fuzz::MemFile f(data, n);
  hg::fuzz::expect_clean([&] {
    hg::SafetensorsFile s(f.path());
    for (auto& [name, e] : s.entries()) (void)s.load(e, hg::DType::kF32);
  });
  return 0;
}
