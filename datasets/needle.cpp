#include "datasets/needle.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

// RULER's "noise" haystack sentence; passkey's block is the same with a leading space.
constexpr const char* kNoise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// Words for keys ("adjective-noun", as RULER draws them from wonderwords' lists) and for cwe.
constexpr const char* kAdjectives[] = {
    "ancient", "bright",  "calm",    "daring",  "eager",   "faint",   "gentle",  "hollow",  "icy",     "jolly",
    "kind",    "lively",  "mellow",  "narrow",  "orange",  "proud",   "quiet",   "rapid",   "silent",  "tidy",
    "upbeat",  "vivid",   "wooden",  "yellow",  "zealous", "able",    "bitter",  "brave",   "broad",   "busy",
    "cheap",   "clever",  "cold",    "cool",    "crisp",   "curious", "dark",    "deep",    "dense",   "dry",
    "dull",    "early",   "easy",    "empty",   "fair",    "fancy",   "fast",    "fierce",  "firm",    "flat",
    "fresh",   "friendly", "funny",  "giant",   "glad",    "golden",  "grand",   "green",   "happy",   "heavy",
    "humble",  "hungry",  "jagged",  "keen",    "large",   "late",    "lazy",    "light",   "little",  "lonely",
    "loud",    "lucky",   "marble",  "modern",  "muddy",   "neat",    "noble",   "odd",     "pale",    "plain",
    "polite",  "purple",  "rare",    "rich",    "rough",   "round",   "royal",   "rusty",   "sharp",   "shiny",
    "simple",  "sleepy",  "smooth",  "soft",    "steep",   "strong",  "sunny",   "sweet",   "tall",    "warm"};
constexpr const char* kNouns[] = {
    "anchor", "basket", "candle", "desert",  "engine", "falcon", "garden", "harbor", "island",  "jacket",
    "kettle", "ladder", "meadow", "needle",  "orchard", "pillow", "quarry", "river", "saddle",  "tunnel",
    "valley", "window", "yogurt", "zipper",  "apple",  "arrow",  "badge",  "barrel", "beacon",  "bridge",
    "bucket", "cabin",  "camera", "canyon",  "carpet", "castle", "cellar", "circle", "cloud",   "coffee",
    "comet",  "copper", "cotton", "crystal", "dragon", "drum",   "eagle",  "feather", "fence",  "forest",
    "fountain", "glacier", "guitar", "hammer", "helmet", "horizon", "lantern", "lemon", "magnet", "mirror",
    "monkey", "mountain", "museum", "napkin", "ocean", "onion",  "otter",  "paddle", "parrot",  "pebble",
    "pepper", "piano",  "planet", "pocket",  "puzzle", "rabbit", "ribbon", "rocket", "sailor",  "shadow",
    "silver", "spider", "spoon",  "statue",  "stone",  "sugar",  "table",  "teapot", "ticket",  "tiger",
    "tomato", "tower",  "turtle", "violin",  "wagon",  "walnut", "whistle", "willow", "wizard", "wolf"};
constexpr const char* kVerbs[] = {
    "accept", "admire", "arrive", "bake",   "borrow", "breathe", "build",  "carry",  "catch",  "chase",
    "climb",  "collect", "cook",  "dance",  "deliver", "dream",  "drink",  "drive",  "explore", "fetch",
    "float",  "follow", "gather", "greet",  "grow",   "guard",   "hunt",   "jump",   "juggle", "knit",
    "laugh",  "listen", "march",  "melt",   "notice", "paint",   "plant",  "polish", "pour",   "protect",
    "repair", "ride",   "roast",  "sail",   "sing",   "sketch",  "steer",  "swim",   "travel", "wander"};

constexpr double kPi = 3.14159265358979323846;

uint64_t mix(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}
std::mt19937_64 item_rng(uint64_t seed, const std::string& task, int index, const std::string& what = "") {
  return std::mt19937_64(mix(mix(mix(0xcbf29ce484222325ull ^ seed, task), std::to_string(index)), what));
}
uint64_t below(std::mt19937_64& rng, uint64_t n) { return n == 0 ? 0 : rng() % n; }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}
std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// RULER's value kinds: 7-digit numbers, adjective-noun words, version-4 UUIDs.
enum class Kind { kNumbers, kWords, kUuids };
const char* plural(Kind k) { return k == Kind::kNumbers ? "numbers" : k == Kind::kWords ? "words" : "uuids"; }
std::string draw(Kind k, std::mt19937_64& rng) {
  if (k == Kind::kNumbers) return std::to_string(1000000 + below(rng, 9000000));
  if (k == Kind::kWords)
    return std::string(kAdjectives[below(rng, std::size(kAdjectives))]) + "-" + kNouns[below(rng, std::size(kNouns))];
  uint8_t b[16];
  const uint64_t hi = rng(), lo = rng();
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(hi >> (56 - 8 * i)), b[8 + i] = uint8_t(lo >> (56 - 8 * i));
  b[6] = uint8_t((b[6] & 0x0f) | 0x40), b[8] = uint8_t((b[8] & 0x3f) | 0x80);  // version 4, RFC 4122 variant
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", b[i]);
  }
  return s;
}

// RULER's depths for needles placed at random: round(linspace(0, 100, 40)).
int ruler_depth(int i) { return int(std::lround(100.0 * i / 39.0)); }

enum class Hay { kNoise, kEssay, kNeedle };
struct NiahDef {
  const char* name;
  Hay hay;
  Kind k, v;
  int nk, nv, nq;
};
// scripts/synthetic.yaml.
constexpr NiahDef kNiah[] = {
    {"niah_single_1", Hay::kNoise, Kind::kWords, Kind::kNumbers, 1, 1, 1},
    {"niah_single_2", Hay::kEssay, Kind::kWords, Kind::kNumbers, 1, 1, 1},
    {"niah_single_3", Hay::kEssay, Kind::kWords, Kind::kUuids, 1, 1, 1},
    {"niah_multikey_1", Hay::kEssay, Kind::kWords, Kind::kNumbers, 4, 1, 1},
    {"niah_multikey_2", Hay::kNeedle, Kind::kWords, Kind::kNumbers, 1, 1, 1},
    {"niah_multikey_3", Hay::kNeedle, Kind::kUuids, Kind::kUuids, 1, 1, 1},
    {"niah_multivalue", Hay::kEssay, Kind::kWords, Kind::kNumbers, 1, 4, 1},
    {"niah_multiquery", Hay::kEssay, Kind::kWords, Kind::kNumbers, 1, 1, 4},
};
const NiahDef* niah_def(const std::string& task) {
  for (const NiahDef& d : kNiah)
    if (task == d.name) return &d;
  return nullptr;
}

// A task's prompt for a haystack of n units (sentences, words, list entries): head + context +
// question, and where the queried needle is.
struct Built {
  std::string prompt, question;
  size_t needle_at = 0;
  std::vector<std::string> answers;  // when the answers depend on the size (cwe); else Task's
};
struct Task {
  std::vector<std::string> answers;
  int max_new = 0;
  std::function<Built(int n)> build;
};

// Needles placed among `units` joined by `sep`: needle i goes before unit at[i] (at[i] = units:
// after the last), in needle order where two share a place.
std::string place(const std::vector<std::string>& units, const std::string& sep, const std::vector<std::string>& needles,
                  const std::vector<int>& at, size_t* first_at) {
  std::vector<size_t> order(needles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return at[a] < at[b]; });
  std::vector<const std::string*> seq;
  std::vector<size_t> needle_of;  // index into seq → needle (or npos)
  size_t k = 0;
  for (size_t u = 0; u <= units.size(); ++u) {
    while (k < order.size() && at[order[k]] == int(u)) seq.push_back(&needles[order[k]]), needle_of.push_back(order[k++]);
    if (u < units.size()) seq.push_back(&units[u]), needle_of.push_back(std::string::npos);
  }
  std::string s;
  for (size_t i = 0; i < seq.size(); ++i) {
    if (i) s += sep;
    if (needle_of[i] == 0) *first_at = s.size();
    s += *seq[i];
  }
  return s;
}

// Distinct random depths of RULER's 40 for `count` needles.
std::vector<int> sampled_depths(std::mt19937_64& rng, size_t count) {
  std::vector<int> all(40);
  for (int i = 0; i < 40; ++i) all[size_t(i)] = ruler_depth(i);
  std::vector<int> out;
  for (size_t i = 0; i < count && !all.empty(); ++i) {
    const size_t j = size_t(below(rng, all.size()));
    out.push_back(all[j]);
    all.erase(all.begin() + int64_t(j));
  }
  return out;
}

// The essay's sentences of its first n words (repeated as needed), split after . ? or ! and a space.
std::vector<std::string> essay_sentences(const std::vector<std::string>& words, int n) {
  std::vector<std::string> sents;
  std::string cur;
  for (int i = 0; i < n; ++i) {
    const std::string& w = words[size_t(i) % words.size()];
    if (!cur.empty()) cur += ' ';
    cur += w;
    const char last = w.empty() ? ' ' : w.back();
    if (last == '.' || last == '?' || last == '!') sents.push_back(std::move(cur)), cur.clear();
  }
  if (!cur.empty()) sents.push_back(std::move(cur));
  return sents;
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> w;
  std::istringstream in(text);
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

Task niah_task(const NiahDef& d, uint64_t seed, int index, int depth, const Haystack* essay) {
  std::mt19937_64 rng = item_rng(seed, d.name, index);
  const int nk = std::max(d.nk, d.nq);
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> values;
  std::vector<std::string> needles;
  std::vector<int> needle_key;
  const std::string needle_fmt = "One of the special magic {} for {} is: {}.";
  while (int(keys.size()) < nk) {
    const std::string k = draw(d.k, rng);
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
    keys.push_back(k), values.emplace_back();
    for (int v = 0; v < d.nv; ++v) {
      values.back().push_back(draw(d.v, rng));
      needles.push_back(fmt::format(fmt::runtime(needle_fmt), plural(d.v), k, values.back().back()));
      needle_key.push_back(int(keys.size()) - 1);
    }
  }
  // The queried keys: nq of them, in a random order; the first one's first needle sits at the depth.
  std::vector<int> idx(static_cast<size_t>(nk));
  for (int i = 0; i < nk; ++i) idx[size_t(i)] = i;
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(size_t(d.nq));
  std::vector<std::string> queries, answers;
  for (int i : idx) {
    queries.push_back(keys[size_t(i)]);
    for (auto& v : values[size_t(i)]) answers.push_back(v);
  }
  const size_t first = size_t(std::find(needle_key.begin(), needle_key.end(), idx[0]) - needle_key.begin());
  std::swap(needles[0], needles[first]);
  const std::string query =
      queries.size() > 1 ? join(std::vector<std::string>(queries.begin(), queries.end() - 1), ", ") + ", and " + queries.back()
                         : queries[0];
  // The niah template and answer prefix (constants.py), singular when one value is asked for.
  std::string tpl =
      "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
      "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for "
      "{query} mentioned in the provided text? The special magic {type_needle_v} for {query} mentioned in the provided "
      "text are";
  std::string tv = plural(d.v);
  if (d.nq * d.nv == 1) {
    tpl = replace_all(tpl, "Some", "A");
    tpl = replace_all(tpl, "are all", "is");
    tpl = replace_all(tpl, "are", "is");
    tpl = replace_all(tpl, "answers", "answer");
    tv.pop_back();
  }
  tpl = replace_all(replace_all(tpl, "{type_needle_v}", tv), "{query}", query);
  const size_t cut = tpl.find("{context}");
  const std::string head = tpl.substr(0, cut), question = tpl.substr(cut + 9);
  std::vector<int> others = sampled_depths(rng, needles.size() - 1);
  const uint64_t hay_seed = rng();
  std::vector<std::string> words;
  if (d.hay == Hay::kEssay) {
    if (!essay || essay->text.empty())
      input_error("needle task {} needs an essay haystack (PIQA's train split in the data directory, or eval.haystack)",
                  d.name);
    words = split_words(essay->text);
    if (words.empty()) input_error("needle task {}: the essay haystack ({}) has no words", d.name, essay->source);
  }
  Task t;
  t.answers = answers;
  t.max_new = 128;
  t.build = [=, words = std::move(words)](int n) {
    std::vector<std::string> units;
    std::string sep = "\n";
    if (d.hay == Hay::kNoise) {
      units.assign(size_t(n), kNoise);
    } else if (d.hay == Hay::kNeedle) {  // every line a needle of another key
      for (int i = 0; i < n; ++i) {
        std::mt19937_64 r(mix(hay_seed, std::to_string(i)));
        std::string k = draw(d.k, r);
        while (std::find(keys.begin(), keys.end(), k) != keys.end()) k = draw(d.k, r);
        units.push_back(fmt::format(fmt::runtime(needle_fmt), plural(d.v), k, draw(d.v, r)));
      }
    } else {
      units = essay_sentences(words, n);
      sep = " ";
    }
    const int m = int(units.size());
    std::vector<int> at = {int(std::lround(m * (depth / 100.0)))};
    for (int dd : others) at.push_back(int(m * (dd / 100.0)));
    Built b;
    size_t first_at = 0;
    // RULER's essay joins the sentence runs and needles with spaces (an empty run leaves two).
    std::string context;
    if (d.hay == Hay::kEssay) {
      std::vector<size_t> order(needles.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t c) { return at[a] < at[c]; });
      int last = 0;
      std::vector<std::string> parts;
      for (size_t j = 0; j <= order.size(); ++j) {
        const int next = j < order.size() ? std::clamp(at[order[j]], 0, m) : m;
        parts.push_back(join(std::vector<std::string>(units.begin() + last, units.begin() + next), " "));
        last = next;
        if (j < order.size()) parts.push_back(needles[order[j]]);
      }
      for (size_t j = 0; j < parts.size(); ++j) {
        if (j) context += ' ';
        if (j % 2 == 1 && order[j / 2] == 0) first_at = context.size();
        context += parts[j];
      }
    } else {
      context = place(units, sep, needles, at, &first_at);
    }
    b.prompt = head + context + question;
    b.needle_at = head.size() + first_at;
    b.question = question;
    return b;
  };
  return t;
}


// vt: one chain of num_hops = 4 assignments on the noise haystack, after an in-context example of
// the same task (3-letter names, its own value, at most 500 tokens, its answer appended).
Task vt_task(uint64_t seed, int index, int depth, const Tokenizer& tok) {
  std::mt19937_64 rng = item_rng(seed, "vt", index);
  auto chain = [&](int letters, std::vector<std::string>& vars) {
    vars.clear();
    while (vars.size() < 5) {
      std::string v;
      for (int i = 0; i < letters; ++i) v += char('A' + below(rng, 26));
      if (std::find(vars.begin(), vars.end(), v) == vars.end()) vars.push_back(v);
    }
    const std::string value = std::to_string(10000 + below(rng, 89999));
    std::vector<std::string> links = {fmt::format("VAR {} = {}", vars[0], value)};
    for (size_t j = 1; j < vars.size(); ++j) links.push_back(fmt::format("VAR {} = VAR {} ", vars[j], vars[j - 1]));
    return std::make_pair(value, links);
  };
  const std::string head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
  auto question = [](const std::string& value) {
    return fmt::format("\nQuestion: Find all variables that are assigned the value {0} in the text above. Answer: "
                       "According to the chain(s) of variable assignment in the text above, 5 variables are assigned "
                       "the value {0}, they are: ",
                       value);
  };
  // Links at sorted positions among n noise lines: the first at `first` (or random), the rest after it.
  auto context = [](const std::vector<std::string>& links, int n, int first, uint64_t place_seed, size_t* first_at) {
    std::mt19937_64 r(place_seed);
    std::vector<int> at = {first};
    for (size_t j = 1; j < links.size(); ++j) at.push_back(first + int(below(r, uint64_t(n - first + 1))));
    std::sort(at.begin() + 1, at.end());
    return place(std::vector<std::string>(size_t(n), kNoise), "\n", links, at, first_at);
  };
  std::vector<std::string> ex_vars, vars;
  const auto [ex_value, ex_links] = chain(3, ex_vars);
  const uint64_t ex_place = rng();
  const uint64_t ex_first_seed = rng();
  auto example = [&, ex_value = ex_value, ex_links = ex_links](int n) {
    size_t unused = 0;
    std::mt19937_64 r(ex_first_seed);
    const int first = int(below(r, uint64_t(n + 1)));
    return head + context(ex_links, n, first, ex_place, &unused) + question(ex_value) + " " + join(ex_vars, " ") + "\n";
  };
  int ex_n = 0;  // RULER's example: the most noise within 500 tokens (nothing to generate)
  while (int(tok.encode(example(ex_n + 1)).size()) <= 500) ++ex_n;
  const std::string icl = example(ex_n) + "\n";
  const auto [value, links] = chain(5, vars);
  const uint64_t place_seed = rng();
  Task t;
  t.answers = vars;
  t.max_new = 30;
  t.build = [=, links = links, value = value](int n) {
    Built b;
    size_t first_at = 0;
    const std::string ctx = context(links, n, int(std::lround(n * (depth / 100.0))), place_seed, &first_at);
    b.question = question(value);
    b.prompt = icl + head + ctx + b.question;
    b.needle_at = icl.size() + head.size() + first_at;
    return b;
  };
  return t;
}

// Words for cwe (RULER: wonderwords' nouns, adjectives and verbs, then a list of English words):
// the lists above and the tokenizer's whole-word tokens (a space and 4-10 lowercase letters), then
// pronounceable made-up words if a list needs more; distinct, in a seeded order.
const std::vector<std::string>& real_words(const Tokenizer& tok) {
  // Cached by the vocabulary's content (its size and its first pieces), not by the tokenizer's
  // address, which a later tokenizer may reuse.
  uint64_t key = mix(0xcbf29ce484222325ull, std::to_string(tok.n_vocab()));
  for (int32_t id = 0; id < std::min(tok.n_vocab(), 2000); ++id) key = mix(key, tok.decode(std::span<const int32_t>(&id, 1)));
  static std::mutex mu;
  static std::map<uint64_t, std::vector<std::string>> cache;
  std::lock_guard<std::mutex> l(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::set<std::string> seen;
  std::vector<std::string> words;
  auto add = [&](const std::string& w) {
    if (seen.insert(w).second) words.push_back(w);
  };
  for (const char* w : kAdjectives) add(w);
  for (const char* w : kNouns) add(w);
  for (const char* w : kVerbs) add(w);
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const std::string piece = tok.decode(std::span<const int32_t>(&id, 1));
    if (piece.size() < 5 || piece.size() > 11 || piece[0] != ' ') continue;
    if (std::all_of(piece.begin() + 1, piece.end(), [](char c) { return c >= 'a' && c <= 'z'; })) add(piece.substr(1));
  }
  return cache.emplace(key, std::move(words)).first->second;
}

std::vector<std::string> cwe_pool(std::mt19937_64& rng, int n, const Tokenizer& tok) {
  std::vector<std::string> pool = real_words(tok);
  std::set<std::string> seen(pool.begin(), pool.end());
  static constexpr const char* kOnset[] = {"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"};
  static constexpr const char* kVowel[] = {"a", "e", "i", "o", "u"};
  std::mt19937_64 made(0x5eedull);  // the same made-up words for every item
  while (int(pool.size()) < n) {
    std::string w;
    for (int i = 0; i < 3; ++i) w += std::string(kOnset[below(made, std::size(kOnset))]) + kVowel[below(made, std::size(kVowel))];
    if (seen.insert(w).second) pool.push_back(w);
  }
  std::shuffle(pool.begin(), pool.end(), rng);
  return pool;
}

// cwe: a numbered list where 10 words appear freq_cw times and the others freq_ucw times (30 and
// 3; 6 and 1 below 4096 tokens), after one solved example (40 words 10/3; 20 words 3/1).
Task cwe_task(uint64_t seed, int index, int tokens, const Tokenizer& tok) {
  const std::string tpl_head = "Below is a numbered list of words. In these words, some appear more often than others. "
                               "Memorize the ones that appear most often.\n";
  const std::string question = "\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 "
                               "words that appear most often in the list are:";
  const bool short_ctx = tokens < 4096;
  const int freq_cw = short_ctx ? 6 : 30, freq_ucw = short_ctx ? 1 : 3;
  auto numbered = [](const std::vector<std::string>& w) {
    std::string s;
    for (size_t i = 0; i < w.size(); ++i) s += fmt::format("{}{}. {}", i ? " " : "", i + 1, w[i]);
    return s;
  };
  // One list: `num` distinct words, the first 10 common.
  auto list = [&](std::mt19937_64& rng, int num, int rep_c, int rep_u, std::vector<std::string>* common) {
    std::vector<std::string> pool = cwe_pool(rng, num, tok);
    pool.resize(size_t(num));
    std::vector<std::string> words;
    for (int i = 0; i < num; ++i)
      for (int r = 0; r < (i < 10 ? rep_c : rep_u); ++r) words.push_back(pool[size_t(i)]);
    std::shuffle(words.begin(), words.end(), rng);
    *common = std::vector<std::string>(pool.begin(), pool.begin() + std::min(10, num));
    return numbered(words);
  };
  std::mt19937_64 ex_rng = item_rng(seed, "cwe", index, "example");
  std::vector<std::string> ex_common;
  const std::string ex_list = short_ctx ? list(ex_rng, 20, 3, 1, &ex_common) : list(ex_rng, 40, 10, 3, &ex_common);
  const std::string shot = tpl_head + ex_list + question + " " + numbered(ex_common);
  Task t;
  t.max_new = 120;
  t.build = [=](int n) {
    std::mt19937_64 rng = item_rng(seed, "cwe", index);
    std::vector<std::string> common;
    const int num = std::max(10, n + 10);
    std::string l = list(rng, num, freq_cw, freq_ucw, &common);
    Built b;
    b.answers = common;
    b.question = question;
    b.prompt = shot + "\n" + tpl_head + l + question;
    return b;
  };
  return t;
}

// fwe: coded words of 6 letters from a vocabulary of (tokens − to generate) / 50, word k of it
// appearing ⌊n · k^−α / ζ(α)⌋ times (α = 2), the first one '...' (noise); the answer is words 2-4.
Task fwe_task(uint64_t seed, int index, int tokens) {
  constexpr int kMaxNew = 50;
  const int vocab_size = std::max(4, (tokens - kMaxNew) / 50);
  std::mt19937_64 rng = item_rng(seed, "fwe", index);
  std::set<std::string> seen;
  std::vector<std::string> vocab;
  while (int(vocab.size()) < vocab_size) {
    std::string w;
    for (int i = 0; i < 6; ++i) w += char('a' + below(rng, 26));
    if (seen.insert(w).second) vocab.push_back(w);
  }
  vocab[0] = "...";
  const uint64_t shuffle_seed = rng();
  Task t;
  t.answers = {vocab[1], vocab[2], vocab[3]};
  t.max_new = kMaxNew;
  const std::string head = "Read the following coded text and track the frequency of each coded word. Find the three "
                           "most frequently appeared coded words. ";
  const std::string question = "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the "
                               "three most frequently appeared words in the above coded text? Answer: According to the "
                               "coded text above, the three most frequently appeared words are:";
  t.build = [=](int n) {
    const double zeta2 = kPi * kPi / 6;
    std::vector<std::string> words;
    for (size_t k = 0; k < vocab.size(); ++k) {
      const int c = int(double(n) * std::pow(double(k + 1), -2.0) / zeta2);
      for (int i = 0; i < c; ++i) words.push_back(vocab[k]);
    }
    std::mt19937_64 r(shuffle_seed);
    std::shuffle(words.begin(), words.end(), r);
    Built b;
    b.question = question;
    b.prompt = head + join(words, " ") + question;
    return b;
  };
  return t;
}

// passkey (Mohtashami & Jaggi): blocks of the noise sentence, the key after block round(depth% · n).
Task passkey_task(uint64_t seed, int index, int depth) {
  std::mt19937_64 rng = item_rng(seed, "passkey", index);
  const std::string k = std::to_string(10000 + below(rng, 90000));
  const std::string prefix = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                             "it. I will quiz you about the important information there.\n";
  const std::string needle = fmt::format(" The pass key is {0}. Remember it. {0} is the pass key.", k);
  const std::string suffix = "\nWhat is the pass key? The pass key is";
  Task t;
  t.answers = {k};
  t.max_new = 16;
  t.build = [=](int n) {
    Built b;
    const int at = int(std::lround(depth / 100.0 * n));
    b.prompt = prefix;
    for (int i = 0; i <= n; ++i) {
      if (i == at) b.needle_at = b.prompt.size(), b.prompt += needle;
      if (i < n) b.prompt += std::string(" ") + kNoise;
    }
    b.prompt += suffix;
    b.question = suffix;
    return b;
  };
  return t;
}

// qa: the gold documents among n documents in all (the question's article's others first, then
// the corpus's), "Document i:" each; the first gold document at the depth, the others shuffled.
Task qa_task(const QaCorpus& c, uint64_t seed, int index, int depth, const std::string& task) {
  if (c.qas.empty()) input_error("needle task {}: {} holds no questions", task, c.source);
  if (index >= int(c.qas.size()))
    input_error("needle task {}: item {} asked of {}'s {} questions", task, index, c.source, c.qas.size());
  const QaCorpus::Qa& q = c.qas[size_t(index)];
  std::mt19937_64 rng = item_rng(seed, task, index);
  // The distractors in the order they join: the same article's, then the corpus's others.
  std::vector<int> extra = q.more;
  std::shuffle(extra.begin(), extra.end(), rng);
  std::vector<int> rest;
  std::set<int> taken(q.gold.begin(), q.gold.end());
  taken.insert(q.more.begin(), q.more.end());
  for (int i = 0; i < int(c.docs.size()); ++i)
    if (!taken.count(i)) rest.push_back(i);
  std::shuffle(rest.begin(), rest.end(), rng);
  extra.insert(extra.end(), rest.begin(), rest.end());
  const uint64_t order_seed = rng();
  const std::string head = "Answer the question based on the given documents. Only give me the answer and do not output "
                           "any other words.\n\nThe following are given documents.\n\n";
  const std::string question = "\n\nAnswer the question based on the given documents. Only give me the answer and do "
                               "not output any other words.\n\nQuestion: " + q.query + " Answer:";
  Task t;
  t.answers = q.answers;
  t.max_new = 32;
  t.build = [=, &c](int n) {
    std::vector<int> docs(q.gold.begin() + 1, q.gold.end());
    // Past the corpus's documents they repeat (as RULER's do).
    const std::vector<int> pool = extra.empty() ? q.gold : extra;
    for (int i = 0; i < n; ++i) docs.push_back(pool[size_t(i) % pool.size()]);
    std::mt19937_64 r(order_seed);
    std::shuffle(docs.begin(), docs.end(), r);
    const size_t at = size_t(std::lround((docs.size()) * (depth / 100.0)));
    docs.insert(docs.begin() + int64_t(at), q.gold[0]);
    Built b;
    std::string ctx;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (i) ctx += "\n\n";
      if (i == at) b.needle_at = head.size() + ctx.size();
      ctx += fmt::format("Document {}:\n{}", i + 1, c.docs[size_t(docs[i])]);
    }
    b.question = question;
    b.prompt = head + ctx + question;
    return b;
  };
  return t;
}

// The largest n ≥ 0 with fits(n), fits monotone, searched from `hint` by doubling steps, then
// bisection.
int largest_fitting(const std::function<bool(int)>& fits, int hint) {
  constexpr int kMaxUnits = 1 << 26;  // a haystack whose length never grows would never stop fitting
  int lo, hi;  // fits(lo), !fits(hi)
  if (fits(hint)) {
    lo = hint;
    int step = 1;
    while (lo + step < kMaxUnits && fits(lo + step)) lo += step, step *= 2;
    if (lo + step >= kMaxUnits) throw std::logic_error("needle: a haystack that does not grow with its size");
    hi = lo + step;
  } else {
    hi = hint;
    int step = 1;
    while (hi - step > 0 && !fits(hi - step)) hi -= step, step *= 2;
    lo = std::max(0, hi - step);
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

const std::vector<std::string>& needle_task_names() {
  static const std::vector<std::string> v = {
      "passkey",         "niah_single_1",   "niah_single_2",   "niah_single_3", "niah_multikey_1",
      "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"};
  return v;
}

bool is_needle_task(const std::string& name) {
  return std::find(needle_task_names().begin(), needle_task_names().end(), name) != needle_task_names().end();
}

bool needle_task_needs_essay(const std::string& name) {
  const NiahDef* d = niah_def(name);
  return d && d->hay == Hay::kEssay;
}

bool needle_task_is_qa(const std::string& name) { return name == "qa_1" || name == "qa_2"; }

bool needle_task_has_depth(const std::string& name) { return is_needle_task(name) && name != "cwe" && name != "fwe"; }

Haystack load_haystack(const std::string& data_dir, const std::string& file) {
  Haystack h;
  if (!file.empty()) {
    if (!file_present(file)) input_error("{}: cannot read the haystack file", file);
    std::string text = read_regular_file(file, kMaxReadFileBytes);
    if (file.size() > 5 && file.substr(file.size() - 5) == ".json") {
      const auto j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string())
        input_error("{}: expected a JSON object with a \"text\" string (RULER's PaulGrahamEssays.json)", file);
      text = j["text"].get<std::string>();
    }
    h.text = std::move(text);
    h.source = file;
  } else {
    const std::string jsonl = data_dir + "/piqa/train.jsonl", labels = data_dir + "/piqa/train-labels.lst";
    for (const std::string& f : {jsonl, labels})
      if (!file_present(f))
        input_error("{}: cannot read the essay haystack (PIQA's train split; see datasets/README.md, set --data-dir or "
                    "HG_DATA_DIR, or eval.haystack)",
                    f);
    std::istringstream rows(read_regular_file(jsonl, kMaxReadFileBytes)), labs(read_regular_file(labels, kMaxReadFileBytes));
    std::string row, lab;
    int line = 0;
    while (std::getline(rows, row) && std::getline(labs, lab)) {
      ++line;
      const auto j = nlohmann::json::parse(row, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("goal") || !j.contains("sol1") || !j.contains("sol2"))
        input_error("{}:{}: not a PIQA record (expected goal, sol1, sol2)", jsonl, line);
      std::string s = j["goal"].get<std::string>() + " " + j[lab.rfind('1', 0) == 0 ? "sol2" : "sol1"].get<std::string>();
      while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
      if (!s.empty() && s.back() != '.' && s.back() != '?' && s.back() != '!') s += '.';
      h.text += (h.text.empty() ? "" : " ") + s;
    }
    h.source = "piqa/train.jsonl (AFL-3.0)";
  }
  return h;
}

QaCorpus load_qa_corpus(const std::string& task, const std::string& file) {
  if (!needle_task_is_qa(task)) input_error("{} is not a QA task (qa_1 or qa_2)", task);
  const char* what = task == "qa_1" ? "SQuAD v2 JSON (data → paragraphs → qas)" : "HotpotQA JSON (a list of question, answer, context)";
  if (file.empty())
    input_error("task {} needs eval.{}: a {} file (RULER's json/{}.json)", task, task == "qa_1" ? "squad" : "hotpotqa", what,
                task == "qa_1" ? "squad" : "hotpotqa");
  if (!file_present(file)) input_error("{}: cannot read the {} file for {}", file, what, task);
  const auto j = nlohmann::json::parse(read_regular_file(file, kMaxReadFileBytes), nullptr, false);
  auto bad = [&](const std::string& why) { input_error("{}: not {}: {}", file, what, why); };
  if (j.is_discarded()) bad("not JSON");
  QaCorpus c;
  c.source = file;
  std::map<std::string, int> id;
  auto doc_ids = [&](const std::vector<std::string>& all) {
    std::set<std::string> uniq(all.begin(), all.end());
    c.docs.assign(uniq.begin(), uniq.end());  // sorted, as RULER's
    for (size_t i = 0; i < c.docs.size(); ++i) id[c.docs[i]] = int(i);
  };
  auto str = [&](const nlohmann::json& x, const char* k) {
    if (!x.is_object() || !x.contains(k) || !x[k].is_string()) bad(fmt::format("a record without a string '{}'", k));
    return x[k].get<std::string>();
  };
  try {
    if (task == "qa_1") {
      if (!j.is_object() || !j.contains("data") || !j["data"].is_array()) bad("no 'data' list");
      std::vector<std::string> all;
      for (auto& d : j["data"])
        for (auto& p : d.at("paragraphs")) all.push_back(str(p, "context"));
      doc_ids(all);
      for (auto& d : j["data"]) {
        std::vector<int> article;
        for (auto& p : d.at("paragraphs")) article.push_back(id.at(str(p, "context")));
        for (auto& p : d.at("paragraphs")) {
          const int gold = id.at(str(p, "context"));
          for (auto& qa : p.at("qas")) {
            if (qa.value("is_impossible", false)) continue;
            QaCorpus::Qa q;
            q.query = str(qa, "question");
            for (auto& a : qa.at("answers")) q.answers.push_back(str(a, "text"));
            if (q.answers.empty()) continue;
            q.gold = {gold};
            for (int o : article)
              if (o != gold) q.more.push_back(o);
            c.qas.push_back(std::move(q));
          }
        }
      }
    } else {
      if (!j.is_array()) bad("not a list of questions");
      auto doc = [&](const nlohmann::json& ctx) {
        std::string s = ctx.at(0).get<std::string>() + "\n";
        for (auto& sent : ctx.at(1)) s += sent.get<std::string>();
        return s;
      };
      std::vector<std::string> all;
      for (auto& d : j)
        for (auto& ctx : d.at("context")) all.push_back(doc(ctx));
      doc_ids(all);
      for (auto& d : j) {
        QaCorpus::Qa q;
        q.query = str(d, "question");
        q.answers = {str(d, "answer")};
        for (auto& ctx : d.at("context")) q.gold.push_back(id.at(doc(ctx)));
        if (q.gold.empty()) bad("a question without context paragraphs");
        c.qas.push_back(std::move(q));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    bad(e.what());
  }
  return c;
}

NeedleItem make_needle_item(const std::string& task, const Tokenizer& tok, int tokens, int depth, uint64_t seed,
                            int index, const Haystack* essay, const QaCorpus* qa) {
  if (depth < 0 || depth > 100) input_error("needle task {}: depth {} is not a percentage (0 to 100)", task, depth);
  if (!needle_task_has_depth(task)) depth = 0;
  Task t;
  if (task == "passkey") t = passkey_task(seed, index, depth);
  else if (const NiahDef* d = niah_def(task)) t = niah_task(*d, seed, index, depth, essay);
  else if (task == "vt") t = vt_task(seed, index, depth, tok);
  else if (task == "cwe") t = cwe_task(seed, index, tokens, tok);
  else if (task == "fwe") t = fwe_task(seed, index, tokens);
  else if (needle_task_is_qa(task)) {
    if (!qa) input_error("needle task {} needs its QA file (eval.{})", task, task == "qa_1" ? "squad" : "hotpotqa");
    t = qa_task(*qa, seed, index, depth, task);
  }
  else input_error("unknown needle task '{}' (expected one of {})", task, fmt::format("{}", fmt::join(needle_task_names(), ", ")));
  // The prompt and its tokens to generate within `tokens` (RULER's max_seq_length).
  auto count = [&](int n) { return int(tok.encode(t.build(n).prompt).size()); };
  const int base = count(0);
  if (base + t.max_new > tokens)
    input_error("needle task {}: {} tokens cannot hold its {} tokens of instructions and needles and {} to generate",
                task, tokens, base, t.max_new);
  // A first estimate from two sizes (tokens grow almost linearly with the units), then the search:
  // from the same start for every call, so that the size depends on the item alone.
  const int probe = 16;
  const int per = std::max(1, (count(probe) - base + probe - 1) / probe);
  const int hint = std::max(1, (tokens - t.max_new - base) / per);
  const int n = largest_fitting([&](int m) { return count(m) + t.max_new <= tokens; }, hint);
  const Built b = t.build(n);
  NeedleItem item;
  item.task = task;
  item.index = index;
  item.depth = needle_task_has_depth(task) ? depth : -1;
  item.prompt = b.prompt;
  item.needle_at = b.needle_at;
  item.tokens = int(tok.encode(item.prompt).size());
  item.answers = b.answers.empty() ? t.answers : b.answers;
  item.max_new = t.max_new;
  item.question = b.question;
  item.any_answer = needle_task_is_qa(task);
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
  if (item.any_answer) return found > 0 ? 1.0 : 0.0;
  return double(found) / double(item.answers.size());
}

}  // namespace hg
