// The accuracy harness: CPython's sampler, the loaders (item counts and label distributions of
// ../shared/datasets), lm-eval 0.4 request strings (golden hashes from an independent Python
// build with CPython's random), malformed files, lm-eval's tokenization of a request, acc /
// acc_norm / stderr, and scoring through strategies in both context modes: CPU equals ref, the
// exact strategies agree, a budget beyond the sequence equals full and a small one does not; an
// accuracy experiment file runs unchanged on a user's HF directory.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "baselines/registry.h"
#include "datasets/pyrandom.h"
#include "datasets/score.h"
#include "datasets/tasks.h"
#include "engine/core/error.h"
#include "engine/formats/formats.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/spec.h"
#include "hf_writer.h"
#include "strategy_test_util.h"
#include "test_util.h"

namespace hg {
namespace {
namespace fs = std::filesystem;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

TEST(PyRandom, MatchesCPython) {
  // python3: r = random.Random(1234); [r.getrandbits(32) for _ in range(3)], r.sample(range(n), k)
  PyRandom a(1234);
  EXPECT_EQ(a.next_u32(), 4150886329u);
  EXPECT_EQ(a.next_u32(), 3342196574u);
  EXPECT_EQ(a.next_u32(), 1892932127u);
  PyRandom b(1234);  // set-based selection (n > setsize), two draws in a row
  EXPECT_EQ(b.sample(16113, 4), (std::vector<uint32_t>{15834, 12749, 7220, 1914}));
  EXPECT_EQ(b.sample(16113, 4), (std::vector<uint32_t>{122, 1485, 14925, 15442}));
  PyRandom c(1234);  // pool-based selection (n <= setsize)
  EXPECT_EQ(c.sample(10, 4), (std::vector<uint32_t>{7, 1, 0, 9}));
  PyRandom d(1234);
  EXPECT_EQ(d.sample(4957, 3), (std::vector<uint32_t>{3610, 957, 61}));
}

std::string data_dir() { return test::shared_path("datasets"); }

TEST(Tasks, LoadersCountItemsAndLabels) {
  HG_REQUIRE_SHARED("datasets/piqa/valid.jsonl");
  struct Want {
    const char* task;
    size_t items;
    std::vector<int> gold_counts;
  };
  for (const Want& w : {Want{"piqa", 1838, {910, 928}}, Want{"openbookqa", 500, {138, 126, 132, 104}},
                        Want{"copa", 100, {55, 45}}, Want{"rte", 277, {146, 131}}}) {
    const TaskData t = load_task(w.task, data_dir());
    ASSERT_EQ(t.eval.size(), w.items) << w.task;
    std::vector<int> counts(w.gold_counts.size());
    for (auto& d : t.eval) counts[size_t(d.gold)]++;
    EXPECT_EQ(counts, w.gold_counts) << w.task;
  }
  EXPECT_EQ(load_task("piqa", data_dir()).fewshot.size(), 16113u);
  EXPECT_EQ(load_task("openbookqa", data_dir()).fewshot.size(), 4957u);
  EXPECT_EQ(load_task("copa", data_dir()).fewshot.size(), 400u);
  EXPECT_EQ(load_task("rte", data_dir()).fewshot.size(), 2490u);
}

// FNV-1a of the context, its UTF-8 length and FNV-1a of the continuations joined by '|', from an
// independent Python build of lm-eval 0.4's formatting with CPython's random.Random(1234).
struct Golden {
  const char* task;
  int shots, index;
  uint64_t context_hash;
  size_t context_bytes;
  uint64_t continuations_hash;
  int gold;
};
const Golden kGolden[] = {
    {"piqa", 0, 0, 0xbc295c17fe0b1dffull, 74, 0x485912c62198c74aull, 0},
    {"piqa", 0, 7, 0x890add3636b94639ull, 64, 0xc59a819292b64595ull, 0},
    {"piqa", 3, 0, 0xa13b46bd47c2f9fdull, 587, 0x485912c62198c74aull, 0},
    {"piqa", 3, 7, 0xeece0927b79d0349ull, 385, 0xc59a819292b64595ull, 0},
    {"openbookqa", 0, 0, 0xfcebe3138f5108f2ull, 191, 0x33d1b6f72521b9f9ull, 1},
    {"openbookqa", 0, 7, 0x139fed9151634e9cull, 104, 0xdad7df97e66d7b0full, 1},
    {"openbookqa", 3, 0, 0xe17a3e3ce4560521ull, 448, 0x33d1b6f72521b9f9ull, 1},
    {"openbookqa", 3, 7, 0x8f76b2acd1652383ull, 321, 0xdad7df97e66d7b0full, 1},
    {"copa", 0, 0, 0xddcfff7d337f0aa8ull, 38, 0x511b51e04c621c08ull, 1},
    {"copa", 0, 7, 0xc98acb34fc2cb236ull, 36, 0x894adcf472c7a532ull, 0},
    {"copa", 3, 0, 0x0e00d584c52487afull, 245, 0x511b51e04c621c08ull, 1},
    {"copa", 3, 7, 0xd791f8dd543c718aull, 265, 0x894adcf472c7a532ull, 0},
    {"rte", 0, 0, 0x7ec478da0e1173e2ull, 203, 0x03ee6d9024cb5d26ull, 1},
    {"rte", 0, 7, 0x1837feeb65a2aae5ull, 283, 0x03ee6d9024cb5d26ull, 0},
    {"rte", 3, 0, 0xe80a73c10f7239c2ull, 1845, 0x03ee6d9024cb5d26ull, 1},
    {"rte", 3, 7, 0xbbdefc074846721full, 1472, 0x03ee6d9024cb5d26ull, 0},
};

TEST(Tasks, GoldenRequestsMatchLmEval) {
  HG_REQUIRE_SHARED("datasets/piqa/valid.jsonl");
  std::map<std::string, TaskData> tasks;
  for (auto& n : task_names()) tasks.emplace(n, load_task(n, data_dir()));
  for (const Golden& g : kGolden) {
    // The draws are sequential over documents: item 7 sees the sampler after items 0..6.
    const auto reqs = build_requests(tasks.at(g.task), g.shots, 8);
    const Request& r = reqs[size_t(g.index)];
    std::string joined;
    for (auto& c : r.continuations) joined += (joined.empty() ? "" : "|") + c;
    EXPECT_EQ(r.context.size(), g.context_bytes) << g.task << " " << g.shots << "-shot item " << g.index << ":\n" << r.context;
    EXPECT_EQ(fnv1a(r.context), g.context_hash) << g.task << " " << g.shots << "-shot item " << g.index << ":\n" << r.context;
    EXPECT_EQ(fnv1a(joined), g.continuations_hash) << g.task << " item " << g.index << ": " << joined;
    EXPECT_EQ(r.gold, g.gold) << g.task << " item " << g.index;
    // Shape: examples joined by blank lines, each `text + " " + target`.
    size_t blank = 0;
    for (size_t p = r.context.find("\n\n"); p != std::string::npos; p = r.context.find("\n\n", p + 2)) ++blank;
    if (g.shots == 3 && std::string(g.task) != "rte") {
      EXPECT_EQ(blank, 3u) << g.task;
    }
  }
  // Known strings: the continuations carry the target delimiter (COPA's choices their own space too).
  const auto rte = build_requests(tasks.at("rte"), 0, 1);
  EXPECT_EQ(rte[0].continuations, (std::vector<std::string>{" True", " False"}));
  EXPECT_EQ(rte[0].context.substr(rte[0].context.size() - 23), " True or False?\nAnswer:");
  const auto piqa = build_requests(tasks.at("piqa"), 0, 1);
  EXPECT_EQ(piqa[0].context.rfind("Question: ", 0), 0u);
  const auto copa = build_requests(tasks.at("copa"), 0, 1);
  EXPECT_EQ(copa[0].context, "The man turned on the faucet therefore");
  EXPECT_EQ(copa[0].continuations[1], "  water flowed from the spout.");
  // --write-requests' record.
  const auto j = request_json(copa[0]);
  EXPECT_EQ(j["task"], "copa");
  EXPECT_EQ(j["choices"][0], "  the toilet filled with water.");
}

// A data directory written here, for malformed-file errors and the HF-directory run.
std::string write_copa_dir(const std::string& name, const std::string& val_text) {
  const std::string d = test::temp_path(name);
  fs::remove_all(d);
  fs::create_directories(d + "/copa");
  test::write_file(d + "/copa/val.jsonl", val_text);
  std::string train;
  for (int i = 0; i < 6; ++i)
    train += fmt::format(R"({{"premise": "The pot boiled number {}.", "choice1": "Steam rose.", "choice2": "Ice formed.", )"
                         R"("question": "effect", "label": 0, "idx": {}}})" "\n", i, i);
  test::write_file(d + "/copa/train-from-copa-dev-1-400.jsonl", train);
  return d;
}

std::string error_of(const std::function<void()>& f) { return test::input_error_of(f); }

TEST(Tasks, MalformedFilesNameFileLineAndField) {
  const std::string good = R"({"premise": "It rained.", "choice1": "The grass got wet.", "choice2": "The sun set.", "question": "effect", "label": 0})";
  std::string d = write_copa_dir("copa_bad1", good + "\n" + R"({"choice1": "a", "choice2": "b", "question": "cause", "label": 1})" + "\n");
  std::string e = error_of([&] { load_task("copa", d); });
  EXPECT_NE(e.find("copa/val.jsonl:2: field 'premise' missing"), std::string::npos) << e;
  d = write_copa_dir("copa_bad2", good + "\nnot json\n");
  e = error_of([&] { load_task("copa", d); });
  EXPECT_NE(e.find("copa/val.jsonl:2: not a JSON object"), std::string::npos) << e;
  d = write_copa_dir("copa_bad3", R"({"premise": "x.", "choice1": "a", "choice2": "b", "question": "why", "label": 0})");
  e = error_of([&] { load_task("copa", d); });
  EXPECT_NE(e.find("copa/val.jsonl:1: field 'question' is 'why'"), std::string::npos) << e;
  e = error_of([&] { load_task("rte", d); });
  EXPECT_NE(e.find("rte/glue/dev.tsv: cannot read"), std::string::npos) << e;
  e = error_of([&] { load_task("mmlu", d); });
  EXPECT_NE(e.find("unknown task 'mmlu'"), std::string::npos) << e;
  fs::create_directories(d + "/rte/glue");
  test::write_file(d + "/rte/glue/dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n");
  e = error_of([&] { load_task("rte", d); });
  EXPECT_NE(e.find("rte/glue/dev.tsv:2: field 'label' is 'maybe'"), std::string::npos) << e;
  fs::create_directories(d + "/piqa");
  test::write_file(d + "/piqa/valid.jsonl", R"({"goal": "g", "sol1": "a", "sol2": "b"})" "\n");
  test::write_file(d + "/piqa/valid-labels.lst", "0\n1\n");
  e = error_of([&] { load_task("piqa", d); });
  EXPECT_NE(e.find("2 labels for 1 items"), std::string::npos) << e;
}

// Requests over a synthetic model's byte tokenizer.
std::vector<Request> synthetic_requests() {
  std::vector<Request> out;
  const std::vector<std::tuple<std::string, std::vector<std::string>, int>> items = {
      {"Question: Where does the cat like to sleep at night?\nAnswer:", {"on the warm mat", "in the cold rain"}, 0},
      {"The glass fell off the table therefore", {" it shattered.", " it sang a song.", " it flew away."}, 0},
      {"Tom planted seeds in the spring. In the summer the garden was", {"full of flowers", "empty", "on the moon"}, 0},
  };
  for (size_t i = 0; i < items.size(); ++i) {
    Request r;
    r.task = "synthetic";
    r.index = int(i);
    r.context = std::get<0>(items[i]);
    r.choices = std::get<1>(items[i]);
    for (auto& c : r.choices) r.continuations.push_back(" " + c);
    r.gold = std::get<2>(items[i]);
    out.push_back(r);
  }
  return out;
}

struct Scored {
  std::vector<ItemScore> items;
};

Scored score_with(const Model& m, const std::string& strategy, const std::map<std::string, std::string>& params,
                  ContextMode mode, bool ref_backend = false) {
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  std::unique_ptr<Backend> ref;
  if (ref_backend) ref = make_ref_backend();
  Backend& be = ref_backend ? *ref : rt.accel_backend();
  auto kv = make_strategy(strategy, StrategyContext{be, &rt, &m}, params);
  Scorer s(m, be, *kv, ref_backend ? nullptr : &rt, mode, false);
  Scored out;
  for (auto& r : synthetic_requests()) out.items.push_back(s.score(r));
  return out;
}

void expect_same(const Scored& a, const Scored& b, double tol, const std::string& what) {
  ASSERT_EQ(a.items.size(), b.items.size());
  for (size_t i = 0; i < a.items.size(); ++i) {
    EXPECT_EQ(a.items[i].pred, b.items[i].pred) << what << " item " << i;
    EXPECT_EQ(a.items[i].tokens, b.items[i].tokens) << what << " item " << i;
    for (size_t c = 0; c < a.items[i].ll.size(); ++c)
      EXPECT_NEAR(a.items[i].ll[c], b.items[i].ll[c], tol * (1 + std::abs(b.items[i].ll[c]))) << what << " item " << i << " choice " << c;
  }
}

double max_diff(const Scored& a, const Scored& b) {
  double d = 0;
  for (size_t i = 0; i < a.items.size(); ++i)
    for (size_t c = 0; c < a.items[i].ll.size(); ++c) d = std::max(d, std::abs(a.items[i].ll[c] - b.items[i].ll[c]));
  return d;
}

TEST(Scorer, EncodesAsLmEvalDoes) {
  Model m = load_model("synthetic:tiny-llama");
  const Tokenizer& tok = *m.tokenizer;
  Request r;
  r.task = "t";
  r.context = "ab ";  // trailing space moves to the continuation
  r.continuations = {" c", "de"};
  r.choices = {"c", "de"};
  const EncodedRequest e = encode_request(tok, r, false);
  EXPECT_EQ(e.context, tok.encode("ab"));
  EXPECT_EQ(e.continuations[0], tok.encode("  c"));
  EXPECT_EQ(e.continuations[1], tok.encode(" de"));
  const EncodedRequest b = encode_request(tok, r, true);
  ASSERT_FALSE(b.context.empty());
  EXPECT_EQ(b.context[0], tok.bos_id);
  EXPECT_EQ(b.continuations, e.continuations);
}

// Where lm-eval versions differ, the named rules: 0.4.9 (default) spaces COPA's choices twice
// (target delimiter + the choice's own space) in the scored continuations and the few-shot
// examples, 0.3 once; 0.4.10 prepends the tokenizer's BOS. An unknown version is an error.
TEST(Tasks, LmEvalVersionRules) {
  const std::string val = R"({"premise": "The cup fell.", "choice1": "It broke.", "choice2": "It sang.", )"
                          R"("question": "effect", "label": 0, "idx": 0})" "\n";
  const TaskData t = load_task("copa", write_copa_dir("copa_rules", val));
  const Request v04 = build_requests(t, 2, 1, 1234)[0];
  const Request v03 = build_requests(t, 2, 1, 1234, lm_eval_rules("0.3", "test"))[0];
  EXPECT_EQ(v04.continuations[0], "  it broke.");
  EXPECT_EQ(v03.continuations[0], " it broke.");
  EXPECT_NE(v04.context.find("therefore  steam rose."), std::string::npos) << v04.context;
  EXPECT_NE(v03.context.find("therefore steam rose."), std::string::npos) << v03.context;
  EXPECT_EQ(v03.context.find("  "), std::string::npos) << v03.context;
  EXPECT_EQ(lm_eval_rules("0.4.10", "t").bos, BosRule::kTokenizer);
  EXPECT_EQ(lm_eval_rules("0.4.9", "t").bos, BosRule::kNone);
  EXPECT_THROW(lm_eval_rules("0.5", "t"), InputError);
  const std::string head = "name: a\nmodels: [synthetic:tiny-llama]\nstrategies: [full]\neval:\n  tasks: [copa]\n";
  const ExperimentSpec spec = parse_experiment(head + "  lm_eval: \"0.3\"\n  add_bos: tokenizer\n", "a.yaml");
  EXPECT_FALSE(spec.eval.lm_eval.copa_double_space);
  EXPECT_EQ(spec.eval.lm_eval.bos, BosRule::kTokenizer);
  try {
    parse_experiment(head + "  lm_eval: \"0.5\"\n", "a.yaml");
    ADD_FAILURE() << "lm_eval 0.5 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a.yaml:6: lm_eval '0.5'"), std::string::npos) << e.what();
  }
}

// A context longer than the model's positions is left-truncated as lm-eval does (context +
// continuation cut to the last max_length + 1 tokens, for the longest choice), counted per item,
// and scored, also on a model with learned positions, where it was an error.
TEST(Scorer, LongContextsAreLeftTruncatedToTheModelsPositions) {
  for (const char* preset : {"synthetic:tiny-llama", "synthetic:tiny-opt"}) {
    Model m = load_model(preset);
    Request r;
    r.task = "t";
    for (int i = 0; i < 400; ++i) r.context += "ab cd ";
    r.context += "x";
    r.continuations = {" yes", " no way"};
    r.choices = {"yes", "no way"};
    const EncodedRequest full = encode_request(*m.tokenizer, r, false);
    ASSERT_GT(int(full.context.size()), m.hp.max_pos) << preset;
    const EncodedRequest e = encode_request(*m.tokenizer, r, false, m.hp.max_pos);
    size_t longest = 0;
    for (auto& c : e.continuations) longest = std::max(longest, c.size());
    EXPECT_EQ(e.context.size() + longest, size_t(m.hp.max_pos) + 1) << preset;
    EXPECT_EQ(e.truncated, int(full.context.size() - e.context.size()));
    EXPECT_TRUE(std::equal(e.context.begin(), e.context.end(), full.context.end() - int64_t(e.context.size())));
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy("full", StrategyContext{rt.accel_backend(), &rt, &m}, {});
    Scorer sc(m, rt.accel_backend(), *kv, &rt, ContextMode::kPrefill, false);
    ItemScore s;
    ASSERT_NO_THROW(s = sc.score(r)) << preset;
    EXPECT_EQ(s.truncated, e.truncated);
    EXPECT_EQ(s.context_tokens, int(e.context.size()));
    EXPECT_TRUE(std::isfinite(s.ll[0]) && std::isfinite(s.ll[1]));
  }
}

TEST(Scorer, CpuEqualsRefInBothModes) {
  Model m = load_model("synthetic:tiny-llama");
  for (ContextMode mode : {ContextMode::kPrefill, ContextMode::kStream})
    expect_same(score_with(m, "full", {}, mode), score_with(m, "full", {}, mode, true), 1e-4,
                std::string("cpu vs ref, ") + context_mode_name(mode));
}

TEST(Scorer, ExactStrategiesAgreeInBothModes) {
  Model m = load_model("synthetic:tiny-llama");
  for (ContextMode mode : {ContextMode::kPrefill, ContextMode::kStream}) {
    const Scored full = score_with(m, "full", {}, mode);
    for (const char* s : {"flexgen", "moe_lightning"})
      expect_same(score_with(m, s, {}, mode), full, 1e-5, std::string(s) + " " + context_mode_name(mode));
  }
  // Prefilling the context or decoding it token by token is the same computation for full.
  expect_same(score_with(m, "full", {}, ContextMode::kStream), score_with(m, "full", {}, ContextMode::kPrefill), 1e-4,
              "full stream vs prefill");
}

TEST(Scorer, BudgetBeyondTheSequenceEqualsFullAndASmallOneDiffers) {
  Model m = load_model("synthetic:tiny-llama");
  const Scored full = score_with(m, "full", {}, ContextMode::kStream);
  expect_same(score_with(m, "h2o", {{"kv_ratio", "1.0"}, {"recent_tokens", "1000"}}, ContextMode::kStream), full, 1e-5,
              "h2o, budget beyond the sequence");
  // StreamingLLM re-rotating its cached keys stores F32 (its kv_dtype runs as F32): the F32 oracle.
  expect_same(score_with(m, "streamingllm", {{"window", "4096"}}, ContextMode::kStream),
              score_with(m, "full", {{"kv_dtype", "f32"}}, ContextMode::kStream), 1e-5,
              "streamingllm, window beyond the sequence");
  EXPECT_GT(max_diff(score_with(m, "h2o", {{"heavy_tokens", "2"}, {"recent_tokens", "2"}}, ContextMode::kStream), full), 1e-3);
  EXPECT_GT(max_diff(score_with(m, "streamingllm", {{"sinks", "1"}, {"window", "3"}}, ContextMode::kStream), full), 1e-3);
  // In prefill mode the context is exact for every strategy; only the choices' steps are budgeted.
  EXPECT_GT(max_diff(score_with(m, "streamingllm", {{"sinks", "1"}, {"window", "3"}}, ContextMode::kPrefill), full), 1e-3);
}

// A one-token answer (RTE's " True"/" False" in most vocabularies) is scored from a step the
// strategy shapes in both modes: with a small budget it differs from full in prefill mode too
// (it was scored from the exact prefill), and a budget beyond the sequence still equals full.
TEST(Scorer, SingleTokenAnswersFeelTheStrategyInBothModes) {
  Model m = load_model("synthetic:tiny-llama");
  Request r;
  r.task = "single";
  r.context = "Question: Is the sky blue on a clear summer day, when the sun is high? Answer:";
  r.continuations = {"T", "F"};  // one byte-token each
  r.choices = {"T", "F"};
  ASSERT_EQ(encode_request(*m.tokenizer, r, false).continuations[0].size(), 1u);
  RuntimeConfig rc;
  rc.device = "emulated";
  for (ContextMode mode : {ContextMode::kPrefill, ContextMode::kStream}) {
    auto ll = [&](const std::string& name, const std::map<std::string, std::string>& params) {
      Runtime rt(rc);
      auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
      Scorer sc(m, rt.accel_backend(), *kv, &rt, mode, false);
      return sc.score(r).ll;
    };
    const auto full = ll("full", {{"kv_dtype", "f32"}});
    const std::string what = context_mode_name(mode);
    for (auto [name, params] : std::vector<std::pair<std::string, std::map<std::string, std::string>>>{
             {"h2o", {{"heavy_tokens", "2"}, {"recent_tokens", "2"}, {"kv_dtype", "f32"}}},
             {"streamingllm", {{"sinks", "1"}, {"window", "3"}}}}) {
      const auto got = ll(name, params);
      EXPECT_GT(std::abs(got[0] - full[0]) + std::abs(got[1] - full[1]), 1e-3) << name << " " << what;
    }
    const auto wide = ll("h2o", {{"kv_ratio", "1.0"}, {"recent_tokens", "1000"}, {"kv_dtype", "f32"}});
    EXPECT_NEAR(wide[0], full[0], 1e-4) << what;
    EXPECT_NEAR(wide[1], full[1], 1e-4) << what;
  }
}

// Items batched many to a forward (each item's context forked into its choices) score as each
// item alone: a strategy's per-sequence state does not depend on its batch.
TEST(Scorer, BatchedItemsScoreAsOneAtATime) {
  Model m = load_model("synthetic:tiny-llama");
  const std::vector<Request> reqs = synthetic_requests();
  RuntimeConfig rc;
  rc.device = "emulated";
  for (ContextMode mode : {ContextMode::kPrefill, ContextMode::kStream})
    for (const auto& [name, params] : test::small_budget_cases()) {
      auto run = [&](int batch_seqs) {
        Runtime rt(rc);
        auto kv = make_strategy(name, StrategyContext{rt.accel_backend(), &rt, &m}, params);
        Scorer sc(m, rt.accel_backend(), *kv, &rt, mode, false, batch_seqs);
        std::vector<ItemScore> out(reqs.size());
        int batches = 0;
        sc.on_batch([&](int) { ++batches; });
        sc.score_all(reqs, false, [&](size_t i, ItemScore& s, ChoiceLogprobs&) { out[i] = s; });
        return std::make_pair(out, batches);
      };
      const auto [alone, n_alone] = run(1);
      const auto [batched, n_batched] = run(64);
      const std::string what = name + " " + context_mode_name(mode);
      EXPECT_EQ(n_alone, int(reqs.size())) << what;
      EXPECT_EQ(n_batched, 1) << what;
      for (size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(batched[i].index, alone[i].index) << what;
        EXPECT_EQ(batched[i].tokens, alone[i].tokens) << what;
        for (size_t c = 0; c < alone[i].ll.size(); ++c)
          EXPECT_NEAR(batched[i].ll[c], alone[i].ll[c], 1e-4 * (1 + std::abs(alone[i].ll[c]))) << what << " item " << i;
      }
    }
}

TEST(Metrics, AccAccNormAndStandardErrors) {
  std::vector<ItemScore> items(4);
  std::vector<Request> reqs(4);
  const int preds[4] = {0, 1, 0, 0}, norm[4] = {0, 0, 0, 1}, gold[4] = {0, 1, 1, 1};
  for (int i = 0; i < 4; ++i) items[size_t(i)].pred = preds[i], items[size_t(i)].pred_norm = norm[i], items[size_t(i)].gold = gold[i];
  const TaskMetrics t = task_metrics(items, reqs);
  EXPECT_EQ(t.n, 4);
  EXPECT_DOUBLE_EQ(t.acc, 0.5);
  EXPECT_DOUBLE_EQ(t.acc_norm, 0.5);
  // Sample standard deviation of {1,1,0,0} is sqrt(1/3); the standard error divides by sqrt(4).
  EXPECT_NEAR(t.acc_stderr, std::sqrt(1.0 / 3.0) / 2.0, 1e-12);
}

// Paired comparison against exact values: McNemar's two-sided binomial p over the discordant
// items (2 vs 8 of 10: 2 · 56/1024), the difference, and a bootstrap interval that holds it (a
// point for identical answers).
TEST(Metrics, PairedComparisonAgainstExactValues) {
  std::vector<int> s, r;
  for (int i = 0; i < 30; ++i) s.push_back(i % 3 == 0), r.push_back(i % 3 == 0);
  for (int i = 0; i < 2; ++i) s.push_back(1), r.push_back(0);
  for (int i = 0; i < 8; ++i) s.push_back(0), r.push_back(1);
  const PairedComparison p = paired_compare(s, r);
  EXPECT_EQ(p.n, 40);
  EXPECT_EQ(p.b, 2);
  EXPECT_EQ(p.c, 8);
  EXPECT_DOUBLE_EQ(p.diff, -6.0 / 40);
  EXPECT_NEAR(p.mcnemar_p, 2 * 56.0 / 1024, 1e-12);
  EXPECT_LE(p.ci_lo, p.diff);
  EXPECT_GE(p.ci_hi, p.diff);
  EXPECT_LE(p.ci_hi, 0.0);  // p 0.11: the interval reaches 0, no further
  const PairedComparison same = paired_compare(r, r);
  EXPECT_EQ(same.diff, 0.0);
  EXPECT_EQ(same.ci_lo, 0.0);
  EXPECT_EQ(same.ci_hi, 0.0);
  EXPECT_EQ(same.mcnemar_p, 1.0);
  // 0 vs 10 discordant: 2 / 2^10, and an interval below 0.
  const PairedComparison all = paired_compare(std::vector<int>(10, 0), std::vector<int>(10, 1));
  EXPECT_NEAR(all.mcnemar_p, 2.0 / 1024, 1e-15);
  EXPECT_LT(all.ci_hi, 0.0);
}

TEST(Metrics, AccNormDividesByCharacters) {
  Model m = load_model("synthetic:tiny-llama");
  RuntimeConfig rc;
  rc.device = "emulated";
  Runtime rt(rc);
  auto kv = make_strategy("full", StrategyContext{rt.accel_backend(), &rt, &m}, {});
  Scorer s(m, rt.accel_backend(), *kv, &rt, ContextMode::kPrefill, false);
  const Request r = synthetic_requests()[2];
  const ItemScore x = s.score(r);
  std::vector<double> norm;
  for (size_t c = 0; c < x.ll.size(); ++c) norm.push_back(x.ll[c] / double(r.choices[c].size()));
  EXPECT_EQ(x.pred_norm, int(std::max_element(norm.begin(), norm.end()) - norm.begin()));
  EXPECT_EQ(x.pred, int(std::max_element(x.ll.begin(), x.ll.end()) - x.ll.begin()));
}

// The scorer's rate counts what it forwards: the context once, each choice's tokens in its own
// sequence; prefill mode prefills all but the context's last token (the decode steps start from it),
// stream mode only the first.
TEST(Metrics, ScoredTokensAreTheRowsForwarded) {
  Model m = load_model("synthetic:tiny-llama");
  for (ContextMode mode : {ContextMode::kPrefill, ContextMode::kStream}) {
    RuntimeConfig rc;
    rc.device = "emulated";
    Runtime rt(rc);
    auto kv = make_strategy("full", StrategyContext{rt.accel_backend(), &rt, &m}, {});
    Scorer s(m, rt.accel_backend(), *kv, &rt, mode, false);
    const Request r = synthetic_requests()[2];
    const ItemScore x = s.score(r);
    int64_t choice_tokens = 0;
    for (auto& c : r.choices) choice_tokens += int64_t(m.tokenizer->encode(c).size());
    const Scorer::Work& w = s.work();
    EXPECT_EQ(w.rows(), int64_t(x.context_tokens) + choice_tokens) << int(mode);
    EXPECT_EQ(w.prefill_rows, mode == ContextMode::kPrefill ? int64_t(x.context_tokens) - 1 : 1) << int(mode);
    EXPECT_GT(w.forwards, 1);
  }
}

TEST(Fidelity, ZeroForTheSameScoresAndPositiveOtherwise) {
  ItemScore a, b;
  a.ll = {-1.0, -2.0}, b.ll = {-1.5, -1.0};
  a.pred = 0, b.pred = 1;
  const std::vector<std::vector<std::vector<float>>> p = {{{std::log(0.5f), std::log(0.5f)}}, {{std::log(0.9f), std::log(0.1f)}}};
  const std::vector<std::vector<std::vector<float>>> q = {{{std::log(0.9f), std::log(0.1f)}}, {{std::log(0.9f), std::log(0.1f)}}};
  std::vector<std::vector<RefDist>> pd;
  for (auto& choice : p) {
    pd.emplace_back();
    for (auto& pos : choice) pd.back().push_back(compact_dist(pos));
  }
  FidelityAccumulator same, diff;
  same.add(a, a, pd, p);
  diff.add(a, b, pd, q);
  EXPECT_EQ(same.result().agreement, 1.0);
  EXPECT_NEAR(same.result().mean_kl, 0.0, 1e-12);
  EXPECT_EQ(diff.result().agreement, 0.0);
  EXPECT_NEAR(diff.result().mean_abs_ll_diff, (0.5 + 1.0) / 2, 1e-12);
  // KL(0.5,0.5 ‖ 0.9,0.1) over two scored tokens, the second identical.
  const double kl = 0.5 * std::log(0.5 / 0.9) + 0.5 * std::log(0.5 / 0.1);
  EXPECT_NEAR(diff.result().mean_kl, kl / 2, 1e-6);
}

// Large vocabularies keep the reference's top kRefTopK tokens with the rest lumped: zero against
// itself, never above the full KL (log-sum inequality), and close to it for a peaked reference.
TEST(Fidelity, TopKReferenceIsALowerBoundOfTheFullKl) {
  const size_t V = 5000;
  auto log_softmax_of = [](std::vector<double> z) {
    double m = *std::max_element(z.begin(), z.end()), s = 0;
    for (double x : z) s += std::exp(x - m);
    std::vector<float> lp;
    for (double x : z) lp.push_back(float(x - m - std::log(s)));
    return lp;
  };
  std::vector<double> zp(V), zq(V);
  for (size_t i = 0; i < V; ++i) {
    zp[i] = (i < 40 ? 8.0 : 0.0) + std::sin(double(i) * 0.7);
    zq[i] = zp[i] + 0.3 * std::cos(double(i) * 1.3);
  }
  const auto p = log_softmax_of(zp), q = log_softmax_of(zq);
  double full = 0;
  for (size_t v = 0; v < V; ++v) full += std::exp(double(p[v])) * (double(p[v]) - double(q[v]));
  const RefDist d = compact_dist(p);
  ASSERT_EQ(d.ids.size(), size_t(kRefTopK));
  EXPECT_NEAR(kl_divergence(d, p), 0.0, 1e-6);
  const double lumped = kl_divergence(d, q);
  EXPECT_LE(lumped, full + 1e-9);
  EXPECT_GT(lumped, 0.9 * full) << "lumped " << lumped << " full " << full;
  const RefDist small = compact_dist(std::vector<float>(p.begin(), p.begin() + 100));
  EXPECT_TRUE(small.ids.empty());  // a small vocabulary is kept whole: exact KL
}

// Four COPA items in a data directory of their own.
std::string four_copa_items(const std::string& name) {
  std::string val;
  for (int i = 0; i < 4; ++i)
    val += fmt::format(R"({{"premise": "The child dropped cup {}.", "choice1": "It broke.", "choice2": "It sang.", )"
                       R"("question": "effect", "label": {}, "idx": {}}})" "\n", i, i % 2, i);
  return write_copa_dir(name, val);
}

// One reference per (model, task, shots, seed, mode): across strategies and a swept budget it is
// scored once — by `full` itself when it runs first — and every other row reuses it, with the same
// fidelity as scoring it beside each strategy gave (exact strategies agree with it exactly).
TEST(Experiments, TheReferenceIsScoredOncePerKey) {
  const std::string data = four_copa_items("copa_ref_once");
  for (const char* order : {"[full, flexgen, h2o]", "[h2o, flexgen, full]"}) {
    ExperimentSpec spec = parse_experiment(
        fmt::format("name: r\nmodels: [synthetic:tiny-llama]\nstrategies: {}\neval: {{tasks: [copa], context: stream, "
                    "limit: 3, data_dir: \"{}\"}}\nsweep: {{kv_ratio: [0.5, 0.2]}}\n", order, data),
        "r.yaml");
    Runner runner(spec);
    int fresh = 0, rows = 0;
    for (auto& p : expand(spec))
      for (auto& e : spec.strategies)
        runner.run(p, e, {}, [&](nlohmann::ordered_json r) {
          ++rows;
          ASSERT_EQ(r["status"], "ok") << r.dump();
          if (e.name == "full") {
            EXPECT_TRUE(r["fidelity"].is_null());
            return;
          }
          const auto& f = r["fidelity"];
          fresh += !f["reference_reused"].get<bool>();
          if (e.name == "flexgen") {
            EXPECT_EQ(f["agreement"], 1.0);
            EXPECT_LT(f["mean_kl"].get<double>(), 1e-6);
          }
        });
    EXPECT_EQ(rows, 6);
    // full first: it is the reference, nothing else scores one; h2o first: it scores the one.
    EXPECT_EQ(fresh, std::string(order).rfind("[full", 0) == 0 ? 0 : 1) << order;
  }
}

// HybridGen's scheduler decides K and the mode from stage times; in an accuracy run those are the
// steering profile's modeled times, so that a second run beside a busy neighbour (two threads
// spinning on this machine's cores) gives the same scores, fidelity and K trajectory, bit for bit.
TEST(Experiments, AccuracyRunsAreDeterministicUnderLoad) {
  const std::string data = four_copa_items("copa_determinism");
  ExperimentSpec spec = parse_experiment(
      fmt::format("name: d\nmodels: [synthetic:tiny-llama]\nstrategies: [{{name: hybridgen, params: "
                  "{{gpu_kv_tokens: 8, k_min: 2, k_max: 64}}}}]\neval: {{tasks: [copa], shots: 3, context: stream, "
                  "limit: 4, data_dir: \"{}\"}}\n", data),
      "d.yaml");
  auto run = [&] {
    Runner runner(spec);
    nlohmann::ordered_json row;
    for (auto& p : expand(spec)) runner.run(p, spec.strategies[0], {}, [&](nlohmann::ordered_json r) { row = r; });
    return row;
  };
  const auto quiet = run();
  ASSERT_EQ(quiet["status"], "ok") << quiet.dump();
  EXPECT_EQ(quiet["steering_clock"], std::string("modeled:") + kSteeringPlatform);
  ASSERT_TRUE(quiet["strategy_stats"].contains("trajectory")) << quiet["strategy_stats"].dump();
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < 2; ++i)
    busy.emplace_back([&] {
      volatile double x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
    });
  const auto loaded = run();
  stop = true;
  for (auto& t : busy) t.join();
  ASSERT_EQ(loaded["status"], "ok") << loaded.dump();
  EXPECT_EQ(loaded["accuracy"].dump(), quiet["accuracy"].dump());
  EXPECT_EQ(loaded["fidelity"]["mean_kl"], quiet["fidelity"]["mean_kl"]);
  EXPECT_EQ(loaded["strategy_stats"]["trajectory"].dump(), quiet["strategy_stats"]["trajectory"].dump());
}

// A budget of the whole context compresses nothing: at kv_ratio / budget 1.0 every strategy's
// next-token distributions equal full attention's (mean KL < 1e-6) in both context modes, stream
// mode's decode-time eviction included. InfiniGen's budget caps a count its alpha threshold
// decides, so it is exact at 1.0 with every token within alpha; HybridGen's CPU logits come from
// its speculative query (layer i's input through layer i+1's W_q), an approximation no budget
// removes, so it is exact at 1.0 with the true query (docs/accuracy.md has both errors).
TEST(Experiments, BudgetsOfTheWholeContextAreExact) {
  const std::string data = four_copa_items("copa_budget_one");
  for (const char* mode : {"stream", "prefill"}) {
    ExperimentSpec spec = parse_experiment(
        fmt::format("name: b\nmodels: [synthetic:tiny-llama]\nstrategies: [full, {{name: h2o, params: {{kv_ratio: 1.0}}}}, "
                    "{{name: h2o, label: h2o_budget, params: {{budget: 1.0}}}}, {{name: keyformer, params: {{kv_ratio: 1.0}}}}, "
                    "{{name: streamingllm, params: {{kv_ratio: 1.0}}}}, {{name: infinigen, params: {{budget: 1.0, alpha: 1e9}}}}, "
                    "{{name: hybridgen, params: {{budget: 1.0, mode: post, speculative_query: false}}}}, "
                    "{{name: hybridgen, label: hybridgen_pre, params: {{budget: 1.0, mode: pre, speculative_query: false}}}}, "
                    "{{name: hybridgen, label: hybridgen_adaptive, params: {{kv_ratio: 1.0, gpu_kv_tokens: 16, "
                    "speculative_query: false}}}}]\n"
                    "eval: {{tasks: [copa], shots: 3, context: {}, limit: 4, data_dir: \"{}\"}}\n",
                    mode, data),
        "b.yaml");
    Runner runner(spec);
    for (auto& p : expand(spec))
      for (auto& e : spec.strategies)
        runner.run(p, e, {}, [&](nlohmann::ordered_json r) {
          ASSERT_EQ(r["status"], "ok") << r.dump();
          if (e.name == "full") return;
          EXPECT_LT(r["fidelity"]["mean_kl"].get<double>(), 1e-6) << e.label << " " << mode;
          EXPECT_EQ(r["fidelity"]["agreement"], 1.0) << e.label << " " << mode;
        });
  }
}

// InfiniGen calibrates its skew on held-out text (the task's few-shot split), not on the items it
// scores: the first two items score the same whether two or four are scored (to the float noise of
// a larger batch's kernels, 1e-6: a calibration on the scored items moved them by nats), and the
// row names the calibration and its hash.
TEST(Experiments, InfiniGenCalibratesOnHeldOutTextWhateverTheLimit) {
  // Items 2 and 3 are the longest: a calibration on the longest scored context would change with the limit.
  std::string val;
  for (int i = 0; i < 4; ++i)
    val += fmt::format(R"({{"premise": "The child dropped cup {}{}.", "choice1": "It broke.", "choice2": "It sang.", )"
                       R"("question": "effect", "label": {}, "idx": {}}})" "\n",
                       i, std::string(i >= 2 ? 40 * i : 0, 'x'), i % 2, i);
  const std::string data = write_copa_dir("copa_calibration", val);
  const std::string items = test::temp_path("hg_calibration_items");
  auto first_two = [&](int limit) {
    fs::remove_all(items);
    ExperimentSpec spec = parse_experiment(
        fmt::format("name: c\nmodels: [synthetic:tiny-llama]\nstrategies: [{{name: infinigen, params: {{calib_tokens: 0, full_layers: 1, alpha: 1.0}}}}]\n"
                    "eval: {{tasks: [copa], shots: 1, context: prefill, limit: {}, reference: none, data_dir: \"{}\"}}\n",
                    limit, data),
        "c.yaml");
    Runner runner(spec);
    runner.items_dir = items;
    nlohmann::ordered_json row;
    for (auto& p : expand(spec)) runner.run(p, spec.strategies[0], {}, [&](nlohmann::ordered_json r) { row = r; });
    EXPECT_EQ(row["status"], "ok") << row.dump();
    EXPECT_GT(row["accuracy"]["calibration"]["tokens"].get<int>(), 0) << row.dump();
    std::vector<std::string> lines;
    std::ifstream in(items + "/" + fs::path(row["items_file"].get<std::string>()).filename().string());
    for (std::string l; std::getline(in, l) && lines.size() < 2;) lines.push_back(l);
    return std::make_pair(lines, row["accuracy"]["calibration"].dump());
  };
  const auto two = first_two(2), four = first_two(4);
  ASSERT_EQ(two.first.size(), 2u);
  ASSERT_EQ(four.first.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const auto a = nlohmann::json::parse(two.first[i]), b = nlohmann::json::parse(four.first[i]);
    EXPECT_EQ(a["pred"], b["pred"]) << i;
    for (size_t c = 0; c < a["ll"].size(); ++c)
      EXPECT_NEAR(a["ll"][c].get<double>(), b["ll"][c].get<double>(), 1e-6 * std::abs(b["ll"][c].get<double>()))
          << "item " << i << " choice " << c;
  }
  EXPECT_EQ(two.second, four.second);
  fs::remove_all(items);
}

// The reference is kept in the result directory: a second runner over it (a resumed run) reads it
// instead of scoring it again, with the same fidelity; a torn file is named, not used.
TEST(Experiments, AResumedRunReadsTheKeptReference) {
  const std::string data = four_copa_items("copa_ref_kept");
  const std::string dir = (std::filesystem::temp_directory_path() / "hg_ref_kept").string();
  std::filesystem::remove_all(dir);
  ExperimentSpec spec = parse_experiment(
      fmt::format("name: r\nmodels: [synthetic:tiny-llama]\nstrategies: [{{name: h2o, params: {{kv_ratio: 0.3}}}}]\n"
                  "eval: {{tasks: [copa], context: stream, limit: 4, data_dir: \"{}\"}}\n", data),
      "r.yaml");
  auto run = [&]() {
    Runner runner(spec);
    runner.reference_dir = dir;
    nlohmann::ordered_json row;
    for (auto& p : expand(spec)) runner.run(p, spec.strategies[0], {}, [&](nlohmann::ordered_json r) { row = r; });
    return row;
  };
  const auto first = run();
  ASSERT_EQ(first["status"], "ok") << first.dump();
  EXPECT_FALSE(first["fidelity"]["reference_reused"].get<bool>());
  const std::string file = dir + "/" + std::filesystem::path(first["fidelity"]["reference_file"].get<std::string>()).filename().string();
  ASSERT_TRUE(std::filesystem::exists(file));
  const auto second = run();
  EXPECT_TRUE(second["fidelity"]["reference_reused"].get<bool>());
  EXPECT_EQ(second["fidelity"]["mean_kl"], first["fidelity"]["mean_kl"]);
  EXPECT_EQ(second["fidelity"]["reference_scored_s"], first["fidelity"]["reference_scored_s"]);
  // Torn: the row fails naming the file.
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  const auto torn = run();
  EXPECT_EQ(torn["status"], "failed");
  EXPECT_NE(torn["reason"].get<std::string>().find(file), std::string::npos) << torn.dump();
  std::filesystem::remove_all(dir);
}

// experiments/accuracy.yaml, unchanged but for the model (a user's HF directory), the data and the
// item count: every strategy scores, rows carry accuracy and fidelity.
TEST(Experiments, AccuracyFileRunsOnAUserHfDirectory) {
  Model syn = load_model("synthetic:tiny-llama");
  const std::string hf = test::write_hf(syn, "hf_accuracy", 1);
  std::string val;
  for (int i = 0; i < 3; ++i)
    val += fmt::format(R"({{"premise": "The child dropped cup {}.", "choice1": "It broke.", "choice2": "It sang.", )"
                       R"("question": "effect", "label": {}, "idx": {}}})" "\n", i, i % 2, i);
  const std::string data = write_copa_dir("copa_hf_run", val);
  ExperimentSpec spec = load_experiment(std::string(HG_SOURCE_DIR) + "/experiments/accuracy.yaml",
                                        {"models=[" + hf + "]", "eval.data_dir=" + data, "eval.tasks=[copa]",
                                         "eval.limit=2", "execute=real"});
  const auto points = expand(spec);
  ASSERT_EQ(points.size(), 1u);
  Runner runner(spec);
  int rows = 0;
  for (auto& e : spec.strategies)
    runner.run(points[0], e, {}, [&](nlohmann::ordered_json r) {
      ++rows;
      ASSERT_EQ(r["status"], "ok") << e.label << ": " << r.value("reason", "");
      EXPECT_EQ(r["accuracy"]["n"], 2) << e.label;
      EXPECT_EQ(r["accuracy"]["task"], "copa");
      if (e.name != "full") {
        EXPECT_TRUE(r["fidelity"].is_object()) << e.label;
      }
      if (e.name == "flexgen" || e.name == "moe_lightning") {
        EXPECT_EQ(r["fidelity"]["agreement"], 1.0) << e.label;
        EXPECT_LT(r["fidelity"]["mean_kl"].get<double>(), 1e-6) << e.label;
      }
    });
  EXPECT_EQ(rows, int(spec.strategies.size()));
}

TEST(Experiments, EvalBlockErrorsNameTheLine) {
  auto err = [](const std::string& y) {
    try {
      parse_experiment(y, "a.yaml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string head = "name: a\nmodels: [synthetic:tiny-llama]\nstrategies: [full]\n";
  EXPECT_NE(err(head + "eval:\n  tasks: [piqa, mmlu]\n").find("a.yaml:5: unknown task 'mmlu'"), std::string::npos)
      << err(head + "eval:\n  tasks: [piqa, mmlu]\n");
  EXPECT_NE(err(head + "eval:\n  tasks: [copa]\n  context: batch\n").find("a.yaml:6: context 'batch'"), std::string::npos);
  EXPECT_NE(err(head + "eval:\n  tasks: [copa]\n  shot: 3\n").find("shot"), std::string::npos);
  EXPECT_NE(err(head + "eval:\n  tasks: [copa]\nexecute: dry\nclock: modeled:machine-a\n").find("no modeled clock"),
            std::string::npos);
  // kv_ratio sweeps every strategy that has the parameter.
  const ExperimentSpec s = parse_experiment(
      "name: a\nmodels: [synthetic:tiny-llama]\nstrategies: [full, h2o, hybridgen]\neval: {tasks: [copa]}\n"
      "sweep: {kv_ratio: [0.5, 0.1]}\n", "a.yaml");
  const auto pts = expand(s);
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_EQ(pts[1].strategy_params.at("h2o").at("kv_ratio"), "0.1");
  EXPECT_EQ(pts[1].strategy_params.at("hybridgen").at("kv_ratio"), "0.1");
  EXPECT_EQ(pts[1].strategy_params.count("full"), 0u);
  EXPECT_NE(pts[0].id, pts[1].id);
}

}  // namespace
}  // namespace hg
