// Long-context retrieval tasks generated from a seed (no download), on the repeated-sentence
// haystack RULER uses: passkey retrieval (Mohtashami & Jaggi, 2023) and RULER's
// needle-in-a-haystack with one key (niah_single), with distractor needles of other keys
// (niah_multikey), and variable tracking (a chain of assignments, every variable asked for). A
// prompt is sized to a length in the model's own tokens and holds its (queried) needle at a depth,
// a percentage of the haystack. Scored by greedy decoding: the fraction of the answers the output
// contains (RULER's string_match_all).
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
  int depth = 0;                     // percent of the haystack before the needle
  size_t needle_at = 0;              // byte offset of the (queried) needle in the prompt
  int max_new = 0;                   // tokens to generate
  std::string question;              // the prompt's last part, the question and answer prefix
  // The prompt without its question: what a query-agnostic protocol prefills.
  std::string context() const { return prompt.substr(0, prompt.size() - question.size()); }
};

// passkey, niah_single, niah_multikey, variable_tracking.
const std::vector<std::string>& needle_task_names();
bool is_needle_task(const std::string& name);
// Item `index` of `task`: the needle's key and value depend on (seed, task, index) only, so every
// length and depth asks for the same thing; the prompt has the most haystack that keeps it within
// `tokens` tokens of `tok`. InputError when `tokens` cannot hold the task's text without haystack.
NeedleItem make_needle_item(const std::string& task, const Tokenizer& tok, int tokens, int depth, uint64_t seed,
                            int index);
// The fraction of item.answers that `output` contains (ASCII case-insensitive).
double needle_match(const NeedleItem& item, const std::string& output);

}  // namespace hg
