// Task loaders and lm-eval 0.4 request construction.
#include "datasets/tasks.h"

#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "datasets/pyrandom.h"
#include "engine/core/error.h"
#include "engine/core/mapped_file.h"

namespace hg {
namespace {

using Json = nlohmann::json;

// Lines of a text file; a missing file names what it should be.
std::vector<std::string> read_lines(const std::string& path, const std::string& what) {
  if (!file_present(path))
    input_error("{}: cannot read {} (see datasets/README.md; set --data-dir or HG_DATA_DIR)", path, what);
  std::istringstream in(read_regular_file(path, kMaxReadFileBytes));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// One JSON object per line.
std::vector<Json> read_jsonl(const std::string& path, const std::string& what) {
  std::vector<Json> out;
  const auto lines = read_lines(path, what);
  for (size_t i = 0; i < lines.size(); ++i) {
    Json j = Json::parse(lines[i], nullptr, false);
    if (j.is_discarded() || !j.is_object())
      input_error("{}:{}: not a JSON object (expected one {} record per line)", path, i + 1, what);
    out.push_back(std::move(j));
  }
  return out;
}

std::string str_field(const Json& j, const char* key, const std::string& path, size_t line) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    input_error("{}:{}: field '{}' missing or not a string", path, line + 1, key);
  return it->get<std::string>();
}

std::string lower_first(const std::string& s) {
  std::string r = s;
  if (!r.empty()) r[0] = char(std::tolower(static_cast<unsigned char>(r[0])));
  return r;
}

// A doc whose target is its gold choice (lm-eval: doc_to_target is an index into doc_to_choice).
Doc indexed(std::string text, std::vector<std::string> choices, int gold) {
  Doc d{std::move(text), std::move(choices), gold, ""};
  d.target = d.choices[size_t(gold)];
  return d;
}

// PIQA: {"goal","sol1","sol2"} lines + a labels file (0 or 1 per line).
std::vector<Doc> load_piqa(const std::string& jsonl, const std::string& labels) {
  const auto rows = read_jsonl(jsonl, "PIQA");
  const auto lab = read_lines(labels, "PIQA labels");
  if (lab.size() != rows.size())
    input_error("{}: {} labels for {} items in {} (expected one label per line)", labels, lab.size(), rows.size(), jsonl);
  std::vector<Doc> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (lab[i] != "0" && lab[i] != "1") input_error("{}:{}: label '{}' (expected 0 or 1)", labels, i + 1, lab[i]);
    out.push_back(indexed("Question: " + str_field(rows[i], "goal", jsonl, i) + "\nAnswer:",
                          {str_field(rows[i], "sol1", jsonl, i), str_field(rows[i], "sol2", jsonl, i)}, lab[i][0] - '0'));
  }
  return out;
}

// OpenBookQA (AI2 Main schema): question.stem, question.choices[].text/label, answerKey.
std::vector<Doc> load_obqa(const std::string& path) {
  std::vector<Doc> out;
  const auto rows = read_jsonl(path, "OpenBookQA");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Json& r = rows[i];
    if (!r.contains("question") || !r["question"].is_object())
      input_error("{}:{}: field 'question' missing or not an object", path, i + 1);
    const Json& q = r["question"];
    const std::string stem = str_field(q, "stem", path, i);
    if (!q.contains("choices") || !q["choices"].is_array() || q["choices"].empty())
      input_error("{}:{}: field 'question.choices' missing or not a non-empty list", path, i + 1);
    std::vector<std::string> texts, labels;
    for (const Json& c : q["choices"]) {
      if (!c.is_object()) input_error("{}:{}: 'question.choices' holds a non-object", path, i + 1);
      texts.push_back(str_field(c, "text", path, i));
      labels.push_back(str_field(c, "label", path, i));
    }
    std::string key = str_field(r, "answerKey", path, i);
    key.erase(0, key.find_first_not_of(" \t"));  // lm-eval: answerKey.lstrip()
    const auto it = std::find(labels.begin(), labels.end(), key);
    if (it == labels.end()) input_error("{}:{}: answerKey '{}' is not one of the choice labels", path, i + 1, key);
    out.push_back(indexed(stem, texts, int(it - labels.begin())));
  }
  return out;
}

// COPA (SuperGLUE schema): premise, choice1, choice2, question (cause|effect), label.
std::vector<Doc> load_copa(const std::string& path) {
  std::vector<Doc> out;
  const auto rows = read_jsonl(path, "COPA");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Json& r = rows[i];
    std::string premise = str_field(r, "premise", path, i);
    const std::string q = str_field(r, "question", path, i);
    if (q != "cause" && q != "effect") input_error("{}:{}: field 'question' is '{}' (expected cause or effect)", path, i + 1, q);
    if (!r.contains("label") || !r["label"].is_number_integer() || (r["label"] != 0 && r["label"] != 1))
      input_error("{}:{}: field 'label' missing or not 0 or 1", path, i + 1);
    const std::string c1 = str_field(r, "choice1", path, i), c2 = str_field(r, "choice2", path, i);
    if (c1.empty() || c2.empty()) input_error("{}:{}: an empty choice", path, i + 1);
    // doc_to_text: the premise, stripped, without its last character (the period), then the connector.
    const size_t b = premise.find_first_not_of(" \t\n\r"), e = premise.find_last_not_of(" \t\n\r");
    premise = b == std::string::npos ? "" : premise.substr(b, e - b + 1);
    if (premise.empty()) input_error("{}:{}: field 'premise' is empty", path, i + 1);
    Doc d;
    d.text = premise.substr(0, premise.size() - 1) + (q == "cause" ? " because" : " therefore");
    // doc_to_choice and doc_to_target of lm-eval 0.4's copa/utils.py carry their own leading space.
    d.choices = {" " + lower_first(c1), " " + lower_first(c2)};
    d.gold = r["label"].get<int>();
    d.target = d.choices[size_t(d.gold)];
    out.push_back(std::move(d));
  }
  return out;
}

// RTE (GLUE TSV): index, sentence1, sentence2, label (entailment | not_entailment), with a header.
std::vector<Doc> load_rte(const std::string& path) {
  const auto lines = read_lines(path, "RTE (GLUE TSV)");
  if (lines.empty() || lines[0] != "index\tsentence1\tsentence2\tlabel")
    input_error("{}:1: expected the header 'index<TAB>sentence1<TAB>sentence2<TAB>label'", path);
  std::vector<Doc> out;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f;
    size_t p = 0;
    for (;;) {
      const size_t t = lines[i].find('\t', p);
      f.push_back(lines[i].substr(p, t == std::string::npos ? std::string::npos : t - p));
      if (t == std::string::npos) break;
      p = t + 1;
    }
    if (f.size() != 4) input_error("{}:{}: {} tab-separated fields (expected 4)", path, i + 1, f.size());
    if (f[3] != "entailment" && f[3] != "not_entailment")
      input_error("{}:{}: field 'label' is '{}' (expected entailment or not_entailment)", path, i + 1, f[3]);
    out.push_back(indexed(f[1] + "\nQuestion: " + f[2] + " True or False?\nAnswer:", {"True", "False"},
                          f[3] == "entailment" ? 0 : 1));
  }
  return out;
}

}  // namespace

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> n = {"piqa", "openbookqa", "copa", "rte"};
  return n;
}

std::string resolve_data_dir(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("HG_DATA_DIR"); e && *e) return e;
#ifdef HG_SOURCE_DIR
  const std::string beside = std::string(HG_SOURCE_DIR) + "/../shared/datasets";
  if (std::filesystem::is_directory(beside)) return std::filesystem::weakly_canonical(beside).string();
#endif
  return "";
}

TaskData load_task(const std::string& name, const std::string& data_dir) {
  if (data_dir.empty())
    input_error("task {}: no data directory (give --data-dir, set HG_DATA_DIR, or run scripts/fetch-datasets)", name);
  const std::string d = data_dir + "/";
  TaskData t;
  t.name = name;
  if (name == "piqa") {
    t.eval_file = d + "piqa/valid.jsonl";
    t.fewshot_file = d + "piqa/train.jsonl";
    t.eval = load_piqa(t.eval_file, d + "piqa/valid-labels.lst");
    t.fewshot = load_piqa(t.fewshot_file, d + "piqa/train-labels.lst");
  } else if (name == "openbookqa") {
    t.eval_file = d + "openbookqa/test.jsonl";
    t.fewshot_file = d + "openbookqa/train.jsonl";
    t.eval = load_obqa(t.eval_file);
    t.fewshot = load_obqa(t.fewshot_file);
    t.draws_extra = false;
  } else if (name == "copa") {
    t.eval_file = d + "copa/val.jsonl";
    t.fewshot_file = d + "copa/train-from-copa-dev-1-400.jsonl";
    t.eval = load_copa(t.eval_file);
    t.fewshot = load_copa(t.fewshot_file);
  } else if (name == "rte") {
    t.eval_file = d + "rte/glue/dev.tsv";
    t.fewshot_file = d + "rte/glue/train.tsv";
    t.eval = load_rte(t.eval_file);
    t.fewshot = load_rte(t.fewshot_file);
  } else {
    input_error("unknown task '{}' (expected piqa, openbookqa, copa or rte)", name);
  }
  return t;
}

const std::vector<std::string>& lm_eval_versions() {
  static const std::vector<std::string> v = {"0.3", "0.4.9", "0.4.10"};
  return v;
}

LmEvalRules lm_eval_rules(const std::string& version, const std::string& where) {
  LmEvalRules r;
  r.version = version;
  if (version == "0.3") r.copa_double_space = false;
  else if (version == "0.4.10") r.bos = BosRule::kTokenizer;
  else if (version != "0.4.9")
    input_error("{}: lm_eval '{}' (expected one of {})", where, version, fmt::join(lm_eval_versions(), ", "));
  return r;
}

const char* bos_rule_name(BosRule b) {
  return b == BosRule::kNone ? "none" : b == BosRule::kTokenizer ? "tokenizer" : "always";
}

bool parse_bos_rule(const std::string& s, BosRule* out) {
  if (s == "none" || s == "false") *out = BosRule::kNone;
  else if (s == "tokenizer") *out = BosRule::kTokenizer;
  else if (s == "always" || s == "true") *out = BosRule::kAlways;
  else return false;
  return true;
}

std::vector<Request> build_requests(const TaskData& t, int shots, int limit, uint64_t seed, const LmEvalRules& rules) {
  // lm-eval 0.3's COPA put one space between the text and a choice; 0.4's choices carry a space of
  // their own after the target delimiter's.
  const bool strip = t.name == "copa" && !rules.copa_double_space;
  auto once = [&](const std::string& x) { return strip && !x.empty() && x[0] == ' ' ? x.substr(1) : x; };
  if (shots < 0) input_error("task {}: shots must be >= 0, got {}", t.name, shots);
  const int draw = shots + (t.draws_extra ? 1 : 0);
  if (shots > 0 && size_t(draw) > t.fewshot.size())
    input_error("task {}: {} few-shot examples asked for, {} has {}", t.name, shots, t.fewshot_file, t.fewshot.size());
  PyRandom rnd(seed);
  const size_t n = limit > 0 ? std::min(t.eval.size(), size_t(limit)) : t.eval.size();
  std::vector<Request> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const Doc& doc = t.eval[i];
    std::string ctx;
    if (shots > 0) {
      int used = 0;
      for (uint32_t j : rnd.sample(uint32_t(t.fewshot.size()), uint32_t(draw))) {
        const Doc& ex = t.fewshot[j];
        if (ex == doc || used == shots) continue;
        ctx += ex.text + " " + once(ex.target) + "\n\n";
        ++used;
      }
    }
    ctx += doc.text;
    Request r;
    r.task = t.name;
    r.index = int(i);
    r.context = std::move(ctx);
    for (auto& c : doc.choices) r.choices.push_back(once(c));
    for (auto& c : r.choices) r.continuations.push_back(" " + c);
    r.gold = doc.gold;
    out.push_back(std::move(r));
  }
  return out;
}

std::string calibration_text(const TaskData& t, size_t max_chars) {
  std::string out;
  for (const Doc& d : t.fewshot) {
    if (out.size() >= max_chars) break;
    out += d.text + " " + d.target + "\n\n";
  }
  if (out.size() > max_chars) out.resize(max_chars);
  return out;
}

nlohmann::ordered_json request_json(const Request& r) {
  nlohmann::ordered_json j;
  j["task"] = r.task;
  j["index"] = r.index;
  j["context"] = r.context;
  j["choices"] = r.continuations;
  j["gold"] = r.gold;
  return j;
}

}  // namespace hg
