#include "datasets/needle.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "engine/core/error.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

// RULER's "noise" haystack: the same five sentences repeated.
constexpr const char* kHaystack =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// Words for RULER-style keys ("adjective-noun").
constexpr const char* kAdjectives[] = {"ancient", "bright",  "calm",   "daring", "eager",  "faint",   "gentle",
                                       "hollow",  "icy",     "jolly",  "kind",   "lively", "mellow",  "narrow",
                                       "orange",  "proud",   "quiet",  "rapid",  "silent", "tidy",    "upbeat",
                                       "vivid",   "wooden",  "yellow", "zealous"};
constexpr const char* kNouns[] = {"anchor", "basket", "candle", "desert", "engine", "falcon", "garden",
                                  "harbor", "island", "jacket", "kettle", "ladder", "meadow", "needle",
                                  "orchard", "pillow", "quarry", "river",  "saddle", "tunnel", "valley",
                                  "window", "yogurt", "zipper"};

struct Parts {
  std::string prefix, suffix;
  std::vector<std::string> needles;  // needles[0] is the queried one (the chain's start for vt)
  std::vector<std::string> answers;
  int max_new = 0;
};

uint64_t mix(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

Parts parts_of(const std::string& task, uint64_t seed, int index) {
  std::mt19937_64 rng(mix(mix(0xcbf29ce484222325ull ^ seed, task), std::to_string(index)));
  auto number = [&](int digits) {
    const uint64_t lo = uint64_t(std::pow(10, digits - 1));
    return std::to_string(lo + rng() % (9 * lo));
  };
  auto key = [&] {
    return std::string(kAdjectives[rng() % std::size(kAdjectives)]) + "-" + kNouns[rng() % std::size(kNouns)];
  };
  Parts p;
  if (task == "passkey") {
    const std::string k = number(5);
    p.prefix = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will "
               "quiz you about the important information there.\n";
    p.needles = {fmt::format(" The pass key is {0}. Remember it. {0} is the pass key.", k)};
    p.suffix = "\nWhat is the pass key? The pass key is";
    p.answers = {k};
    p.max_new = 16;
  } else if (task == "niah_single" || task == "niah_multikey") {
    const std::string k = key(), v = number(7);
    p.prefix = "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will "
               "quiz you about the numbers afterwards.\n";
    p.needles = {fmt::format(" One of the special magic numbers for {} is: {}.", k, v)};
    if (task == "niah_multikey")
      while (p.needles.size() < 4) {  // distractors: other keys, other numbers
        const std::string k2 = key();
        if (k2 != k) p.needles.push_back(fmt::format(" One of the special magic numbers for {} is: {}.", k2, number(7)));
      }
    p.suffix = fmt::format("\nWhat is the special magic number for {0} mentioned in the provided text? The special "
                           "magic number for {0} mentioned in the provided text is", k);
    p.answers = {v};
    p.max_new = 24;
  } else if (task == "variable_tracking") {
    const std::string v = number(5);
    std::vector<std::string> names;
    while (names.size() < 5) {
      std::string n;
      for (int i = 0; i < 5; ++i) n += char('A' + rng() % 26);
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    p.prefix = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n";
    p.needles.push_back(fmt::format(" VAR {} = {}.", names[0], v));
    for (size_t i = 1; i < names.size(); ++i) p.needles.push_back(fmt::format(" VAR {} = VAR {}.", names[i], names[i - 1]));
    p.suffix = fmt::format("\nQuestion: Find all variables that are assigned the value {0} in the text above. Answer: "
                           "According to the chain(s) of variable assignment in the text above, {1} variables are "
                           "assigned the value {0}, they are:", v, names.size());
    p.answers = names;
    p.max_new = 40;
  } else {
    input_error("unknown needle task '{}' (expected passkey, niah_single, niah_multikey or variable_tracking)", task);
  }
  return p;
}

// The prompt with `blocks` haystack blocks; the queried needle after block round(depth% · blocks);
// a chain's later links spread evenly over the blocks after it, distractors at seeded blocks.
std::string build(const Parts& p, const std::string& task, int blocks, int depth, uint64_t seed, int index,
                  size_t* needle_at) {
  std::vector<std::vector<const std::string*>> after(size_t(blocks) + 1);
  const int at = int(std::lround(depth / 100.0 * blocks));
  after[size_t(at)].push_back(&p.needles[0]);
  std::mt19937_64 rng(mix(seed, task + "/places/" + std::to_string(index)));
  for (size_t i = 1; i < p.needles.size(); ++i) {
    const int b = task == "variable_tracking"
                      ? at + int(std::lround(double(blocks - at) * double(i) / double(p.needles.size())))
                      : int(rng() % uint64_t(blocks + 1));
    after[size_t(std::clamp(b, 0, blocks))].push_back(&p.needles[i]);
  }
  std::string s = p.prefix;
  for (int b = 0; b <= blocks; ++b) {
    for (const std::string* n : after[size_t(b)]) {
      if (n == &p.needles[0]) *needle_at = s.size();
      s += *n;
    }
    if (b < blocks) s += kHaystack;
  }
  return s + p.suffix;
}

}  // namespace

const std::vector<std::string>& needle_task_names() {
  static const std::vector<std::string> v = {"passkey", "niah_single", "niah_multikey", "variable_tracking"};
  return v;
}

bool is_needle_task(const std::string& name) {
  return std::find(needle_task_names().begin(), needle_task_names().end(), name) != needle_task_names().end();
}

NeedleItem make_needle_item(const std::string& task, const Tokenizer& tok, int tokens, int depth, uint64_t seed,
                            int index) {
  if (depth < 0 || depth > 100) input_error("needle task {}: depth {} is not a percentage (0 to 100)", task, depth);
  const Parts p = parts_of(task, seed, index);
  size_t at = 0;
  auto count = [&](int blocks) { return int(tok.encode(build(p, task, blocks, depth, seed, index, &at)).size()); };
  const int base = count(0);
  if (base > tokens)
    input_error("needle task {}: {} tokens cannot hold its {} tokens of instructions and needles", task, tokens, base);
  // Tokens grow with the blocks almost exactly linearly: estimate, then step to the largest count
  // that fits.
  const int per = std::max(1, count(1) - base);
  int n = std::max(0, (tokens - base) / per);
  while (n > 0 && count(n) > tokens) --n;
  while (count(n + 1) <= tokens) ++n;
  NeedleItem item;
  item.task = task;
  item.index = index;
  item.depth = depth;
  item.prompt = build(p, task, n, depth, seed, index, &item.needle_at);
  item.tokens = int(tok.encode(item.prompt).size());
  item.answers = p.answers;
  item.max_new = p.max_new;
  item.question = p.suffix;
  return item;
}

double needle_match(const NeedleItem& item, const std::string& output) {
  if (item.answers.empty()) return 0;
  std::string out = output;
  for (auto& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  int found = 0;
  for (std::string a : item.answers) {
    for (auto& c : a) c = char(std::tolower(static_cast<unsigned char>(c)));
    found += out.find(a) != std::string::npos;
  }
  return double(found) / double(item.answers.size());
}

}  // namespace hg
