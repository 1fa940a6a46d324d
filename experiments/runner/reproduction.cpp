// The generated parts of docs/reproduction.md (reproduction.h). Every figure here is a ratio of
// two modeled times at one end of the clock's band (datasheet peak without fixed costs; achieved
// rates with measured fixed costs), printed as "lower–higher" as table.txt prints it.
#include "experiments/runner/reproduction.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "experiments/runner/recorder.h"

namespace hg {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr const char* kEnds[] = {"peak", "achieved"};
// "Agrees": hgbench's factor within ±30 % of the paper's, at both ends of the band.
constexpr double kAgreeLo = 0.77, kAgreeHi = 1.30;

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One result directory's ok modeled rows: per point and label, the median of each band end's
// end-to-end time and of the attended fraction over the repeats.
struct Results {
  std::string dir, experiment;
  std::vector<std::string> labels;  // in the order rows first name them
  std::map<int, Json> points;       // point_index → the point's recorded values
  std::map<std::pair<int, std::string>, std::array<std::vector<double>, 3>> raw;
  size_t rows = 0, failed = 0;          // ok modeled rows; failed rows (left out)
  std::map<std::string, int> failures;  // failed rows by kind of reason

  // The median end-to-end seconds of `label` at point `pi` at one end; NaN when absent.
  double time(int pi, const std::string& label, const char* end) const {
    auto it = raw.find({pi, label});
    return it == raw.end() ? NAN : median(it->second[std::string(end) == "peak" ? 0 : 1]);
  }
  double attended(int pi, const std::string& label) const {
    auto it = raw.find({pi, label});
    return it == raw.end() ? NAN : median(it->second[2]);
  }
  bool has(const std::string& label) const {
    return std::find(labels.begin(), labels.end(), label) != labels.end();
  }
  std::vector<int> point_indices() const {
    std::vector<int> v;
    for (auto& [pi, _] : points) v.push_back(pi);
    return v;
  }
  // The points whose `key` equals `value`.
  std::vector<int> where(const std::string& key, const Json& value) const {
    std::vector<int> v;
    for (auto& [pi, p] : points)
      if (p.contains(key) && p[key] == value) v.push_back(pi);
    return v;
  }
  // The distinct values of a point key, in point order.
  std::vector<Json> values(const std::string& key) const {
    std::vector<Json> v;
    for (auto& [pi, p] : points)
      if (p.contains(key) && std::find(v.begin(), v.end(), p[key]) == v.end()) v.push_back(p[key]);
    return v;
  }
};

Results load(const std::string& results, const std::string& name) {
  Results r;
  r.dir = results + "/" + name;
  if (!fs::exists(r.dir + "/rows.jsonl"))
    input_error("{}: no rows.jsonl (scripts/reproduce runs experiments/{}.yaml into it)", r.dir, name);
  for (const ResultRow& row : read_rows(r.dir)) {
    if (!row.ok) {
      ++r.failed;
      ++r.failures[row.reason.find("positions") != std::string::npos
                       ? "a context beyond the model's positions"
                   : row.reason.find("KV budget") != std::string::npos ? "a KV over the accelerator's budget"
                                                                       : row.reason.substr(0, 60)];
      continue;
    }
    const double pk = band_time(row, "peak"), ac = band_time(row, "achieved");
    if (std::isnan(pk) || std::isnan(ac)) continue;
    ++r.rows;
    r.experiment = row.experiment;
    if (!r.has(row.label)) r.labels.push_back(row.label);
    r.points.emplace(row.point_index, row.point);
    auto& c = r.raw[{row.point_index, row.label}];
    c[0].push_back(pk);
    c[1].push_back(ac);
    const Json::json_pointer att("/figures/attended/fraction");
    if (row.json.contains(att) && row.json.at(att).is_number()) c[2].push_back(row.json.at(att).get<double>());
  }
  if (r.rows == 0) input_error("{}: no ok modeled rows with a band (a modeled clock's rows are needed)", r.dir);
  return r;
}

// "synthetic:qwen2.5-7b?dtype=f16" → "qwen2.5-7b"; a file path → its stem.
std::string model_name(const Json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.rfind("synthetic:", 0) == 0) s = s.substr(10);
  if (auto q = s.find('?'); q != std::string::npos) s = s.substr(0, q);
  if (s.find('/') != std::string::npos) s = fs::path(s).stem().string();
  return s;
}
std::string tokens(const Json& v) {
  const int64_t n = v.get<int64_t>();
  return n % 1024 == 0 ? fmt::format("{}K", n / 1024) : std::to_string(n);
}

std::string md_table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& body) {
  std::string out = "|";
  for (auto& h : head) out += " " + h + " |";
  out += "\n|";
  for (size_t i = 0; i < head.size(); ++i) out += "---|";
  out += "\n";
  for (auto& row : body) {
    out += "|";
    for (auto& c : row) out += " " + c + " |";
    out += "\n";
  }
  return out;
}

std::string band_or_na(double a, double b) { return std::isfinite(a) && std::isfinite(b) ? band_text(a, b) : "n/a"; }

// t(base) ÷ t(label) at one end: the speedup of `label` over `base` (higher is better).
double speedup(const Results& r, int pi, const std::string& base, const std::string& label, const char* end) {
  return r.time(pi, base, end) / r.time(pi, label, end);
}

// A table of every label's speedup over `base`, one row per point (`row_name` names it); each cell
// the band and, in parentheses, the mean attended fraction of the context.
std::string speedup_table(const Results& r, const std::string& base, const std::string& first_col,
                          const std::function<std::string(const Json&)>& row_name) {
  std::vector<std::string> head = {first_col};
  for (auto& l : r.labels)
    if (l != base) head.push_back(l);
  std::vector<std::vector<std::string>> body;
  for (int pi : r.point_indices()) {
    std::vector<std::string> row = {row_name(r.points.at(pi))};
    for (auto& l : r.labels) {
      if (l == base) continue;
      const double a = r.attended(pi, l);
      row.push_back(band_or_na(speedup(r, pi, base, l, "peak"), speedup(r, pi, base, l, "achieved")) +
                    (std::isfinite(a) ? fmt::format(" ({:.2f})", a) : ""));
    }
    body.push_back(row);
  }
  return md_table(head, body);
}

// HybridGen's geometric mean speedup over `other` across points `pts` at one end.
double geomean_over(const Results& r, const std::vector<int>& pts, const std::string& hg, const std::string& other,
                    const char* end) {
  double s = 0;
  int n = 0;
  for (int pi : pts)
    if (const double x = speedup(r, pi, other, hg, end); std::isfinite(x) && x > 0) s += std::log(x), ++n;
  return n ? std::exp(s / n) : NAN;
}

// A comparison with the paper: its factor and hgbench's at both ends.
struct Claim {
  std::string what;
  double paper;
  std::function<double(const char* end)> factor;
};
std::string claims_table(const std::string& paper_col, const std::vector<Claim>& claims) {
  std::vector<std::vector<std::string>> body;
  for (auto& c : claims) {
    const double p = c.factor("peak"), a = c.factor("achieved");
    const auto in = [](double x) { return x >= kAgreeLo && x <= kAgreeHi; };
    const bool ip = std::isfinite(p) && in(p / c.paper), ia = std::isfinite(a) && in(a / c.paper);
    const std::string agrees = ip && ia ? "yes" : ip ? "at peak only" : ia ? "at achieved only" : "no";
    body.push_back({c.what, fmt::format("{:.2f}×", c.paper), band_or_na(p, a) + "×",
                    band_or_na(p / c.paper, a / c.paper), agrees});
  }
  return md_table({"comparison", paper_col, "hgbench (MODELED, band)", "hgbench ÷ paper", "agrees"}, body);
}

// HybridGen's factor over the fastest of `others` per point, maximised over the points: t(o) ÷ t(hg).
std::function<double(const char*)> up_to(const Results& r, std::vector<int> pts, std::string hg,
                                         std::vector<std::string> others) {
  return [&r, pts, hg, others](const char* end) {
    double best = NAN;
    for (int pi : pts)
      for (auto& o : others)
        if (const double s = speedup(r, pi, o, hg, end); std::isfinite(s)) best = std::isnan(best) ? s : std::max(best, s);
    return best;
  };
}
std::function<double(const char*)> geo(const Results& r, std::vector<int> pts, std::string hg, std::string other) {
  return [&r, pts, hg, other](const char* end) { return geomean_over(r, pts, hg, other, end); };
}

// "; N failed rows left out (k: why, …)" when there are failed rows.
std::string failed_text(const Results& r) {
  if (!r.failed) return "";
  std::string why;
  for (auto& [w, n] : r.failures) why += (why.empty() ? "" : ", ") + fmt::format("{} {}", n, w);
  return fmt::format("; {} failed rows left out: {}", r.failed, why);
}

std::string header(const Results& r, const std::string& yaml, const std::string& what) {
  return fmt::format("`scripts/hgbench experiments/{}` ({} rows{}): {}.\n\n", yaml, r.rows, failed_text(r),
                     what);
}

const char* kSpeedupNote =
    "speedup over FlexGen (its end-to-end time over the method's; higher is better), each cell the band between "
    "the clock's two ends (lower first), and in parentheses the mean attended fraction of the context per decode "
    "step";

std::string fig16(const std::string& results) {
  const Results r = load(results, "seqlen");
  std::string out = header(r, "seqlen.yaml", kSpeedupNote);
  out += speedup_table(r, "flexgen", "model / tokens", [](const Json& p) {
    return model_name(p["model"]) + " / " + tokens(p["prompt_tokens"]);
  });
  out += "\nBeside the paper (§5.2.2: up to 1.82× / 2.34× over the Pre-QKT and 2.66× / 3.18× over the Post-QKT "
         "methods for Qwen2.5-7B / Llama-3.1-8B; \"up to\" read as the best length and the better of the two "
         "methods):\n\n";
  std::vector<Claim> claims;
  for (const Json& m : r.values("model")) {
    const std::string name = model_name(m);
    const bool qwen = name.find("qwen") != std::string::npos;
    const auto pts = r.where("model", m);
    claims.push_back({name + ": HybridGen over the Pre-QKT methods (InfiniGen, StreamingLLM), defaults",
                      qwen ? 1.82 : 2.34, up_to(r, pts, "hybridgen", {"infinigen", "streamingllm"})});
    claims.push_back({name + ": same, matched budget 0.2", qwen ? 1.82 : 2.34,
                      up_to(r, pts, "hybridgen@0.2", {"infinigen", "streamingllm@0.2"})});
    claims.push_back({name + ": HybridGen over the Post-QKT methods (Keyformer, H2O), defaults", qwen ? 2.66 : 3.18,
                      up_to(r, pts, "hybridgen", {"keyformer", "h2o"})});
    claims.push_back({name + ": same, matched budget 0.2", qwen ? 2.66 : 3.18,
                      up_to(r, pts, "hybridgen@0.2", {"keyformer@0.2", "h2o"})});
  }
  return out + claims_table("paper", claims);
}

// Times within this share of each other are a tie: the eviction methods at one attended fraction
// differ by less (their transfers hide under the same weight reads).
constexpr double kTie = 1e-3;

// The labels (among `labels`) within kTie of the fastest at point `pi` and one end.
std::vector<std::string> fastest(const Results& r, int pi, const std::vector<std::string>& labels, const char* end) {
  double bt = INFINITY;
  for (auto& l : labels) bt = std::min(bt, r.time(pi, l, end));
  std::vector<std::string> v;
  for (auto& l : labels)
    if (r.time(pi, l, end) <= bt * (1 + kTie)) v.push_back(l);
  return v;
}

// Per end, at how many points each label is the fastest (among `labels`; a tie counts for each).
std::map<std::string, std::array<int, 2>> fastest_counts(const Results& r, const std::vector<std::string>& labels) {
  std::map<std::string, std::array<int, 2>> n;
  for (int e = 0; e < 2; ++e)
    for (int pi : r.point_indices())
      for (auto& l : fastest(r, pi, labels, kEnds[e])) ++n[l][size_t(e)];
  return n;
}

// "label n, …", most first; "none" when empty.
std::string counted(const std::map<std::string, int>& c) {
  std::vector<std::pair<int, std::string>> v;
  for (auto& [l, n] : c) v.push_back({-n, l});
  std::sort(v.begin(), v.end());
  std::string o;
  for (auto& [n, l] : v) o += (o.empty() ? "" : ", ") + fmt::format("{} {}", l, -n);
  return o.empty() ? std::string("none") : o;
}

// counted() of one end of fastest_counts().
std::string counts_text(const std::map<std::string, std::array<int, 2>>& n, int e) {
  std::map<std::string, int> c;
  for (auto& [l, k] : n)
    if (k[size_t(e)]) c[l] = k[size_t(e)];
  return counted(c);
}

// At how many points `full@fits` is the fastest of every label, per end ({0, 0} without it).
std::array<int, 2> fits_fastest(const Results& r) {
  if (!r.has("full@fits")) return {0, 0};
  const auto n = fastest_counts(r, r.labels);
  return n.count("full@fits") ? n.at("full@fits") : std::array<int, 2>{0, 0};
}

// "over X a–b×, …": HybridGen's geometric mean over each of `others` present in r, the band lower first.
std::string geomeans_text(const Results& r, const std::vector<int>& pts,
                          const std::vector<std::string>& others, const char* prefix) {
  std::string g;
  for (auto& o : others)
    if (r.has(o))
      g +=
          (g.empty() ? "" : ", ") + fmt::format("{}{} {}×", prefix, o,
                                                band_or_na(geomean_over(r, pts, "hybridgen", o, "peak"),
                                                           geomean_over(r, pts, "hybridgen", o, "achieved")));
  return g;
}

std::vector<std::string> paper_regime(const Results& r) {
  std::vector<std::string> v;
  for (auto& l : r.labels)
    if (l.find("@fits") == std::string::npos) v.push_back(l);
  return v;
}

std::string fig15(const std::string& results) {
  const Results r = load(results, "models");
  std::string out = header(r, "models.yaml", kSpeedupNote);
  out += speedup_table(r, "flexgen", "model", [](const Json& p) { return model_name(p["model"]); });
  const auto all = r.point_indices();
  const auto n = fastest_counts(r, paper_regime(r));
  out += fmt::format("\nFastest method per model (the budget's regime; `full@fits` left out; times within {:g} % "
                     "of the fastest count as a tie, for each): at peak {}; at achieved rates {}.",
                     100 * kTie,
                     counts_text(n, 0), counts_text(n, 1));
  if (r.has("full@fits")) {
    const auto c = fits_fastest(r);
    out += fmt::format(" With `full@fits` (the whole KV on the accelerator) in: it is the fastest on {} of {} at "
                       "peak and {} of {} at achieved rates.",
                       c[0], all.size(), c[1], all.size());
  }
  out += "\n\n";
  std::vector<Claim> claims = {
      {"HybridGen over InfiniGen, geomean of models", 1.41, geo(r, all, "hybridgen", "infinigen")},
      {"HybridGen over Keyformer, geomean, defaults", 1.86, geo(r, all, "hybridgen", "keyformer")},
      {"HybridGen over Keyformer, geomean, matched budget 0.2", 1.86, geo(r, all, "hybridgen@0.2", "keyformer@0.2")},
      {"HybridGen over the faster of FlexGen and MoE-Lightning, best model (\"up to\")", 3.20,
       [&r, all](const char* end) {
         double best = NAN;
         for (int pi : all) {
           const double o = std::min(r.time(pi, "flexgen", end), r.time(pi, "moe_lightning", end));
           const double s = o / r.time(pi, "hybridgen", end);
           if (std::isfinite(s)) best = std::isnan(best) ? s : std::max(best, s);
         }
         return best;
       }},
  };
  out += claims_table("paper (§5.2.1)", claims);
  return out + "\nHybridGen's geometric mean over each method (the band lower first): " +
         geomeans_text(r, all, {"h2o", "infinigen", "keyformer", "streamingllm", "flexgen", "moe_lightning"},
                       "") +
         ".\n";
}

std::string fig17(const std::string& results) {
  const Results r = load(results, "batch");
  std::string out = header(r, "batch.yaml", kSpeedupNote);
  out += speedup_table(r, "flexgen", "batch", [](const Json& p) { return p["batch"].dump(); });
  const auto all = r.point_indices();
  out += "\n";
  std::vector<Claim> claims = {
      {"HybridGen over the Pre-QKT methods (InfiniGen, StreamingLLM), best batch, defaults", 1.50,
       up_to(r, all, "hybridgen", {"infinigen", "streamingllm"})},
      {"same, matched budget 0.2", 1.50, up_to(r, all, "hybridgen@0.2", {"infinigen", "streamingllm@0.2"})},
      {"HybridGen over the Post-QKT methods (Keyformer, H2O), best batch, defaults", 1.87,
       up_to(r, all, "hybridgen", {"keyformer", "h2o"})},
      {"same, matched budget 0.2", 1.87, up_to(r, all, "hybridgen@0.2", {"keyformer@0.2", "h2o"})},
  };
  out += claims_table("paper (§5.2.3)", claims);
  std::string by;
  for (int pi : all)
    by += (by.empty() ? "" : ", ") + band_or_na(speedup(r, pi, "flexgen", "hybridgen", "peak"),
                                                speedup(r, pi, "flexgen", "hybridgen", "achieved"));
  return out + "\nHybridGen over FlexGen by batch (the band lower first): " + by + ".\n";
}

std::string fig18(const std::string& results) {
  const Results r = load(results, "mapping");
  std::string out = header(r, "mapping.yaml",
                           "end-to-end latency of `semantic` over `interleave` (lower is better: semantic faster), "
                           "the band lower first, and in parentheses the attended fractions (semantic vs "
                           "interleave)");
  const auto models = r.values("model");
  std::vector<std::string> head = {"run"};
  for (auto& m : models) head.push_back(model_name(m));
  head.push_back("geomean");
  std::vector<std::vector<std::string>> body;
  std::vector<std::string> checks;
  for (auto [label, what] : {std::pair<std::string, std::string>{"", "the scheduler adapts K and the mode"},
                             {"-fixedk", "K fixed at 512, post mode"}}) {
    const std::string sem = "semantic" + label, inter = "interleave" + label;
    if (!r.has(sem) || !r.has(inter)) continue;
    std::vector<std::string> row = {what};
    std::array<double, 2> logs{0, 0};
    std::array<int, 2> faster{0, 0};
    int n = 0;
    for (auto& m : models) {
      const auto pts = r.where("model", m);
      if (pts.empty()) continue;
      const int pi = pts[0];
      const double p = speedup(r, pi, sem, inter, "peak"), a = speedup(r, pi, sem, inter, "achieved");
      logs[0] += std::log(p), logs[1] += std::log(a), ++n;
      faster[0] += p < 1, faster[1] += a < 1;
      const double as = r.attended(pi, sem), ai = r.attended(pi, inter);
      row.push_back(band_or_na(p, a) + (label.empty() ? fmt::format(" ({:.2f} vs {:.2f})", as, ai) : ""));
    }
    row.push_back(n ? band_text(std::exp(logs[0] / n), std::exp(logs[1] / n)) : "n/a");
    body.push_back(row);
    checks.push_back(fmt::format("with {}, on {} of {} models at peak and {} of {} at achieved rates", what,
                                 faster[0], n, faster[1], n));
  }
  out += md_table(head, body);
  out += "\nThe paper (§5.2.4) reports semantic mapping faster on every model; here it is faster ";
  for (size_t i = 0; i < checks.size(); ++i) out += (i ? "; " : "") + checks[i];
  return out + ".\n";
}

std::string fig21(const std::string& results) {
  const Results r = load(results, "ablation");
  const std::string base = "fixedk-post";
  std::string out = header(r, "ablation.yaml",
                           "speedup over Fixed-K Post-QKT per prompt length (higher is better), the band lower first, and "
                           "in parentheses the attended fraction");
  out += speedup_table(r, base, "prompt tokens", [](const Json& p) { return p["prompt_tokens"].dump(); });
  // The paper's reading (§5.4): with fixed K, Pre-QKT fastest and Post-QKT slowest, Fixed-K Adaptive
  // between them; the spread of the six configurations per length.
  std::array<int, 2> order{0, 0};
  double spread_lo = INFINITY, spread_hi = 0;
  const auto all = r.point_indices();
  for (int pi : all)
    for (int e = 0; e < 2; ++e) {
      const double pre = r.time(pi, "fixedk-pre", kEnds[e]), ad = r.time(pi, "fixedk-adaptive", kEnds[e]),
                   post = r.time(pi, base, kEnds[e]);
      order[size_t(e)] += pre <= ad && ad <= post;
      double lo = INFINITY, hi = 0;
      for (auto& l : r.labels) {
        const double t = r.time(pi, l, kEnds[e]);
        if (std::isfinite(t)) lo = std::min(lo, t), hi = std::max(hi, t);
      }
      if (hi > 0) spread_lo = std::min(spread_lo, hi / lo - 1), spread_hi = std::max(spread_hi, hi / lo - 1);
    }
  out += fmt::format(
      "\nThe paper's order with fixed K (Pre-QKT fastest, Fixed-K Adaptive between, Post-QKT slowest) holds at {} of "
      "{} lengths at peak and {} of {} at achieved rates; the six configurations' slowest is {:.1f}–{:.1f} % slower "
      "than their fastest across lengths and ends.\n",
      order[0], all.size(), order[1], all.size(), 100 * spread_lo, 100 * spread_hi);
  return out;
}

// HybridGen's label(s) and the rest.
std::pair<std::vector<std::string>, std::vector<std::string>> hybridgen_and_others(const Results& r) {
  std::pair<std::vector<std::string>, std::vector<std::string>> v;
  for (auto& l : r.labels) (l.rfind("hybridgen", 0) == 0 ? v.first : v.second).push_back(l);
  return v;
}

// The map (per cell and end, HybridGen's speedup over the fastest other method) and Fig. 15's counts.
std::string conclusion(const std::string& results) {
  const Results m = load(results, "map");
  const auto [hg, others] = hybridgen_and_others(m);
  const auto all = m.point_indices();
  // A group of cells: one model, context and budget, over the platforms and decode lengths.
  const auto group = [&](int pi) {
    const Json& p = m.points.at(pi);
    const double share = p["gpu_kv_share"].get<double>();
    return fmt::format("{} at {} ({})", model_name(p["model"]), tokens(p["prompt_tokens"]),
                       share >= 1 ? std::string("the KV fits") : fmt::format("a budget of {:g} of the KV", share));
  };
  std::map<std::string, int> cells_in;
  for (int pi : all) ++cells_in[group(pi)];
  std::array<int, 2> wins{0, 0}, ties{0, 0};
  std::array<std::pair<double, double>, 2> win_range{{{INFINITY, 0}, {INFINITY, 0}}},
      all_range{{{INFINITY, 0}, {INFINITY, 0}}};
  std::array<std::map<std::string, int>, 2> best_other, where;
  for (int pi : all)
    for (int e = 0; e < 2; ++e) {
      double mine = INFINITY, other = INFINITY;
      for (auto& l : hg) mine = std::min(mine, m.time(pi, l, kEnds[e]));
      for (auto& l : others) other = std::min(other, m.time(pi, l, kEnds[e]));
      if (!std::isfinite(mine) || !std::isfinite(other)) continue;
      const double s = other / mine;
      auto& ar = all_range[size_t(e)];
      ar = {std::min(ar.first, s), std::max(ar.second, s)};
      if (s > 1 + kTie) {
        ++wins[size_t(e)];
        auto& wr = win_range[size_t(e)];
        wr = {std::min(wr.first, s), std::max(wr.second, s)};
        ++where[size_t(e)][group(pi)];
        continue;
      }
      ties[size_t(e)] += s * (1 + kTie) >= 1;
      for (auto& l : fastest(m, pi, others, kEnds[e])) ++best_other[size_t(e)][l];
    }
  const auto range = [](std::pair<double, double> r) {
    return std::isfinite(r.first) ? band_text(r.first, r.second) + "×" : std::string("n/a");
  };
  const auto list = [&](const std::map<std::string, int>& w) {
    std::string o;
    for (auto& [g, k] : w) o += (o.empty() ? "" : "; ") + fmt::format("{}, {} of its {} cells", g, k, cells_in[g]);
    return o;
  };
  const auto won = [&](int e) {
    const std::string tie = ties[size_t(e)] ? fmt::format(", tied within {:g} % in {} more", 100 * kTie, ties[size_t(e)]) : "";
    return wins[size_t(e)] ? fmt::format("{} of the {} cells{} ({} over the best other method there, {} over all cells): {}",
                                         wins[size_t(e)], all.size(), tie, range(win_range[size_t(e)]),
                                         range(all_range[size_t(e)]), list(where[size_t(e)]))
                           : fmt::format("none of the {} cells{} ({} the best other method's speed over all cells)",
                                         all.size(), tie, range(all_range[size_t(e)]));
  };
  std::string out = fmt::format(
      "**When is HybridGen faster? (MODELED, dry; `experiments/map.yaml`: budget × context × decode length × "
      "CPU rate, "
      "{} rows{}; `scripts/plot results/reproduction/map` draws it.)** Every method fills one accelerator KV "
      "budget and "
      "every budgeted one attends the same fraction. At datasheet peak rates without fixed costs HybridGen "
      "is the "
      "fastest method in {}. At achieved rates with the launch, copy and hand-off costs measured on an H200 "
      "it is the "
      "fastest in {}. Where it is not the fastest, the fastest method is (a tie counts for each): at peak "
      "{}; at "
      "achieved rates {}.",
      m.rows, failed_text(m), won(0), won(1), counted(best_other[0]), counted(best_other[1]));
  const Results f = load(results, "models");
  const auto fa = f.point_indices();
  const auto regime = paper_regime(f);
  const auto c = fastest_counts(f, regime);
  std::array<int, 2> hgc{0, 0};
  for (int e = 0; e < 2; ++e)
    for (int pi : fa) {
      const auto best = fastest(f, pi, regime, kEnds[e]);
      hgc[size_t(e)] += std::any_of(best.begin(), best.end(), [](auto& l) { return l.rfind("hybridgen", 0) == 0; });
    }
  const std::string g = geomeans_text(f, fa, {"h2o", "infinigen", "keyformer", "flexgen"}, "over ");
  out += fmt::format(
      " Fig. 15 at the same budget (`models.yaml`, {} models at 2K): HybridGen (either entry) is the fastest on {} of "
      "{} at peak and {} of {} at achieved rates (the fastest: at peak {}; at achieved rates {}); its geometric mean "
      "is {} (each band lower first).",
      fa.size(), hgc[0], fa.size(), hgc[1], fa.size(), counts_text(c, 0), counts_text(c, 1), g);
  if (f.has("full@fits")) {
    const auto fc = fits_fastest(f);
    out += fmt::format(" In the other regime, `full@fits` (the whole KV on the accelerator) is the fastest on {} of {} "
                       "models at peak and {} of {} at achieved rates.",
                       fc[0], fa.size(), fc[1], fa.size());
  }
  return out + "\n";
}

// The clock check's measured rows: modeled ÷ measured per strategy, and its ratio to `full`'s at the
// same point (how far a modeled ratio between two strategies is from the measured one).
// Measured, so not rerun by default: without its rows the part keeps its text (nullopt).
std::optional<std::string> clock(const std::string& results) {
  const std::string dir = results + "/clock_check";
  if (!fs::exists(dir + "/rows.jsonl")) return std::nullopt;
  std::map<std::pair<int, std::string>, std::vector<double>> mom;
  std::map<int, Json> points;
  size_t n = 0;
  for (const ResultRow& row : read_rows(dir)) {
    const Json::json_pointer at("/figures/modeled_over_measured/end_to_end");
    if (!row.ok || !row.json.contains(at) || !row.json.at(at).is_number()) continue;
    mom[{row.point_index, row.label}].push_back(row.json.at(at).get<double>());
    points.emplace(row.point_index, row.point);
    ++n;
  }
  if (!n) input_error("{}: no ok rows with figures.modeled_over_measured (a real run on a modeled clock)", dir);
  double rlo = INFINITY, rhi = 0, alo = INFINITY, ahi = 0;
  std::set<std::string> labels;
  for (auto& [key, v] : mom) {
    const double x = median(v);
    alo = std::min(alo, x), ahi = std::max(ahi, x);
    labels.insert(key.second);
    auto f = mom.find({key.first, "full"});
    if (key.second == "full" || f == mom.end()) continue;
    const double r = x / median(f->second);
    rlo = std::min(rlo, r), rhi = std::max(rhi, r);
  }
  std::string lengths;
  for (auto& [pi, p] : points) lengths += (lengths.empty() ? "" : ", ") + tokens(p["prompt_tokens"]);
  return fmt::format(
      "**The clock's error band** (`scripts/reproduce --measured`: `experiments/clock_check.yaml`, {} measured rows, "
      "{} strategies at {} tokens, each run replayed on a profile of this machine measured just before it): "
      "a modeled ratio between two strategies is **{:.2f}–{:.2f}** of the measured ratio (each strategy against "
      "`full`, medians of the repeats); absolute modeled ÷ measured end-to-end times are {:.2f}–{:.2f}, a factor "
      "the strategies largely share. On this same-silicon emulation the check cannot see a GPU's launches, "
      "synchronisations or CPU/GPU balance: on an H200 it held for `full`, FlexGen and MoE-Lightning and not for "
      "HybridGen, StreamingLLM and InfiniGen, whose CUDA paths pay costs the clock does not charge "
      "(docs/performance.md, \"GPU: NVIDIA H200\").\n",
      n, labels.size(), lengths, rlo, rhi, alo, ahi);
}

struct Part {
  const char* name;
  std::function<std::optional<std::string>(const std::string& results)> make;
};
const std::vector<Part>& parts() {
  static const std::vector<Part> p = {{"conclusion", conclusion}, {"clock", clock}, {"fig16", fig16},
                                      {"fig15", fig15},           {"fig17", fig17}, {"fig18", fig18},
                                      {"fig21", fig21}};
  return p;
}

}  // namespace

ReproductionReport regenerate_reproduction(const std::string& doc, const std::string& doc_name,
                                           const std::string& results) {
  ReproductionReport rep;
  std::istringstream in(doc);
  std::string line, old;
  const Part* open = nullptr;
  int line_no = 0, open_line = 0;
  const std::string kOpen = "<!-- generated: ", kClose = "<!-- end generated: ";
  const auto name_in = [&](const std::string& l, const std::string& head) {
    const size_t end = l.find(" -->");
    if (end == std::string::npos || end < head.size())
      input_error("{}:{}: a generated-part marker without its closing ' -->'", doc_name, line_no);
    return l.substr(head.size(), end - head.size());
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.rfind(kClose, 0) == 0) {
      const std::string name = name_in(line, kClose);
      if (!open || name != open->name)
        input_error("{}:{}: '{}' closes a part that is not open{}", doc_name, line_no, name,
                    open ? fmt::format(" ('{}' opened at line {})", open->name, open_line) : "");
      if (std::optional<std::string> text = open->make(results)) {
        rep.text += "\n" + *text + "\n";
        rep.parts.push_back(name);
      } else {
        rep.text += old;
        rep.kept.push_back(name);
      }
      rep.text += line + "\n";
      open = nullptr;
      continue;
    }
    if (open) {
      old += line + "\n";  // the text being replaced
      continue;
    }
    rep.text += line + "\n";
    if (line.rfind(kOpen, 0) != 0) continue;
    const std::string name = name_in(line, kOpen);
    for (const Part& p : parts())
      if (name == p.name) open = &p;
    if (!open) {
      std::string known;
      for (const Part& p : parts()) known += (known.empty() ? "" : ", ") + std::string(p.name);
      input_error("{}:{}: unknown generated part '{}' (expected one of {})", doc_name, line_no, name, known);
    }
    open_line = line_no;
    old.clear();
  }
  if (open)
    input_error("{}:{}: generated part '{}' has no '{}{} -->' line", doc_name, open_line, open->name, kClose, open->name);
  return rep;
}

}  // namespace hg
