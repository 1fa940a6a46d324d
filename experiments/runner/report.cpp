// `compare` and `report` over result directories (report.h).
#include "experiments/runner/report.h"

#include <csv.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "engine/core/atomic_file.h"
#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/runtime/bandwidth.h"
#include "experiments/runner/points.h"
#include "experiments/runner/recorder.h"

namespace hg {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

struct Cell {
  std::vector<double> time, token;
  std::string strategy, basis, platform;
};
struct Side {
  std::map<std::pair<std::string, std::string>, Cell> cells;  // (point id, label) → ok repeats
  std::map<std::string, Json> points;                           // point id → its values
  std::map<int, std::string> order;                             // point index → id
  std::vector<std::string> labels;                              // in row order
  std::string experiment;
};

// The point's values for the keys it is matched on (every key when `keys` is empty), as one text.
std::string match_key(const Json& point, const std::vector<std::string>& keys) {
  Json k = Json::object();
  for (auto& [name, v] : point.items())
    if (keys.empty() || std::find(keys.begin(), keys.end(), name) != keys.end()) k[name] = v;
  return k.dump();
}

Side load_side(const std::string& dir, const std::vector<std::string>& keys) {
  Side s;
  std::map<std::string, std::string> id_of_key;  // match key → the first point id with it
  for (const ResultRow& r : read_rows(dir)) {
    const std::string id = keys.empty() ? r.point_id : match_key(r.point, keys);
    if (!keys.empty()) {
      auto [it, fresh] = id_of_key.emplace(id, r.point_id);
      if (!fresh && it->second != r.point_id)
        input_error("compare: --match {} leaves two points of {} alike ({} and {}); add the axis that separates them",
                    fmt::format("{}", fmt::join(keys, ",")), dir, it->second, r.point_id);
    }
    const std::string& label = r.label;
    if (!r.experiment.empty()) s.experiment = r.experiment;
    if (std::find(s.labels.begin(), s.labels.end(), label) == s.labels.end()) s.labels.push_back(label);
    if (!r.ok || r.accuracy) continue;
    s.points[id] = r.point;
    s.order[r.point_index] = id;
    Cell& c = s.cells[{id, label}];
    c.time.push_back(r.figure("time_s"));
    c.token.push_back(r.figure("decode_token_s"));
    c.strategy = r.strategy;
    c.basis = r.time_basis;
    c.platform = r.point.contains("platform") && r.point["platform"].is_string() ? r.point["platform"].get<std::string>() : "";
  }
  return s;
}

double med(const std::vector<double>& v) { return v.empty() ? NAN : median(v); }

std::string ratio_text(double r) { return std::isfinite(r) ? fmt::format("{:.3f}", r) : "-"; }

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string o;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) o += t[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    o += t[(v >> 18) & 63];
    o += t[(v >> 12) & 63];
    o += i + 1 < in.size() ? t[(v >> 6) & 63] : '=';
    o += '=';
  }
  return o;
}

std::string slurp(const fs::path& p) { return read_regular_file(p.string(), int64_t(256) << 20); }

// summary.csv's records through libcsv (quoted fields as written by the recorder).
std::vector<std::vector<std::string>> read_csv(const fs::path& p) {
  struct Acc {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> cur;
  } acc;
  csv_parser parser;
  if (csv_init(&parser, CSV_APPEND_NULL) != 0) throw IoError("csv: cannot initialise the parser");
  const std::string text = slurp(p);
  auto field = [](void* s, size_t n, void* a) { static_cast<Acc*>(a)->cur.emplace_back(static_cast<char*>(s), n); };
  auto record = [](int, void* a) {
    auto* x = static_cast<Acc*>(a);
    x->rows.push_back(std::move(x->cur));
    x->cur.clear();
  };
  csv_parse(&parser, text.data(), text.size(), field, record, &acc);
  csv_fini(&parser, field, record, &acc);
  csv_free(&parser);
  return acc.rows;
}

void write_file(const fs::path& p, const std::string& text) { write_file_atomic(p.string(), text); }

// B ÷ A of the means, with a 95 % percentile bootstrap interval over both sides' repeats (2,000
// resamples, seed 1); no interval when a side has one repeat.
struct Ratio {
  double r = NAN, lo = NAN, hi = NAN;
  bool interval() const { return std::isfinite(lo) && std::isfinite(hi); }
  bool within_noise() const { return interval() && lo <= 1.0 && hi >= 1.0; }
};
Ratio ratio_of(const std::vector<double>& a, const std::vector<double>& b) {
  Ratio q;
  if (a.empty() || b.empty()) return q;
  q.r = mean(b) / mean(a);
  if (a.size() < 2 || b.size() < 2) return q;
  std::mt19937_64 rng(1);
  std::vector<double> rs;
  rs.reserve(2000);
  for (int i = 0; i < 2000; ++i) {
    double sa = 0, sb = 0;
    for (size_t j = 0; j < a.size(); ++j) sa += a[rng() % a.size()];
    for (size_t j = 0; j < b.size(); ++j) sb += b[rng() % b.size()];
    rs.push_back((sb / double(b.size())) / (sa / double(a.size())));
  }
  std::sort(rs.begin(), rs.end());
  q.lo = rs[size_t(0.025 * double(rs.size()))], q.hi = rs[size_t(0.975 * double(rs.size())) - 1];
  return q;
}

// Whether another process holds `dir`'s writer lock (a run still writing it).
bool being_written(const std::string& dir) {
  const std::string path = dir + "/.lock";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);
  return held;
}

}  // namespace

const std::vector<std::string>& default_compare_keys() {
  static const std::vector<std::string> k = {"model", "prompt_tokens", "decode_tokens", "batch"};
  return k;
}

CompareReport compare_results(const std::string& a_dir, const std::string& b_dir, const std::string& out,
                              const std::vector<std::string>& match) {
  const Side a = load_side(a_dir, match), b = load_side(b_dir, match);
  CompareReport rep;
  for (const std::string& d : {a_dir, b_dir})
    if (being_written(d)) rep.warnings += fmt::format("compare: {} is still being written (a run in progress)\n", d);
  // Labels of both, A's order first; points of both, by id.
  std::vector<std::string> labels = a.labels;
  for (auto& l : b.labels)
    if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
  std::map<int, Json> pts;  // for the varying axes: every point of either side
  std::vector<std::string> ids;
  for (const Side* s : {&a, &b})
    for (auto& [index, id] : s->order)
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) {
        ids.push_back(id);
        pts[int(pts.size())] = s->points.at(id);
      }
  const std::vector<std::string> varying = varying_axes(pts);
  std::set<std::string> bases, platforms;
  for (const Side* s : {&a, &b})
    for (auto& [k, c] : s->cells) bases.insert(c.basis), platforms.insert(c.platform);
  if (a.experiment != b.experiment)
    rep.warnings += fmt::format("compare: different experiments ({} and {})\n", a.experiment, b.experiment);
  if (bases.size() > 1) {
    std::string v;
    for (auto& x : bases) v += (v.empty() ? "" : ", ") + x;
    rep.warnings += fmt::format("compare: the rows' time bases differ ({}): ratios mix modeled and measured time\n", v);
  }
  if (platforms.size() > 1) {
    std::string v;
    for (auto& x : platforms) v += (v.empty() ? "" : ", ") + x;
    rep.warnings += fmt::format("compare: the rows' platforms differ ({})\n", v);
  }

  struct Match {
    std::string id, label, name;
    double ta, tb, ka, kb;
    Ratio time, token;
  };
  std::vector<Match> m;
  for (auto& id : ids)
    for (auto& l : labels) {
      const auto ia = a.cells.find({id, l}), ib = b.cells.find({id, l});
      if (ia == a.cells.end() && ib == b.cells.end()) continue;
      if (ia == a.cells.end()) {
        ++rep.only_b;
        continue;
      }
      if (ib == b.cells.end()) {
        ++rep.only_a;
        continue;
      }
      const Json& pj = a.points.count(id) ? a.points.at(id) : b.points.at(id);
      m.push_back({id, l, point_name(pj, varying), med(ia->second.time), med(ib->second.time), med(ia->second.token),
                   med(ib->second.token), ratio_of(ia->second.time, ib->second.time),
                   ratio_of(ia->second.token, ib->second.token)});
    }
  rep.matched = m.size();
  if (m.empty())
    input_error("compare: {} and {} have no (point, strategy) with a finished row in both (matched on {}; --match "
                "chooses the keys)",
                a_dir, b_dir, match.empty() ? std::string("the whole point") : fmt::format("{}", fmt::join(match, ", ")));

  // Table: strategies down, points across, B ÷ A end-to-end time, geometric mean last; then the
  // same for decode time per token.
  std::vector<std::string> names;
  for (auto& x : m)
    if (std::find(names.begin(), names.end(), x.name) == names.end()) names.push_back(x.name);
  size_t w0 = 16;
  for (auto& l : labels) w0 = std::max(w0, l.size() + 1);
  std::vector<size_t> widths;
  for (auto& n : names) widths.push_back(std::max<size_t>(21, n.size() + 1));
  bool any_single = false, any_noise = false;
  // A ratio with its interval; "~" marks one whose interval holds 1 (within the noise).
  auto cell = [&](const Ratio& q) {
    if (!std::isfinite(q.r)) return std::string("-");
    if (!q.interval()) return any_single = true, ratio_text(q.r);
    any_noise = any_noise || q.within_noise();
    return fmt::format("{:.3f} [{:.2f}–{:.2f}]{}", q.r, q.lo, q.hi, q.within_noise() ? "~" : " ");
  };
  auto block = [&](const std::string& title, bool token) {
    std::string o = title + "\n";
    if (const std::string axes = axes_caption(varying); !axes.empty()) o += "columns: " + axes + "\n";
    o += fmt::format("{:<{}}", "strategy", w0);
    for (size_t i = 0; i < names.size(); ++i) o += fmt::format("{:>{}}", names[i], widths[i]);
    o += fmt::format("{:>9}\n", "geomean");
    for (auto& l : labels) {
      std::string line = fmt::format("{:<{}}", l, w0);
      double logsum = 0;
      int n = 0;
      for (size_t i = 0; i < names.size(); ++i) {
        Ratio q;
        for (auto& x : m)
          if (x.label == l && x.name == names[i]) q = token ? x.token : x.time;
        line += fmt::format("{:>{}}", cell(q), widths[i]);
        if (std::isfinite(q.r) && q.r > 0) logsum += std::log(q.r), ++n;
      }
      if (n) o += line + fmt::format("{:>9}\n", ratio_text(std::exp(logsum / n)));
    }
    return o;
  };
  std::string basis;
  for (auto& x : bases) basis += (basis.empty() ? "" : ", ") + x;
  rep.table = fmt::format("B = {} against A = {}: B ÷ A of the mean over repeats per point (below 1: B is faster), "
                          "[95 % bootstrap interval over both sides' repeats]; time basis: {}; matched on {}\n\n",
                          b_dir, a_dir, basis,
                          match.empty() ? std::string("the whole point") : fmt::format("{}", fmt::join(match, ", "))) +
              block("end-to-end latency (prefill + decode), B ÷ A", false) + "\n" +
              block("decode time per token, B ÷ A", true);
  if (any_noise) rep.table += "\n~ the interval holds 1: B and A differ by less than their run-to-run noise\n";
  if (any_single) rep.table += "\na ratio without an interval: a side has one repeat (n = 1: no interval)\n";
  size_t fewest = SIZE_MAX;
  for (const Side* s : {&a, &b})
    for (auto& [k, c] : s->cells) fewest = std::min(fewest, c.time.size());
  if (fewest >= 2 && fewest < 5)
    rep.table += fmt::format("\nintervals from {} repeats a side understate the noise (a bootstrap of so few runs); "
                             "5 or more for a claim\n", fewest);
  for (auto& x : m) rep.within_noise += x.time.within_noise();
  if (rep.only_a || rep.only_b)
    rep.table += fmt::format("\n{} (point, strategy) cells only in A, {} only in B (not compared)\n", rep.only_a,
                             rep.only_b);

  if (!out.empty()) {
    fs::create_directories(out);
    const fs::path csv = fs::path(out) / "compare.csv";
    AtomicFile csv_file(csv.string());
    FILE* f = csv_file.file();
    auto row = [&](const std::vector<std::string>& v) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) std::fputc(',', f);
        csv_fwrite(f, v[i].data(), v[i].size());
      }
      std::fputc('\n', f);
    };
    row({"point_id", "point", "label", "a_time_s", "b_time_s", "b_over_a", "a_decode_token_s", "b_decode_token_s",
         "b_over_a_decode_token", "b_over_a_mean", "b_over_a_lo", "b_over_a_hi", "within_noise"});
    auto g = [](double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : std::string(); };
    for (auto& x : m)
      row({x.id, x.name, x.label, g(x.ta), g(x.tb), g(x.tb / x.ta), g(x.ka), g(x.kb), g(x.kb / x.ka), g(x.time.r),
           g(x.time.lo), g(x.time.hi), x.time.interval() ? (x.time.within_noise() ? "yes" : "no") : ""});
    csv_file.commit();
    write_file(fs::path(out) / "compare.txt", rep.warnings + rep.table);
  }
  return rep;
}

std::string write_report(const std::string& dir) {
  const std::vector<ResultRow> rows = read_rows(dir);
  if (rows.empty()) input_error("report: {}/rows.jsonl has no rows", dir);
  size_t failed = 0;
  for (auto& r : rows) failed += !r.ok;
  const fs::path d(dir);
  const ResultRow& first = rows.front();
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>hgbench report: " +
       html_escape(first.experiment) + "</title>\n<style>body{font-family:sans-serif;max-width:72em;"
       "margin:1em auto;padding:0 1em}pre{background:#f6f6f6;padding:.6em;overflow-x:auto}table{border-collapse:"
       "collapse;font-size:.8em}td,th{border:1px solid #ccc;padding:.15em .4em;text-align:right}th{background:#eee}"
       "img{max-width:100%}</style></head><body>\n";
  h += "<h1>" + html_escape(first.experiment) + "</h1>\n";
  const std::string basis = first.time_basis;
  h += fmt::format("<p id=\"summary\">{} rows ({} failed); time basis: <b>{}</b>{}.</p>\n", rows.size(), failed,
                   html_escape(basis),
                   basis.rfind("modeled", 0) == 0 ? " — MODELED on a platform profile, not measured" : "");
  if (fs::exists(d / "table.txt")) h += "<h2>Tables</h2>\n<pre id=\"table\">" + html_escape(slurp(d / "table.txt")) + "</pre>\n";
  std::vector<fs::path> pngs;
  for (auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".png") pngs.push_back(e.path());
  std::sort(pngs.begin(), pngs.end());
  if (!pngs.empty()) h += "<h2>Plots</h2>\n";
  for (auto& p : pngs)
    h += "<figure><img alt=\"" + html_escape(p.filename().string()) + "\" src=\"data:image/png;base64," +
         base64(slurp(p)) + "\"><figcaption>" + html_escape(p.filename().string()) + "</figcaption></figure>\n";
  if (pngs.empty()) h += "<p>No plots in the directory (<code>scripts/plot " + html_escape(dir) + "</code> draws them).</p>\n";
  if (fs::exists(d / "summary.csv")) {
    h += "<h2>summary.csv</h2>\n<div style=\"overflow-x:auto\"><table id=\"summary-csv\">\n";
    bool head = true;
    for (auto& rec : read_csv(d / "summary.csv")) {
      h += "<tr>";
      for (auto& c : rec) h += (head ? "<th>" : "<td>") + html_escape(c) + (head ? "</th>" : "</td>");
      h += "</tr>\n";
      head = false;
    }
    h += "</table></div>\n";
  }
  if (failed) {
    h += "<h2>Failed rows</h2>\n<ul>\n";
    for (auto& r : rows)
      if (!r.ok)
        h += "<li>" + html_escape(r.point_id + " " + r.label + ": " + r.reason) +
             "</li>\n";
    h += "</ul>\n";
  }
  if (fs::exists(d / "config.yaml")) h += "<h2>Configuration (config.yaml)</h2>\n<pre>" + html_escape(slurp(d / "config.yaml")) + "</pre>\n";
  if (first.json.contains("provenance"))
    h += "<h2>Provenance (first row)</h2>\n<pre id=\"provenance\">" + html_escape(first.json["provenance"].dump(2)) + "</pre>\n";
  h += "</body></html>\n";
  const fs::path out = d / "report.html";
  write_file(out, h);
  return out.string();
}

}  // namespace hg
