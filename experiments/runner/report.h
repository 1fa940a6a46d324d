// Reading result directories side by side and as one page: `hgbench compare DIR_A DIR_B` (matched
// points, B ÷ A per point and strategy, geometric means) and `hgbench report DIR` (one
// self-contained HTML page: the configuration, the tables, the plots that are there, provenance).
#pragma once
#include <string>

namespace hg {

struct CompareReport {
  std::string table;     // what `compare` prints (also DIR/compare.txt when written)
  size_t matched = 0;    // (point, label) cells with ok rows in both
  size_t only_a = 0, only_b = 0;
  std::string warnings;  // one line each: different time bases, platforms or experiments
};

// Matches rows of `a` and `b` by point id and label (medians over ok repeats) and compares
// end-to-end time and decode time per token. With `out` non-empty, writes out/compare.csv and
// out/compare.txt (the directory is created). InputError when either is not a result directory
// or no cell matches.
CompareReport compare_results(const std::string& a, const std::string& b, const std::string& out = "");

// Writes DIR/report.html and returns its path: config.yaml, table.txt, summary.csv as a table,
// every PNG in DIR inlined (base64), the provenance of the first row, and a note of failed rows.
std::string write_report(const std::string& dir);

}  // namespace hg
