// The long-context retrieval tasks (datasets/needle.h): deterministic generation from the seed,
// the needle at the asked depth, the prompt at the asked length in the model's tokens, RULER's
// string_match_all scoring, and a run through the strategies (an exact one agrees with full).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "datasets/needle.h"
#include "engine/core/error.h"
#include "engine/formats/formats.h"
#include "engine/tokenizer/tokenizer.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/spec.h"
#include "test_util.h"

namespace hg {
namespace {

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A small essay for the essay tasks (sentences of varied length, as a natural text has).
Haystack test_essay() {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += fmt::format("Sentence {} tells how a {} walked to the {} and back. ", i, i % 3 ? "cat" : "tall dog",
                        i % 5 ? "market" : "old stone bridge by the river");
  return {text, "test"};
}

TEST(Needle, EveryTaskFitsItsLengthHoldsItsAnswersAndPlacesItsNeedle) {
  Model m = load_model("synthetic:tiny-llama");
  const Tokenizer& tok = *m.tokenizer;
  const Haystack essay = test_essay();
  for (const std::string& task : needle_task_names())
    for (int tokens : needle_task_is_qa(task) ? std::vector<int>{}  // QaTasksReadSquadAndHotpotqaFiles
                      : task == "cwe"         ? std::vector<int>{2500, 12000}
                                              : std::vector<int>{2500, 4500})
      for (int depth : {0, 50, 100}) {
        const NeedleItem a = make_needle_item(task, tok, tokens, depth, 7, 0, &essay);
        const NeedleItem b = make_needle_item(task, tok, tokens, depth, 7, 0, &essay);
        const std::string what = task + " " + std::to_string(tokens) + " " + std::to_string(depth);
        EXPECT_EQ(a.prompt, b.prompt) << what;
        EXPECT_EQ(a.tokens, int(tok.encode(a.prompt).size())) << what;
        // RULER's sizing: the prompt and its tokens to generate within the length, as close as a unit
        // (a noise sentence or a UUID needle is up to 130 of this tokenizer's tokens).
        EXPECT_LE(a.tokens + a.max_new, tokens) << what;
        EXPECT_GT(a.tokens + a.max_new, tokens - 130) << what;
        EXPECT_EQ(a.prompt.substr(a.prompt.size() - a.question.size()), a.question) << what;
        ASSERT_FALSE(a.answers.empty()) << what;
        for (auto& ans : a.answers) EXPECT_NE(a.prompt.find(ans), std::string::npos) << what << " " << ans;
        if (needle_task_has_depth(task)) {
          EXPECT_EQ(a.depth, depth);
          // The queried needle sits at the asked share of the prompt (within a unit and the
          // instructions; vt's from after its in-context example).
          const size_t from = task == "vt" ? a.prompt.find("Memorize and track", 1) : 0;
          const double at = 100.0 * double(a.needle_at - from) / double(a.prompt.size() - from);
          EXPECT_NEAR(at, depth, 100.0 * 400 / double(a.prompt.size() - from) + 5) << what;
        } else {
          EXPECT_EQ(a.depth, -1) << what;
          EXPECT_EQ(a.prompt, make_needle_item(task, tok, tokens, 100 - depth, 7, 0, &essay).prompt) << what;
        }
      }
  // The keys depend on the seed and the item, not on the length or depth.
  const NeedleItem x = make_needle_item("niah_single_1", tok, 1500, 0, 7, 0),
                   y = make_needle_item("niah_single_1", tok, 4000, 100, 7, 0);
  EXPECT_EQ(x.answers, y.answers);
  EXPECT_NE(make_needle_item("niah_single_1", tok, 1500, 0, 7, 1).answers, x.answers);
  EXPECT_NE(make_needle_item("niah_single_1", tok, 1500, 0, 8, 0).answers, x.answers);
  EXPECT_THROW(make_needle_item("niah_single_2", tok, 1500, 0, 7, 0), InputError);  // no essay
  EXPECT_THROW(make_needle_item("niah_single_1", tok, 100, 50, 7, 0), InputError);
  EXPECT_THROW(make_needle_item("passkey", tok, 1500, 101, 7, 0), InputError);
}

// Each task's shape as RULER's generator makes it (NVIDIA/RULER scripts/data/synthetic/, constants.py).
TEST(Needle, TasksAreRulersTemplatesAndGenerators) {
  Model m = load_model("synthetic:tiny-llama");
  const Tokenizer& tok = *m.tokenizer;
  const Haystack essay = test_essay();
  auto item = [&](const std::string& t) { return make_needle_item(t, tok, 4500, 50, 3, 1, &essay); };
  // One value asked for: RULER's singular template; the noise haystack's lines joined by newlines.
  const NeedleItem s1 = item("niah_single_1");
  EXPECT_EQ(s1.prompt.rfind("A special magic number is hidden within the following text. Make sure to memorize it. I "
                            "will quiz you about the number afterwards.\n",
                            0),
            0u);
  EXPECT_NE(s1.prompt.find("again.\nThe grass is green."), std::string::npos);
  EXPECT_EQ(count_of(s1.prompt, "One of the special magic numbers for"), 1u);
  EXPECT_NE(s1.question.find("What is the special magic number for " + std::string("")), std::string::npos);
  EXPECT_EQ(s1.question.substr(s1.question.size() - 16), "provided text is");
  EXPECT_EQ(s1.max_new, 128);
  ASSERT_EQ(s1.answers.size(), 1u);
  EXPECT_EQ(s1.answers[0].size(), 7u);
  // UUID values (version 4) on the essay; multikey_3: UUID keys and values on a haystack of needles.
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  EXPECT_TRUE(std::regex_match(item("niah_single_3").answers.at(0), uuid));
  const NeedleItem mk3 = item("niah_multikey_3");
  EXPECT_TRUE(std::regex_match(mk3.answers.at(0), uuid));
  EXPECT_GT(count_of(mk3.prompt, "One of the special magic uuids for"), 20u);
  EXPECT_EQ(count_of(mk3.prompt, mk3.answers[0]), 1u);
  const NeedleItem mk2 = item("niah_multikey_2");
  EXPECT_EQ(count_of(mk2.prompt, "\n"), count_of(mk2.prompt, "One of the special magic numbers for") + 1);
  EXPECT_EQ(count_of(item("niah_multikey_1").prompt, "One of the special magic numbers for"), 4u);
  // Four values of one key, or four keys asked for: the plural template and all four answers.
  const NeedleItem mv = item("niah_multivalue"), mq = item("niah_multiquery");
  EXPECT_EQ(mv.answers.size(), 4u);
  EXPECT_EQ(mq.answers.size(), 4u);
  EXPECT_EQ(mv.prompt.rfind("Some special magic numbers are hidden", 0), 0u);
  EXPECT_EQ(mv.question.substr(mv.question.size() - 17), "provided text are");
  EXPECT_EQ(count_of(mq.question, ", and "), 2u);  // "a, b, c, and d" in the question and the answer prefix
  EXPECT_EQ(count_of(mq.prompt, "One of the special magic numbers for"), 4u);
  // vt: an in-context example (3-letter names, its answer given) before a chain of five 5-letter names.
  const NeedleItem vt = item("vt");
  ASSERT_EQ(vt.answers.size(), 5u);
  EXPECT_EQ(count_of(vt.prompt, "Memorize and track the chain(s) of variable assignment"), 2u);
  const size_t second = vt.prompt.find("Memorize and track", 1);
  EXPECT_LE(int(tok.encode(vt.prompt.substr(0, second)).size()), 502);
  EXPECT_TRUE(std::regex_search(vt.prompt.substr(0, second), std::regex("they are:  ?[A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3}\n")));
  size_t last = second;
  for (size_t i = 1; i < vt.answers.size(); ++i) {  // each link after the one it copies
    EXPECT_EQ(vt.answers[i].size(), 5u);
    const size_t at = vt.prompt.find("VAR " + vt.answers[i] + " = VAR " + vt.answers[i - 1]);
    ASSERT_NE(at, std::string::npos);
    EXPECT_GT(at, last);
    last = at;
  }
  EXPECT_EQ(vt.max_new, 30);
  // cwe: the ten answers appear 30 times each in the list (6 below 4096 tokens), the others 3 (1).
  for (int tokens : {2500, 12000}) {
    const NeedleItem cwe = make_needle_item("cwe", tok, tokens, 50, 3, 1);
    ASSERT_EQ(cwe.answers.size(), 10u);
    const size_t list_at = cwe.prompt.rfind("Below is a numbered list");
    const std::string list = cwe.prompt.substr(list_at);
    for (auto& w : cwe.answers)
      EXPECT_EQ(count_of(list, ". " + w + " ") + count_of(list, ". " + w + "\n"), tokens < 4096 ? 6u : 30u) << w;
    EXPECT_EQ(cwe.prompt.rfind("Below is a numbered list", 0), 0u);  // the solved example first
  }
  // fwe: the three answers are the 2nd-4th most frequent coded words, after the noise "...".
  const NeedleItem fwe = make_needle_item("fwe", tok, 4500, 50, 3, 1);
  ASSERT_EQ(fwe.answers.size(), 3u);
  const size_t dots = count_of(fwe.prompt, " ... ");
  size_t prev = dots;
  for (auto& w : fwe.answers) {
    const size_t c = count_of(fwe.prompt, w);
    EXPECT_EQ(w.size(), 6u);
    EXPECT_LE(c, prev + 1) << w;
    prev = c;
  }
  EXPECT_GT(dots, count_of(fwe.prompt, fwe.answers[0]));
}

// With a real tokenizer (Llama-3's) and the PIQA essay: every task's prompt and its tokens to
// generate fill 4K and 16K to within a unit of its haystack.
TEST(Needle, RulersTasksFillTheirLengthInLlama3Tokens) {
  HG_REQUIRE_SHARED("models/llama3.2-tokenizer/encoder.json");
  HG_REQUIRE_SHARED("datasets/piqa/train.jsonl");
  auto tok = load_gpt2_files(test::shared_path("models/llama3.2-tokenizer/encoder.json"),
                             test::shared_path("models/llama3.2-tokenizer/vocab.bpe"), PreSplit::kLlama3);
  const Haystack essay = load_haystack(test::shared_path("datasets"));
  for (const std::string& task : needle_task_names())
    for (int tokens : needle_task_is_qa(task) ? std::vector<int>{} : std::vector<int>{4096, 16384}) {
      const NeedleItem a = make_needle_item(task, *tok, tokens, 25, 1234, 3, &essay);
      EXPECT_LE(a.tokens + a.max_new, tokens) << task;
      EXPECT_GT(a.tokens + a.max_new, tokens - 60) << task << " " << tokens;  // a UUID needle: 45
      for (auto& ans : a.answers) EXPECT_NE(a.prompt.find(ans), std::string::npos) << task << " " << ans;
    }
}

// qa_1 and qa_2 from a user's SQuAD v2 and HotpotQA files, as RULER's qa.py reads them: the gold
// document among distractors ("Document i:"), the question after them, one answer suffices.
TEST(Needle, QaTasksReadSquadAndHotpotqaFiles) {
  Model m = load_model("synthetic:tiny-llama");
  const Tokenizer& tok = *m.tokenizer;
  std::string squad = R"({"data": [)";
  for (int a = 0; a < 6; ++a) {
    squad += fmt::format(R"({}{{"title": "t{}", "paragraphs": [)", a ? "," : "", a);
    for (int p = 0; p < 3; ++p)
      squad += fmt::format(R"({}{{"context": "Article {} paragraph {} says the colour of item {} is shade{}.", "qas": [)"
                           R"({{"question": "What colour is item {}?", "answers": [{{"text": "shade{}"}}], "is_impossible": false}},)"
                           R"({{"question": "Unanswerable {}?", "answers": [], "is_impossible": true}}]}})",
                           p ? "," : "", a, p, a * 3 + p, a * 3 + p, a * 3 + p, a * 3 + p, a * 3 + p);
    squad += "]}";
  }
  squad += "]}";
  const std::string sq = test::temp_path("squad.json"), hp = test::temp_path("hotpotqa.json");
  test::write_file(sq, squad);
  test::write_file(hp, R"([{"question": "Who built the bridge?", "answer": "Ada",
    "context": [["Bridge", ["The bridge was built ", "by Ada."]], ["River", ["The river is wide."]]]},
    {"question": "Where is the tower?", "answer": "Paris", "context": [["Tower", ["The tower is in Paris."]]]}])");
  const QaCorpus s1 = load_qa_corpus("qa_1", sq), s2 = load_qa_corpus("qa_2", hp);
  EXPECT_EQ(s1.qas.size(), 18u);  // the unanswerable ones left out
  EXPECT_EQ(s1.docs.size(), 18u);
  EXPECT_EQ(s1.qas[4].more.size(), 2u);  // its article's other paragraphs
  EXPECT_EQ(s2.docs.size(), 3u);
  EXPECT_EQ(s2.qas[0].gold.size(), 2u);
  for (int depth : {0, 100}) {
    const NeedleItem q = make_needle_item("qa_1", tok, 1500, depth, 7, 4, nullptr, &s1);
    EXPECT_LE(q.tokens + q.max_new, 1500);
    EXPECT_EQ(q.max_new, 32);
    EXPECT_EQ(q.answers, std::vector<std::string>{"shade4"});
    EXPECT_EQ(q.prompt.rfind("Answer the question based on the given documents.", 0), 0u);
    EXPECT_NE(q.prompt.find("Document 1:\n"), std::string::npos);
    const std::string tail = "Question: What colour is item 4? Answer:";
    EXPECT_EQ(q.question.substr(q.question.size() - tail.size()), tail);
    const size_t gold = q.prompt.find("item 4 is shade4");
    ASSERT_NE(gold, std::string::npos);
    EXPECT_EQ(depth == 0, gold < q.prompt.size() / 4) << depth;
    EXPECT_EQ(needle_match(q, " shade4"), 1.0);
  }
  const NeedleItem h = make_needle_item("qa_2", tok, 1500, 50, 7, 0, nullptr, &s2);
  EXPECT_NE(h.prompt.find("Bridge\nThe bridge was built by Ada."), std::string::npos);
  EXPECT_NE(h.prompt.find("River\nThe river is wide."), std::string::npos);
  EXPECT_TRUE(h.any_answer);
  EXPECT_NE(test::input_error_of([&] { load_qa_corpus("qa_2", sq); }).find("HotpotQA"), std::string::npos);
  EXPECT_NE(test::input_error_of([&] { load_qa_corpus("qa_1", ""); }).find("eval.squad"), std::string::npos);
  EXPECT_NE(test::input_error_of([&] { make_needle_item("qa_2", tok, 1500, 50, 7, 5, nullptr, &s2); }).find("2 questions"),
            std::string::npos);
}

// The essay haystack: PIQA's train split (goal and correct solution) or a user's text or JSON file.
TEST(Needle, TheEssayHaystackIsPiqaOrAUsersFile) {
  const std::string json = test::temp_path("essay.json");
  test::write_file(json, R"({"text": "One essay. It has two sentences."})");
  const Haystack h = load_haystack("/nonexistent", json);
  EXPECT_EQ(h.text, "One essay. It has two sentences.");
  EXPECT_NE(test::input_error_of([] { load_haystack("/nonexistent"); }).find("piqa/train.jsonl"), std::string::npos);
  HG_REQUIRE_SHARED("datasets/piqa/train.jsonl");
  const Haystack piqa = load_haystack(test::shared_path("datasets"));
  EXPECT_GT(piqa.text.size(), 1000000u);
  EXPECT_EQ(piqa.text.rfind("When boiling butter, when it's ready, you can Pour it into a jar.", 0), 0u);
}

TEST(Needle, MatchIsTheShareOfAnswersFound) {
  NeedleItem it;
  it.answers = {"ABCDE", "FGHIJ"};
  EXPECT_EQ(needle_match(it, " abcde, fghij."), 1.0);
  EXPECT_EQ(needle_match(it, " ABCDE and more"), 0.5);
  EXPECT_EQ(needle_match(it, "nothing"), 0.0);
}

// experiments/needle.yaml, shrunk, on a synthetic model: a row per strategy and point, the match
// rate and the length in the row; FlexGen (exact attention) gives full's outputs item for item.
TEST(Needle, ExperimentRunsThroughTheStrategies) {
  ExperimentSpec spec = load_experiment(std::string(HG_SOURCE_DIR) + "/experiments/needle.yaml",
                                        {"models=[synthetic:induction]", "strategies=[full, flexgen, h2o]",
                                         "eval.tasks=[passkey]", "sweep.needle_tokens=[600]", "sweep.depth=[0, 100]",
                                         "limit=2", "device=emulated"});
  const auto points = expand(spec);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[1].values["depth"], 100);
  EXPECT_FALSE(points[0].values.contains("shots"));
  Runner runner(spec);
  int rows = 0;
  for (auto& p : points)
    for (auto& e : spec.strategies)
      runner.run(p, e, {}, [&](nlohmann::ordered_json r) {
        ++rows;
        ASSERT_EQ(r["status"], "ok") << r.dump();
        EXPECT_EQ(r["accuracy"]["n"], 2);
        EXPECT_EQ(r["accuracy"]["needle_tokens"], 600);
        EXPECT_LE(r["accuracy"]["mean_context_tokens"].get<double>(), 600);
        EXPECT_GE(r["accuracy"]["acc"].get<double>(), 0.0);
        if (e.name == "flexgen") {
          EXPECT_EQ(r["fidelity"]["agreement"], 1.0) << r.dump();
        }
      });
  EXPECT_EQ(rows, 6);
}

// The induction model retrieves: full finds every passkey at both ends of the haystack. StreamingLLM
// at a 20 % budget keeps the start (4 sinks) and the newest tokens: the needle at depth 0 is gone
// (0), at depth 100 it sits just before the question, in its window (1.0).
TEST(Needle, TheInductionModelRetrievesAndADroppedNeedleScoresZero) {
  ExperimentSpec spec = load_experiment(
      std::string(HG_SOURCE_DIR) + "/experiments/needle.yaml",
      {"models=[synthetic:induction]", "strategies=[full, {name: streamingllm, params: {kv_ratio: 0.2}}]",
       "eval.tasks=[passkey]", "sweep.needle_tokens=[1024]", "sweep.depth=[0, 100]", "limit=3", "device=emulated"});
  Runner runner(spec);
  std::map<std::pair<std::string, int>, double> acc;
  for (auto& p : expand(spec))
    for (auto& e : spec.strategies)
      runner.run(p, e, {}, [&](nlohmann::ordered_json r) {
        ASSERT_EQ(r["status"], "ok") << r.dump();
        acc[{e.name, p.values["depth"].get<int>()}] = r["accuracy"]["acc"].get<double>();
      });
  const auto at = [&](const std::string& s, int depth) { return acc[std::make_pair(s, depth)]; };
  EXPECT_EQ(at("full", 0), 1.0);
  EXPECT_EQ(at("full", 100), 1.0);
  EXPECT_EQ(at("streamingllm", 0), 0.0);
  EXPECT_EQ(at("streamingllm", 100), 1.0);
}

// The query-agnostic protocol prefills the context and feeds the question as decode steps: full
// attention finds the passkey as it does with the question prefilled, and rows name the protocol.
TEST(Needle, TheQueryAgnosticProtocolFeedsTheQuestionAsDecodeSteps) {
  ExperimentSpec spec = load_experiment(
      std::string(HG_SOURCE_DIR) + "/experiments/needle.yaml",
      {"models=[synthetic:induction]", "strategies=[full, h2o]", "eval.tasks=[passkey]", "eval.protocol=query_agnostic",
       "sweep.needle_tokens=[1024]", "sweep.depth=[50]", "limit=2", "device=emulated"});
  Runner runner(spec);
  for (auto& p : expand(spec))
    for (auto& e : spec.strategies)
      runner.run(p, e, {}, [&](nlohmann::ordered_json r) {
        ASSERT_EQ(r["status"], "ok") << r.dump();
        EXPECT_EQ(r["accuracy"]["protocol"], "query_agnostic");
        if (e.name == "full") {
          EXPECT_EQ(r["accuracy"]["acc"].get<double>(), 1.0) << r.dump();
        }
      });
  EXPECT_NE(test::input_error_of([&] {
              load_experiment(std::string(HG_SOURCE_DIR) + "/experiments/needle.yaml", {"eval.protocol=agnostic"});
            }).find("expected query_aware or query_agnostic"),
            std::string::npos);
}

// A prompt and its tokens to generate beyond the model's positions fail the row, naming both.
TEST(Needle, PromptsBeyondTheModelsPositionsAreAnError) {
  ExperimentSpec spec = load_experiment(std::string(HG_SOURCE_DIR) + "/experiments/needle.yaml",
                                        {"models=[synthetic:tiny-llama]", "strategies=[full]", "eval.tasks=[passkey]",
                                         "sweep.needle_tokens=[600]", "sweep.depth=[50]", "limit=1", "device=emulated"});
  Runner runner(spec);
  nlohmann::ordered_json row;
  for (auto& p : expand(spec)) runner.run(p, spec.strategies[0], {}, [&](nlohmann::ordered_json r) { row = r; });
  ASSERT_EQ(row["status"], "failed") << row.dump();
  const std::string why = row["reason"].get<std::string>();
  EXPECT_NE(why.find("to generate exceed"), std::string::npos) << why;
  EXPECT_NE(why.find("512 positions"), std::string::npos) << why;
}

}  // namespace
}  // namespace hg
