// Small helpers over result rows' JSON shared by the recorder and the reports.
#pragma once
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/json_text.h"

namespace hg {

// A JSON value as a table cell: strings as they are, null as empty, the rest as compact JSON.
inline std::string json_str(const nlohmann::ordered_json& j) {
  return j.is_string() ? j.get<std::string>() : j.is_null() ? "" : json_text(j);
}

// The keys of the points' values that differ between points (they name the points in tables).
inline std::vector<std::string> varying_axes(const std::map<int, nlohmann::ordered_json>& points) {
  std::vector<std::string> varying;
  if (points.empty()) return varying;
  for (auto& [k, v] : points.begin()->second.items()) {
    if (k == "id") continue;
    for (auto& [pi, pj] : points)
      if (pj[k] != v) {
        varying.push_back(k);
        break;
      }
  }
  return varying;
}

// A point's swept strategy parameters as "kv_ratio=0.1" (each parameter and value once, sorted):
// {"h2o": {"kv_ratio": "0.1"}, "hybridgen": {"kv_ratio": "0.1"}} → "kv_ratio=0.1".
inline std::string swept_values(const nlohmann::ordered_json& sp) {
  std::set<std::string> kv;
  if (sp.is_object())
    for (auto& [strategy, params] : sp.items())
      for (auto& [k, v] : params.items()) kv.insert(k + "=" + json_str(v));
  std::string s;
  for (auto& x : kv) s += (s.empty() ? "" : ",") + x;
  return s;
}

// The names of the swept strategy parameters of `points` ("kv_ratio", "k_fixed"), sorted.
inline std::vector<std::string> swept_params(const std::map<int, nlohmann::ordered_json>& points) {
  std::set<std::string> names;
  for (auto& [pi, pj] : points)
    if (pj.contains("strategy_params") && pj["strategy_params"].is_object())
      for (auto& [strategy, params] : pj["strategy_params"].items())
        for (auto& [k, v] : params.items()) names.insert(k);
  return {names.begin(), names.end()};
}

// A point's name from its varying axes ("llama-3.2-1b/4096"); models by preset or file name.
inline std::string point_name(const nlohmann::ordered_json& pj, const std::vector<std::string>& varying) {
  std::string s;
  for (auto& k : varying) {
    std::string v = json_str(pj[k]);
    if (k == "model") v = v.rfind("synthetic:", 0) == 0 ? v.substr(10, v.find('?') - 10)
                                                        : std::filesystem::path(v).filename().string();
    if (k == "strategy_params") v = swept_values(pj[k]);
    s += (s.empty() ? "" : "/") + v;
  }
  if (!s.empty()) return s;
  // One point: its length and batch, not its id.
  if (pj.contains("prompt_tokens"))
    return "prompt=" + json_str(pj["prompt_tokens"]) + (pj.contains("batch") ? " batch=" + json_str(pj["batch"]) : "");
  return json_str(pj["id"]);
}

// What the columns named by point_name() are ("model / prompt_tokens"); "" for one point.
inline std::string axes_caption(const std::vector<std::string>& varying) {
  std::string s;
  for (auto& k : varying) s += (s.empty() ? "" : " / ") + k;
  return s;
}

}  // namespace hg
