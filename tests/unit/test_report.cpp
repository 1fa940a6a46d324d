// `hgbench compare` and `hgbench report` over result directories written here row by row.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "experiments/runner/report.h"
#include "experiments/runner/result_row.h"

namespace hg {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("hg_report_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Rows of `labels` at prompt lengths `lens`: time = scale · (1 + index of the label) · length / 1024.
void write_rows(const fs::path& d, const std::vector<std::string>& labels, const std::vector<int>& lens, double scale,
                const std::string& basis = "measured", const std::string& failed_label = "") {
  std::ofstream o(d / "rows.jsonl");
  for (size_t i = 0; i < lens.size(); ++i)
    for (size_t j = 0; j < labels.size(); ++j) {
      Json r = ResultRow::head("seqlen", fmt::format("p{}", lens[i]), int(i), labels[j], labels[j], 0,
                               labels[j] != failed_label);
      r["time_basis"] = basis;
      r["point"] = {{"model", "synthetic:tiny-llama"}, {"prompt_tokens", lens[i]}, {"batch", 1}, {"platform", ""}};
      if (labels[j] == failed_label) {
        r["reason"] = "out of memory <gpu>";
      } else {
        const double t = scale * double(1 + j) * lens[i] / 1024.0;
        r["figures"] = {{"time_s", t}, {"decode_token_s", t / 100}};
        r["provenance"] = {{"version", "test"}};
      }
      o << r.dump() << "\n";
    }
}

TEST(Compare, MatchesPointsAndStrategiesAndWritesRatios) {
  const fs::path a = fresh_dir("a"), b = fresh_dir("b"), out = fresh_dir("out");
  write_rows(a, {"full", "hybridgen", "h2o"}, {1024, 4096}, 1.0);
  write_rows(b, {"full", "hybridgen", "infinigen"}, {1024, 4096, 16384}, 2.0);
  const CompareReport rep = compare_results(a, b, out);
  EXPECT_EQ(rep.matched, 4u);  // full and hybridgen at 1024 and 4096
  EXPECT_EQ(rep.only_a, 2u);   // h2o at both lengths
  EXPECT_EQ(rep.only_b, 5u);   // infinigen at all three lengths, full and hybridgen at 16384
  EXPECT_NE(rep.table.find("2.000"), std::string::npos) << rep.table;
  EXPECT_NE(rep.table.find("columns: prompt_tokens"), std::string::npos) << rep.table;
  EXPECT_EQ(rep.table.find("h2o "), std::string::npos) << "a strategy with no match has no line:\n" << rep.table;
  std::ifstream csv(out / "compare.csv");
  std::string head, line;
  std::getline(csv, head);
  EXPECT_NE(head.find("\"b_over_a\""), std::string::npos) << head;
  int n = 0;
  while (std::getline(csv, line)) {
    ++n;
    EXPECT_NE(line.find(",\"2\",\""), std::string::npos) << line;  // b_over_a
  }
  EXPECT_EQ(n, 4);
  EXPECT_TRUE(fs::exists(out / "compare.txt"));
  for (auto& d : {a, b, out}) fs::remove_all(d);
}

TEST(Compare, SaysWhenTimeBasesDifferAndFailsWithNothingInCommon) {
  const fs::path a = fresh_dir("c"), b = fresh_dir("d");
  write_rows(a, {"full"}, {1024}, 1.0, "measured");
  write_rows(b, {"full"}, {1024}, 1.0, "modeled (dry)");
  EXPECT_NE(compare_results(a, b).warnings.find("time bases differ"), std::string::npos);
  write_rows(b, {"hybridgen"}, {1024}, 1.0);
  EXPECT_THROW(compare_results(a, b), InputError);
  EXPECT_THROW(compare_results(a, a / "missing"), InputError);
  for (auto& d : {a, b}) fs::remove_all(d);
}

TEST(Report, OnePageWithTablesPlotsFailedRowsAndProvenance) {
  const fs::path d = fresh_dir("r");
  write_rows(d, {"full", "hybridgen", "keyformer"}, {1024}, 1.0, "measured", "keyformer");
  std::ofstream(d / "table.txt") << "strategy 1024\nfull 1.00\nhybridgen <0.5>\n";
  std::ofstream(d / "summary.csv") << "label,time_s_median\nfull,1\n\"hybrid,gen\",2\n";
  std::ofstream(d / "normalized.png", std::ios::binary) << std::string("\x89PNG\r\n\x1a\nabc", 11);
  std::ofstream(d / "config.yaml") << "name: seqlen\n";
  const std::string path = write_report(d);
  std::ifstream in(path);
  const std::string html((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(html.find("<pre id=\"table\">"), std::string::npos);
  EXPECT_NE(html.find("hybridgen &lt;0.5&gt;"), std::string::npos) << "escaped";
  EXPECT_NE(html.find("<td>hybrid,gen</td>"), std::string::npos) << "summary.csv parsed as CSV";
  EXPECT_NE(html.find("data:image/png;base64,iVBORw0KGgphYmM="), std::string::npos) << "the PNG inlined";
  EXPECT_NE(html.find("out of memory &lt;gpu&gt;"), std::string::npos) << "failed rows listed";
  EXPECT_NE(html.find("id=\"provenance\""), std::string::npos);
  EXPECT_NE(html.find("3 rows (1 failed)"), std::string::npos);
  // In a real browser when Debian's chromium is there: the page parses and holds the table.
  const char* browsers[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser"};
  std::string browser;
  for (auto b : browsers)
    if (fs::exists(b)) browser = b;
  if (browser.empty()) {
    fs::remove_all(d);
    GTEST_SKIP() << "the headless-browser check needs Debian's chromium (apt-get install chromium); skipped";
  }
  const std::string dom = (d / "dom.html").string();
  const std::string cmd = browser + " --headless --no-sandbox --disable-gpu --dump-dom 'file://" + path + "' > '" +
                          dom + "' 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream dm(dom);
  const std::string got((std::istreambuf_iterator<char>(dm)), {});
  EXPECT_NE(got.find("id=\"summary-csv\""), std::string::npos);
  EXPECT_NE(got.find("<img"), std::string::npos);
  fs::remove_all(d);
}

}  // namespace
}  // namespace hg
