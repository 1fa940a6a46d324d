// The dataset formats: PIQA jsonl + labels, OpenBookQA jsonl, COPA jsonl, RTE TSV (the input is
// every file of the task its first byte picks), then the lm-eval requests built from them.
#include <cstring>

#include "datasets/tasks.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) {
  if (n == 0) return 0;
  const int which = data[0] % 4;
  data += 1, n -= 1;
  hg::fuzz::TempDir d;
  const char* task = "piqa";
  if (which == 0) {  // jsonl and labels split at the first NUL
    const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, n));
    const size_t a = nul ? size_t(nul - data) : n, b = std::min(n, a + 1);
    for (const char* f : {"piqa/valid.jsonl", "piqa/train.jsonl"}) d.write(f, data, a);
    for (const char* f : {"piqa/valid-labels.lst", "piqa/train-labels.lst"}) d.write(f, data + b, n - b);
  } else if (which == 1) {
    task = "openbookqa";
    for (const char* f : {"openbookqa/test.jsonl", "openbookqa/train.jsonl"}) d.write(f, data, n);
  } else if (which == 2) {
    task = "copa";
    for (const char* f : {"copa/val.jsonl", "copa/train-from-copa-dev-1-400.jsonl"}) d.write(f, data, n);
  } else {
    task = "rte";
    for (const char* f : {"rte/glue/dev.tsv", "rte/glue/train.tsv"}) d.write(f, data, n);
  }
  hg::fuzz::expect_clean([&] {
    const hg::TaskData t = hg::load_task(task, d.path());
    for (int shots : {0, 3}) (void)hg::build_requests(t, shots, 0);
  });
  return 0;
}
