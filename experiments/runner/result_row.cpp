#include "experiments/runner/result_row.h"

#include <cmath>

#include "engine/core/error.h"

namespace hg {
using Json = nlohmann::ordered_json;

Json ResultRow::head(const std::string& experiment, const std::string& point_id, int point_index,
                     const std::string& label, const std::string& strategy, int repeat, bool ok) {
  Json r;
  r["experiment"] = experiment;
  r["point_id"] = point_id;
  r["point_index"] = point_index;
  r["label"] = label;
  r["strategy"] = strategy;
  r["repeat"] = repeat;
  r["status"] = ok ? "ok" : "failed";
  return r;
}

namespace {
std::string text(const Json& j, const char* key, const std::string& where, bool required = true) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) input_error("{}: the row has no '{}'", where, key);
    return "";
  }
  if (!it->is_string()) input_error("{}: the row's '{}' must be a string", where, key);
  return it->get<std::string>();
}
int integer(const Json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) input_error("{}: the row has no '{}'", where, key);
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
    input_error("{}: the row's '{}' must be a non-negative integer", where, key);
  return int(it->get<int64_t>());
}
}  // namespace

ResultRow ResultRow::parse(Json row, const std::string& where) {
  if (!row.is_object()) input_error("{}: a row must be a JSON object", where);
  ResultRow r;
  r.experiment = text(row, "experiment", where, false);
  r.point_id = text(row, "point_id", where);
  r.label = text(row, "label", where);
  r.strategy = text(row, "strategy", where);
  r.point_index = integer(row, "point_index", where);
  r.repeat = integer(row, "repeat", where);
  const std::string status = text(row, "status", where);
  if (status != "ok" && status != "failed") input_error("{}: the row's status '{}' is not ok or failed", where, status);
  r.ok = status == "ok";
  r.reason = text(row, "reason", where, false);
  r.time_basis = text(row, "time_basis", where, false);
  if (auto it = row.find("point"); it != row.end()) {
    if (!it->is_object()) input_error("{}: the row's 'point' must be an object", where);
    r.point = *it;
  } else {
    r.point = Json::object();
  }
  r.accuracy = row.contains("accuracy") || r.point.contains("task");
  if (r.ok && !r.accuracy && !(row.contains("figures") && row["figures"].is_object()))
    input_error("{}: an ok timing row has no 'figures' object", where);
  if (r.ok && r.accuracy && !(row.contains("accuracy") && row["accuracy"].is_object()))
    input_error("{}: an ok accuracy row has no 'accuracy' object", where);
  r.json = std::move(row);
  return r;
}

double ResultRow::figure(const char* key, const char* sub) const {
  if (!ok) return NAN;
  auto f = json.find("figures");
  if (f == json.end() || !f->is_object()) return NAN;
  auto it = f->find(key);
  if (it == f->end()) return NAN;
  if (sub) {
    if (!it->is_object()) return NAN;
    auto s = it->find(sub);
    return s != it->end() && s->is_number() ? s->get<double>() : NAN;
  }
  return it->is_number() ? it->get<double>() : NAN;
}

std::string ResultRow::figure_text(const char* key, const std::string& dflt) const {
  auto f = json.find("figures");
  if (f == json.end() || !f->is_object()) return dflt;
  auto it = f->find(key);
  return it != f->end() && it->is_string() ? it->get<std::string>() : dflt;
}

}  // namespace hg
