// The long-context retrieval tasks (datasets/needle.h): deterministic generation from the seed,
// the needle at the asked depth, the prompt at the asked length in the model's tokens, RULER's
// string_match_all scoring, and a run through the strategies (an exact one agrees with full).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

TEST(Needle, SameSeedSamePromptAtTheAskedLengthAndDepth) {
  Model m = load_model("synthetic:tiny-llama");
  const Tokenizer& tok = *m.tokenizer;
  // One haystack block in tokens: how close to the asked length a prompt can come.
  const int block = int(tok.encode(" The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
                                   "again.").size());
  for (const std::string& task : needle_task_names())
    for (int tokens : {1500, 4000})
      for (int depth : {0, 25, 50, 100}) {
        const NeedleItem a = make_needle_item(task, tok, tokens, depth, 7, 0);
        const NeedleItem b = make_needle_item(task, tok, tokens, depth, 7, 0);
        const std::string what = task + " " + std::to_string(tokens) + " " + std::to_string(depth);
        EXPECT_EQ(a.prompt, b.prompt) << what;
        EXPECT_EQ(a.tokens, int(tok.encode(a.prompt).size())) << what;
        EXPECT_LE(a.tokens, tokens) << what;
        EXPECT_GT(a.tokens, tokens - block - 2) << what;
        // The queried needle sits at the asked share of the text (within a block and the
        // instructions around the haystack).
        const double at = 100.0 * double(a.needle_at) / double(a.prompt.size());
        EXPECT_NEAR(at, depth, 100.0 * (2 * block + 300) / double(a.prompt.size())) << what;
        for (auto& ans : a.answers) EXPECT_NE(a.prompt.find(ans), std::string::npos) << what << " " << ans;
        EXPECT_GT(a.max_new, 0);
      }
  // The key depends on the seed and the item, not on the length or depth.
  const NeedleItem x = make_needle_item("passkey", tok, 1500, 0, 7, 0), y = make_needle_item("passkey", tok, 4000, 100, 7, 0);
  EXPECT_EQ(x.answers, y.answers);
  EXPECT_NE(make_needle_item("passkey", tok, 1500, 0, 7, 1).answers, x.answers);
  EXPECT_NE(make_needle_item("passkey", tok, 1500, 0, 8, 0).answers, x.answers);
  // Multi-key: the queried needle and three with other keys; variable tracking: a chain of five.
  const NeedleItem mk = make_needle_item("niah_multikey", tok, 3000, 50, 7, 0);
  EXPECT_EQ(count_of(mk.prompt, "One of the special magic numbers for"), 4u);
  const NeedleItem vt = make_needle_item("variable_tracking", tok, 3000, 30, 7, 0);
  ASSERT_EQ(vt.answers.size(), 5u);
  size_t last = 0;
  for (size_t i = 1; i < vt.answers.size(); ++i) {  // each link after the one it copies
    const size_t at = vt.prompt.find("VAR " + vt.answers[i] + " = VAR " + vt.answers[i - 1]);
    ASSERT_NE(at, std::string::npos);
    EXPECT_GT(at, last);
    last = at;
  }
  EXPECT_THROW(make_needle_item("niah_multikey", tok, 100, 50, 7, 0), InputError);
  EXPECT_THROW(make_needle_item("passkey", tok, 1500, 101, 7, 0), InputError);
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
