// The four multiple-choice tasks as lm-evaluation-harness 0.4 defines them (piqa, openbookqa,
// super_glue copa, glue rte): loaders for the files ../shared/datasets/README.md describes, and the
// requests lm-eval builds from them (few-shot context, continuations, gold).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hg {

// One document as the task's doc_to_text / doc_to_choice / doc_to_target see it.
struct Doc {
  std::string text;                  // doc_to_text
  std::vector<std::string> choices;  // doc_to_choice
  int gold = 0;                      // index into choices
  std::string target;                // the few-shot target string (doc_to_target, rendered)
  bool operator==(const Doc&) const = default;
};

struct TaskData {
  std::string name;              // piqa | openbookqa | copa | rte
  std::string eval_file, fewshot_file;
  std::vector<Doc> eval;         // the split lm-eval scores
  std::vector<Doc> fewshot;      // the split its few-shot examples come from
  // lm-eval draws one extra few-shot document (and drops the scored one) when the task's
  // fewshot_split equals its test_split: true for piqa, copa and rte (both unset), false for
  // openbookqa (test_split: test).
  bool draws_extra = true;
};

// One loglikelihood request group: the context and one continuation per choice.
struct Request {
  std::string task;
  int index = 0;                            // document index in the eval split
  std::string context;                      // few-shot examples + doc_to_text
  std::vector<std::string> continuations;   // target_delimiter + choice
  std::vector<std::string> choices;         // doc_to_choice (acc_norm divides by their lengths)
  int gold = 0;
};

// Where lm-evaluation-harness versions build different requests, the behaviour followed. The
// named default is 0.4.9; "0.4.10" prepends the tokenizer's BOS (its HF models began adding the
// tokenizer's default special tokens), "0.3" spaces COPA's choices once. Each setting can also be
// chosen on its own (eval.copa_spacing, eval.add_bos); rows record what was used.
enum class BosRule { kNone, kTokenizer, kAlways };
struct LmEvalRules {
  std::string version = "0.4.9";
  bool copa_double_space = true;  // 0.4: target_delimiter " " before choices that carry their own space
  BosRule bos = BosRule::kNone;   // ≤ 0.4.9: none (HF models without add_bos_token)
};
// The rules of a named version; InputError naming `where` for an unknown one.
LmEvalRules lm_eval_rules(const std::string& version, const std::string& where);
const std::vector<std::string>& lm_eval_versions();
const char* bos_rule_name(BosRule b);
// "none" | "tokenizer" | "always" (or true/false as always/none); false when unknown.
bool parse_bos_rule(const std::string& s, BosRule* out);

// piqa, openbookqa, copa, rte.
const std::vector<std::string>& task_names();
// The data directory: `flag` when given, else $HG_DATA_DIR, else ../shared/datasets beside the
// source tree when it exists; "" when none.
std::string resolve_data_dir(const std::string& flag);
// Loads a task's eval and few-shot splits; a missing or malformed file is an InputError naming the
// file, the line and the field.
TaskData load_task(const std::string& name, const std::string& data_dir);
// Requests for the first `limit` documents (0: all) with `shots` few-shot examples drawn by
// random.Random(seed).sample over the few-shot split, one draw per document in order.
std::vector<Request> build_requests(const TaskData& task, int shots, int limit, uint64_t seed = 1234,
                                    const LmEvalRules& rules = {});
// {"task","index","context","choices" (the continuations, with their leading delimiter),"gold"}.
nlohmann::ordered_json request_json(const Request& r);
// Held-out text in the task's own format: the few-shot split's documents in file order, each as a
// few-shot example ("text target", separated by blank lines), until max_chars. What a strategy that
// calibrates on a prompt (InfiniGen's skew) is shown instead of the items it is scored on.
std::string calibration_text(const TaskData& task, size_t max_chars);

}  // namespace hg
