// Experiment files through the strict schema, their expansion, and platform profiles.
#include <string>

#include "engine/runtime/clock.h"
#include "experiments/runner/spec.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  const std::string text(reinterpret_cast<const char*>(data), n);
  hg::fuzz::expect_clean([&] { (void)hg::expand(hg::parse_experiment(text, "fuzz.yaml")); });
  hg::fuzz::MemFile f(data, n);
  hg::fuzz::expect_clean([&] { (void)hg::load_platform(f.path(), "/nonexistent"); });
  return 0;
}
