// Reading result directories side by side and as one page: `hgbench compare DIR_A DIR_B` (matched
// points, B ÷ A per point and strategy, geometric means) and `hgbench report DIR` (one
// self-contained HTML page: the configuration, the tables, the plots that are there, provenance).
#pragma once
#include <string>
#include <vector>

namespace hg {

struct CompareReport {
  std::string table;     // what `compare` prints (also DIR/compare.txt when written)
  size_t matched = 0;    // (point, label) cells with ok rows in both
  size_t only_a = 0, only_b = 0;
  std::string warnings;  // one line each: different time bases, platforms or experiments, a run in progress
  size_t within_noise = 0;  // cells whose end-to-end interval holds 1
};

// Matches rows of `a` and `b` by label and the points' values of the keys in `match` (every value
// of the point when empty: its id) and compares end-to-end time and decode time per token: B ÷ A of
// the means over ok repeats, with a bootstrap interval when both sides have repeats. With `out`
// non-empty, writes out/compare.csv and out/compare.txt (the directory is created). InputError when
// either is not a result directory, the keys leave two points of one side alike, or no cell matches.
const std::vector<std::string>& default_compare_keys();  // model, prompt_tokens, decode_tokens, batch
CompareReport compare_results(const std::string& a, const std::string& b, const std::string& out = "",
                              const std::vector<std::string>& match = default_compare_keys());

// Writes DIR/report.html and returns its path: config.yaml, table.txt, summary.csv as a table,
// every PNG in DIR inlined (base64), the provenance of the first row, and a note of failed rows.
std::string write_report(const std::string& dir);

}  // namespace hg
