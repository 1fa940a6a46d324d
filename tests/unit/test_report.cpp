// `hgbench compare` and `hgbench report` over result directories written here row by row.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/error.h"
#include "experiments/runner/report.h"
#include "experiments/runner/reproduction.h"
#include "experiments/runner/result_row.h"
#include "test_util.h"

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

// Rows of one strategy at one length with the given repeat times, on `platform` (its point id
// differs with the platform, as a modeled run's does).
void write_repeats(const fs::path& d, const std::vector<double>& times, const std::string& platform, int lens = 1) {
  std::ofstream o(d / "rows.jsonl");
  for (int i = 0; i < lens; ++i)
    for (size_t k = 0; k < times.size(); ++k) {
      Json r = ResultRow::head("seqlen", fmt::format("{}-p{}", platform, i), i, "full", "full", int(k), true);
      r["time_basis"] = "measured";
      r["point"] = {{"model", "synthetic:tiny-llama"}, {"prompt_tokens", 1024}, {"batch", 1}, {"platform", platform}};
      if (lens > 1) r["point"]["gpu_kv_share"] = i;
      r["figures"] = {{"time_s", times[k]}, {"decode_token_s", times[k] / 100}};
      r["provenance"] = {{"version", "test"}};
      o << r.dump() << "\n";
    }
}

// Points match on the chosen keys (not on the platform by default), every ratio has a bootstrap
// interval from the repeats, and one that holds 1 is within the noise; one repeat gives none.
TEST(Compare, MatchesOnKeysAndMarksRatiosWithinTheNoise) {
  const fs::path a = fresh_dir("ka"), b = fresh_dir("kb"), c = fresh_dir("kc");
  write_repeats(a, {1.0, 1.1, 0.9, 1.05, 0.95}, "machine-a");
  write_repeats(b, {1.02, 0.92, 1.08, 0.98, 1.0}, "machine-b");
  CompareReport rep = compare_results(a, b);
  EXPECT_EQ(rep.matched, 1u) << rep.table;
  EXPECT_EQ(rep.within_noise, 1u) << rep.table;
  EXPECT_NE(rep.table.find("~ the interval holds 1"), std::string::npos) << rep.table;
  EXPECT_NE(rep.warnings.find("platforms differ"), std::string::npos);
  // Twice as slow, well outside the spread: an interval without 1.
  write_repeats(c, {2.0, 2.2, 1.8, 2.1, 1.9}, "machine-a");
  rep = compare_results(a, c);
  EXPECT_EQ(rep.within_noise, 0u) << rep.table;
  EXPECT_NE(rep.table.find("2.000 ["), std::string::npos) << rep.table;
  // Matched on the whole point, the platforms' points differ: nothing in common.
  EXPECT_NE(test::input_error_of([&] { compare_results(a, b, "", {}); }).find("no (point, strategy)"), std::string::npos);
  // One repeat: the ratio alone.
  write_repeats(c, {2.0}, "machine-a");
  rep = compare_results(a, c);
  EXPECT_NE(rep.table.find("n = 1: no interval"), std::string::npos) << rep.table;
  // Keys that leave two points of a side alike are an error naming them.
  write_repeats(c, {1.0, 1.0}, "machine-a", 2);
  EXPECT_NE(test::input_error_of([&] { compare_results(a, c); }).find("leaves two points"), std::string::npos);
  for (auto& d : {a, b, c}) fs::remove_all(d);
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

// Modeled rows of seqlen's shape: per label, the end-to-end seconds at the band's peak and
// achieved ends at each prompt length, and the attended fraction.
void write_band_rows(const fs::path& d, const std::map<std::string, std::pair<double, double>>& times,
                     const std::vector<int>& lens) {
  fs::create_directories(d);
  std::ofstream o(d / "rows.jsonl");
  for (size_t i = 0; i < lens.size(); ++i)
    for (auto& [label, t] : times) {
      Json r = ResultRow::head("seqlen", fmt::format("p{}", lens[i]), int(i), label, label, 0, true);
      r["time_basis"] = "modeled (dry)";
      r["point"] = {{"model", "synthetic:llama-3.1-8b?dtype=f16"}, {"prompt_tokens", lens[i]}, {"batch", 1}};
      const double k = lens[i] / 1024.0;
      r["figures"] = {
          {"time_s", t.first * k},
          {"attended", {{"fraction", label == "flexgen" ? 1.0 : 0.25}}},
          {"modeled",
           {{"band",
             {{"peak", {{"end_to_end_s", t.first * k}}}, {"achieved", {{"end_to_end_s", t.second * k}}}}}}}};
      o << r.dump() << "\n";
    }
}

// docs/reproduction.md's generated parts: computed from the rows, the prose around them kept, the
// same text from the same rows (so a rerun's diff is empty), and a bad document or a missing
// result directory an error naming it.
TEST(Reproduction, PartsComeFromTheRowsAndTheProseStays) {
  const fs::path d = fresh_dir("reproduction");
  // HybridGen twice as fast as FlexGen at peak, as fast at achieved rates; StreamingLLM 4× at both.
  write_band_rows(d / "seqlen",
                  {{"flexgen", {2.0, 4.0}}, {"hybridgen", {1.0, 4.0}}, {"streamingllm", {0.5, 1.0}}},
                  {2048, 4096});
  const std::string doc =
      "# Title\n\nProse before.\n<!-- generated: fig16 -->\nstale table\n<!-- end generated: fig16 "
      "-->\nProse after.\n"
      "<!-- generated: clock -->\nmeasured text kept\n<!-- end generated: clock -->\n";
  const ReproductionReport a = regenerate_reproduction(doc, "doc.md", d.string());
  EXPECT_EQ(a.parts, std::vector<std::string>{"fig16"});
  EXPECT_EQ(a.kept, std::vector<std::string>{"clock"});  // measured: no clock_check rows here
  EXPECT_EQ(a.text.find("stale table"), std::string::npos);
  for (const char* kept : {"# Title\n\nProse before.\n<!-- generated: fig16 -->\n",
                           "\n<!-- end generated: fig16 -->\nProse after.\n",
                           "<!-- generated: clock -->\nmeasured text kept\n<!-- end generated: clock -->\n"})
    EXPECT_NE(a.text.find(kept), std::string::npos) << kept << "\n" << a.text;
  // Speedups over FlexGen, the band lower first, the attended fraction beside them.
  EXPECT_NE(a.text.find("| llama-3.1-8b / 2K | 1.00–2.00 (0.25) | 4.00 (0.25) |"), std::string::npos)
      << a.text;
  EXPECT_NE(a.text.find("(6 rows)"), std::string::npos) << a.text;
  // HybridGen over the Pre-QKT methods: t(streamingllm) ÷ t(hybridgen) is 0.5 at peak and 0.25 at
  // achieved rates (InfiniGen has no rows), and that over the paper's 2.34.
  EXPECT_NE(
      a.text.find("| llama-3.1-8b: HybridGen over the Pre-QKT methods (InfiniGen, StreamingLLM), defaults | "
                  "2.34× | 0.25–0.50× | 0.11–0.21 | no |"),
      std::string::npos)
      << a.text;
  EXPECT_EQ(regenerate_reproduction(a.text, "doc.md", d.string()).text, a.text);
  const auto error_of = [&](const std::string& text, const std::string& results) {
    return test::input_error_of([&] { regenerate_reproduction(text, "doc.md", results); });
  };
  EXPECT_NE(error_of("x\n<!-- generated: fig99 -->\n<!-- end generated: fig99 -->\n", d.string())
                .find("doc.md:2: unknown generated part 'fig99'"),
            std::string::npos);
  EXPECT_NE(error_of("<!-- generated: fig16 -->\ntext\n", d.string())
                .find("doc.md:1: generated part 'fig16' has no"),
            std::string::npos);
  EXPECT_NE(error_of("<!-- end generated: fig16 -->\n", d.string()).find("doc.md:1:"), std::string::npos);
  EXPECT_NE(error_of(doc, (d / "none").string()).find((d / "none" / "seqlen").string() + ": no rows.jsonl"),
            std::string::npos);
  fs::remove_all(d);
}

}  // namespace
}  // namespace hg
