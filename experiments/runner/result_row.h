// One result row — point × strategy × repeat — as every reader of rows.jsonl sees it. The keys the
// recorder, resume, merge, compare and report rely on are typed fields, checked once when a row
// is read (a row without them is an error naming file:line and the key); the whole row stays in
// `json`, which merge writes back unchanged. Writers start every row with head(), so each key has
// one spelling in the code base.
#pragma once
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

namespace hg {

struct ResultRow {
  std::string experiment, point_id, label, strategy;
  int point_index = -1;
  int repeat = 0;
  bool ok = false;               // status "ok"; otherwise "failed", with `reason`
  std::string reason;
  std::string time_basis;        // timing rows: measured | modeled | modeled (dry)
  bool accuracy = false;         // an accuracy (eval) row
  nlohmann::ordered_json point;  // the point's recorded values
  nlohmann::ordered_json json;   // the row as written

  // The figure figures.key (or figures.key.sub) of an ok row; NaN when the row has none.
  double figure(const char* key, const char* sub = nullptr) const;
  // A text figure (figures.kv_dtype, figures.time_metric); `dflt` when absent.
  std::string figure_text(const char* key, const std::string& dflt) const;
  // What resume and merge match rows by.
  std::tuple<std::string, std::string, int> key() const { return {point_id, label, repeat}; }

  // The keys every row starts with.
  static nlohmann::ordered_json head(const std::string& experiment, const std::string& point_id, int point_index,
                                     const std::string& label, const std::string& strategy, int repeat, bool ok);
  // Checks and types a row; InputError "<where>: <problem>" when a key is missing or mistyped.
  static ResultRow parse(nlohmann::ordered_json row, const std::string& where);
};

}  // namespace hg
