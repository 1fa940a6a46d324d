// Long-context retrieval tasks generated from a seed (no download): passkey retrieval (Mohtashami
// & Jaggi, 2023) and RULER's synthetic tasks (Hsieh et al., 2024) as RULER's generators define them
// (scripts/data/synthetic/*.py and constants.py of NVIDIA/RULER): niah_single_1-3,
// niah_multikey_1-3, niah_multivalue, niah_multiquery, vt (with its in-context example), cwe and
// fwe, and qa_1/qa_2 from a user's SQuAD or HotpotQA file, with RULER's haystacks, generator parameters, templates and answer prefixes (the base-model
// template: the task's template followed by its answer prefix). A prompt is sized in the model's own
// tokens so that it and its tokens to generate fit the asked length; its (first queried) needle sits
// at a depth, a percentage of the haystack (cwe and fwe have no needle). Scored by greedy decoding:
// the fraction of the answers the output contains (RULER's string_match_all). The random draws are
// hgbench's own, seeded by (seed, task, item): the same item asks the same thing at every length
// and depth; they are not RULER's Python streams.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hg {

class Tokenizer;

struct NeedleItem {
  std::string task;
  int index = 0;
  std::string prompt;
  std::vector<std::string> answers;  // each must appear in the output
  int tokens = 0;                    // the prompt's length in tokens (BOS not counted)
  int depth = 0;                     // percent of the haystack before the needle (-1: none)
  size_t needle_at = 0;              // byte offset of the (queried) needle in the prompt
  int max_new = 0;                   // tokens to generate (RULER's tokens_to_generate)
  std::string question;              // the prompt's last part, the question and answer prefix
  bool any_answer = false;           // scored by RULER's string_match_part (one answer suffices: qa)
  // The prompt without its question: what a query-agnostic protocol prefills.
  std::string context() const { return prompt.substr(0, prompt.size() - question.size()); }
};

// The natural text RULER's "essay" haystack is made of. RULER uses Paul Graham's essays, which
// cannot be shipped; by default hgbench uses PIQA's train split (AFL-3.0): each goal followed by
// its correct solution, in file order.
struct Haystack {
  std::string text;
  std::string source;  // where it came from, for the rows
};
// PIQA's train split under `data_dir` (piqa/train.jsonl and train-labels.lst), or `file` when given:
// plain text, or JSON with a "text" field (RULER's PaulGrahamEssays.json). InputError naming the
// file when it cannot be read.
Haystack load_haystack(const std::string& data_dir, const std::string& file = "");

// RULER's QA tasks' documents and questions, read from a user's file (SQuAD and HotpotQA cannot be
// shipped): qa_1 from SQuAD v2's JSON (answerable questions; a question's other paragraphs of its
// article are its first distractors), qa_2 from HotpotQA's (distractor setting: each question's
// context paragraphs are its gold documents), as RULER's qa.py reads them.
struct QaCorpus {
  struct Qa {
    std::string query;
    std::vector<std::string> answers;
    std::vector<int> gold, more;  // documents: the ones that answer, then the same article's others
  };
  std::vector<std::string> docs;  // distinct, sorted
  std::vector<Qa> qas;
  std::string source;
};
// `task` qa_1 (SQuAD v2) or qa_2 (HotpotQA) from `file`; InputError naming the file and what was
// expected when it is not that format.
QaCorpus load_qa_corpus(const std::string& task, const std::string& file);

// passkey and RULER's synthetic tasks, in RULER's order.
const std::vector<std::string>& needle_task_names();
bool is_needle_task(const std::string& name);
// Whether a task reads the essay haystack (then make_needle_item needs one).
bool needle_task_needs_essay(const std::string& name);
// Whether a task reads a QA corpus (qa_1, qa_2).
bool needle_task_is_qa(const std::string& name);
// Whether a task places a needle at a depth (cwe and fwe do not: their depth is ignored).
bool needle_task_has_depth(const std::string& name);
// Item `index` of `task`: its keys and values depend on (seed, task, index) only; the prompt has the
// most haystack that keeps it and its tokens to generate within `tokens` tokens of `tok`.
// InputError when `tokens` cannot hold the task's text without haystack, or an essay task has no
// haystack.
NeedleItem make_needle_item(const std::string& task, const Tokenizer& tok, int tokens, int depth, uint64_t seed,
                            int index, const Haystack* essay = nullptr, const QaCorpus* qa = nullptr);
// The fraction of item.answers that `output` contains (ASCII case-insensitive; with any_answer,
// 1 when it contains one of them).
double needle_match(const NeedleItem& item, const std::string& output);

}  // namespace hg
