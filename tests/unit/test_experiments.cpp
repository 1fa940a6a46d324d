// Experiment files, the Runner and the Recorder: schema errors name the line, expansion, --set,
// failed points, resume after SIGKILL, shard merge, and dry against real execution.
#include <gtest/gtest.h>

#include <regex>

#include <signal.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "engine/core/error.h"
#include "experiments/runner/recorder.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/spec.h"
#include "test_util.h"

namespace hg {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    parse_experiment(yaml, "t.yaml", sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const char* kBase = R"(name: t
models: ["synthetic:tiny-llama"]
strategies: [full, flexgen]
sweep:
  prompt_tokens: [16, 32]
)";

TEST(ExperimentSpec, UnknownKeyNamesLineAndNearestKey) {
  const std::string e = error_of(std::string(kBase) + "repeat: 3\n");
  EXPECT_NE(e.find("t.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'repeats'"), std::string::npos) << e;
  const std::string s = error_of(std::string(kBase) + "  promt_tokens: [1]\n");
  EXPECT_NE(s.find("t.yaml:6"), std::string::npos) << s;
  EXPECT_NE(s.find("sweep.prompt_tokens"), std::string::npos) << s;
}

TEST(ExperimentSpec, WrongTypeBadUnitAndEmptySweepNameTheLine) {
  std::string e = error_of(std::string(kBase) + "repeats: two\n");
  EXPECT_NE(e.find("t.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "  gpu_memory_bytes: [2XiB]\n");
  EXPECT_NE(e.find("t.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("unit"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "  batch: []\n");
  EXPECT_NE(e.find("t.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "  flexgen.overlap: [maybe]\n");
  EXPECT_NE(e.find("t.yaml:6"), std::string::npos) << e;
  e = error_of(std::string(kBase) + "execute: dry\n");
  EXPECT_NE(e.find("modeled"), std::string::npos) << e;
}

// `--set STRATEGY.PARAM=V` sets a strategy's parameter for every point (a one-value sweep axis),
// as `bench`, `eval` and `generate` take it; a bad value is refused as the axis would be.
TEST(ExperimentSpec, SetStrategyParameterForEveryPoint) {
  const std::string y = std::string(kBase).replace(std::string(kBase).find("[full, flexgen]"), 15, "[full, hybridgen]");
  const ExperimentSpec s = parse_experiment(y, "t.yaml", {"hybridgen.k=fixed", "hybridgen.k_fixed=64"});
  const auto pts = expand(s);
  ASSERT_EQ(pts.size(), 2u);  // the two prompt lengths, each with both strategies
  for (const auto& p : pts) {
    EXPECT_EQ(p.strategy_params.at("hybridgen").at("k"), "fixed");
    EXPECT_EQ(p.strategy_params.at("hybridgen").at("k_fixed"), "64");
  }
  EXPECT_NE(error_of(y, {"hybridgen.k=sometimes"}).find("k"), std::string::npos);
  const std::string e = error_of(y, {"hybridgn.k=fixed"});
  EXPECT_NE(e.find("STRATEGY.PARAM"), std::string::npos) << e;
}

TEST(ExperimentSpec, ExpansionCountsAndStableIds) {
  const std::string y = R"(name: t
models: ["synthetic:tiny-llama", "synthetic:tiny-qwen2"]
strategies: [full, {name: hybridgen, label: hg-pre, params: {mode: pre}}, {name: hybridgen, label: hg-post}]
sweep:
  prompt_tokens: [16, 32, 64]
  batch: [1, 2]
  hybridgen.k_min: [4, 8]
)";
  const ExperimentSpec s = parse_experiment(y, "t.yaml");
  const auto pts = expand(s);
  ASSERT_EQ(pts.size(), 2u * 3 * 2 * 2);
  EXPECT_EQ(s.strategies.size(), 3u);
  std::set<std::string> ids;
  for (auto& p : pts) ids.insert(p.id);
  EXPECT_EQ(ids.size(), pts.size());
  EXPECT_EQ(expand(parse_experiment(y, "other.yaml"))[5].id, pts[5].id);  // stable across files and runs
  EXPECT_EQ(pts.back().strategy_params.at("hybridgen").at("k_min"), "8");
  EXPECT_EQ(pts[1].strategy_params.at("hybridgen").at("k_min"), "8");  // the last axis varies fastest
  EXPECT_NE(expand(parse_experiment(y, "t.yaml", {"seed=2"}))[0].id, pts[0].id);
}

TEST(ExperimentSpec, SetOverridesNestedKeys) {
  const ExperimentSpec s = parse_experiment(
      kBase, "t.yaml", {"sweep.prompt_tokens=[8,16,24]", "strategies.1={name: flexgen, params: {overlap: false}}",
                        "sweep.flexgen.overlap=[true,false]", "repeats=3"});
  EXPECT_EQ(expand(s).size(), 6u);
  EXPECT_EQ(s.strategies[1].params.at("overlap"), "false");
  EXPECT_EQ(s.repeats, 3);
  const std::string e = error_of(kBase, {"sweep.prompt_tokens=[]"});
  EXPECT_NE(e.find("--set sweep.prompt_tokens=[]"), std::string::npos) << e;
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  EXPECT_NE(error_of(kBase, {"repeatz=2"}).find("did you mean 'repeats'"), std::string::npos);
}

std::string tmp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("hg_exp_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

struct Proc {
  int status;
  std::string out;
};
Proc run_cli(const std::string& args) {
  Proc r{-1, ""};
  FILE* p = popen((std::string(HG_BINARY) + " " + args + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  fs::create_directories(dir);
  std::ofstream(dir + "/" + name) << text;
  return dir + "/" + name;
}

std::set<std::tuple<std::string, std::string, int>> keys_of(const std::vector<ResultRow>& rows) {
  std::set<std::tuple<std::string, std::string, int>> k;
  for (auto& r : rows) k.insert(r.key());
  return k;
}

// Rows are typed where they are read: a row without a key every reader relies on (or of the wrong
// type) is an error naming the file, the line and the key, and such a row is never appended.
// A task's data that is missing is one line naming the file and exit 2, before anything runs or
// is written (eval and accuracy files alike).
TEST(ExperimentRun, MissingTaskDataIsOneLineAndExitTwo) {
  const std::string d = tmp_dir("nodata");
  Proc p = run_cli("eval --task copa --data-dir /nonexistent --limit 2 --model synthetic:tiny-llama -o " + d + "/out");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("/nonexistent/copa/val.jsonl"), std::string::npos) << p.out;
  EXPECT_EQ(std::count(p.out.begin(), p.out.end(), '\n'), 1) << p.out;
  EXPECT_FALSE(fs::exists(d + "/out"));
  p = run_cli("validate " + std::string(HG_SOURCE_DIR) + "/experiments/accuracy.yaml --set eval.data_dir=/nonexistent --set 'models=[synthetic:tiny-llama]'");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("/nonexistent/"), std::string::npos) << p.out;
  fs::remove_all(d);
}

// Rows name the chat template their prompts went through and why; one the model's tokenizer cannot
// render (no such markers) is that row's bad_input, and an unknown name is the file's error.
TEST(ExperimentRun, RowsRecordTheChatTemplate) {
  HG_REQUIRE_SHARED("datasets/copa/val.jsonl");
  const std::string d = tmp_dir("chat");
  Proc p = run_cli("eval --task copa --limit 2 --model synthetic:tiny-llama --chat-template auto -o " + d + "/auto");
  ASSERT_EQ(p.status, 0) << p.out;
  auto rows = read_rows(d + "/auto");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].json["accuracy"]["chat_template"], (Json{{"name", "none"}, {"source", "the model has none"}}));
  EXPECT_GT(rows[0].json["figures"]["scored_tokens"].get<int64_t>(), 0);
  p = run_cli("eval --task copa --limit 2 --model synthetic:tiny-llama --chat-template chatml -o " + d + "/chatml");
  EXPECT_EQ(p.status, 1) << p.out;
  rows = read_rows(d + "/chatml");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].json["error"], "bad_input");
  EXPECT_NE(rows[0].reason.find("chat template chatml: the tokenizer has no <|im_start|> token"), std::string::npos)
      << rows[0].reason;
  p = run_cli("eval --task copa --limit 2 --model synthetic:tiny-llama --chat-template llama2 -o " + d + "/bad");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("chat_template 'llama2' (expected none, auto, llama3 or chatml)"), std::string::npos) << p.out;
  fs::remove_all(d);
}

// A measured table gives the absolute figures first: seconds and decode tokens/s per strategy and
// point as mean ± sd over the repeats, before the ratios.
TEST(ExperimentRun, TheTableGivesSecondsAndTokensPerSecondWithTheirSpread) {
  const std::string d = tmp_dir("spread");
  Proc p = run_cli(std::string(HG_SOURCE_DIR) + "/experiments/quickstart.yaml --set 'models=[\"synthetic:tiny-llama\"]' "
                   "--set 'strategies=[full, flexgen]' --set 'sweep.prompt_tokens=[64]' --set 'sweep.decode_tokens=[4]' -o " +
                   d + "/q");
  ASSERT_EQ(p.status, 0) << p.out;
  const std::string t = test::read_file(d + "/q/table.txt");
  EXPECT_EQ(t.rfind("end-to-end latency in seconds, and decode tokens/s of all sequences (measured), mean ± sd over 2 repeats",
                    0),
            0u)
      << t;
  const std::regex cell("\\nflexgen +[0-9.e-]+±[0-9.e-]+\\n");
  EXPECT_EQ(t.find("e+"), std::string::npos) << t;  // no exponents
  EXPECT_TRUE(std::regex_search(t, cell)) << t;
  EXPECT_NE(t.find("decode tok/s"), std::string::npos) << t;
  EXPECT_LT(t.find("mean ± sd"), t.find("normalised to flexgen")) << t;
  fs::remove_all(d);
}

// `--resume DIR` alone continues from DIR's own config.yaml (with its --set overrides), and the
// runs it holds already are not printed again.
TEST(ExperimentRun, ResumeAloneContinuesFromTheDirectorysConfig) {
  const std::string d = tmp_dir("resume_alone");
  Proc p = run_cli(std::string(HG_SOURCE_DIR) + "/experiments/quickstart.yaml --set 'models=[\"synthetic:tiny-llama\"]' "
                   "--set 'strategies=[full, flexgen, h2o]' --set 'sweep.prompt_tokens=[64]' --set 'sweep.decode_tokens=[4]' "
                   "--set repeats=1 -o " + d + "/r");
  ASSERT_EQ(p.status, 0) << p.out;
  // Drop the last row, as a kill would have.
  std::string rows = test::read_file(d + "/r/rows.jsonl");
  rows.erase(rows.rfind('\n', rows.size() - 2) + 1);
  test::write_file(d + "/r/rows.jsonl", rows);
  p = run_cli("--resume " + d + "/r");
  ASSERT_EQ(p.status, 0) << p.out;
  EXPECT_EQ(read_rows(d + "/r").size(), 3u);
  EXPECT_EQ(p.out.find("[1/3] full"), std::string::npos) << p.out;  // finished: not reprinted
  EXPECT_NE(p.out.find("[3/3] h2o"), std::string::npos) << p.out;
  p = run_cli("--resume " + d + "/nothing");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("nothing/config.yaml: not found"), std::string::npos) << p.out;
  fs::remove_all(d);
}

// A synthetic spec in a --set list needs no inner quotes (YAML's flow rules refuse its `?`).
TEST(ExperimentSpec, ASyntheticSpecInASetListNeedsNoQuotes) {
  const ExperimentSpec s = load_experiment(std::string(HG_SOURCE_DIR) + "/experiments/quickstart.yaml",
                                           {"models=[synthetic:tiny-llama?layers=1&dtype=bf16, synthetic:tiny-qwen2]"});
  EXPECT_EQ(s.models, (std::vector<std::string>{"synthetic:tiny-llama?layers=1&dtype=bf16", "synthetic:tiny-qwen2"}));
  EXPECT_NE(test::input_error_of([] {
              load_experiment(std::string(HG_SOURCE_DIR) + "/experiments/quickstart.yaml", {"models={a: [b"});
            }).find("the value is not YAML"),
            std::string::npos);
}

// A modeled study needs no weights: a Hugging Face directory with config.json alone runs dry (its
// weights phantoms of their shapes, at config.json's torch_dtype); a real run still needs them.
TEST(ExperimentRun, AConfigJsonAloneRunsDry) {
  const std::string d = tmp_dir("config_only");
  fs::create_directories(d + "/mistral");  // Mistral-7B-v0.3's shapes, in the Llama class it shares
  test::write_file(d + "/mistral/config.json", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 32768, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})");
  Proc p = run_cli(std::string(HG_SOURCE_DIR) + "/experiments/seqlen.yaml --set 'models=[" + d +
                   "/mistral]' --set 'strategies=[flexgen]' --set 'sweep.prompt_tokens=[2048]' -o " + d + "/r");
  ASSERT_EQ(p.status, 0) << p.out;
  const auto rows = read_rows(d + "/r");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].ok) << rows[0].reason;
  EXPECT_EQ(rows[0].time_basis, "modeled (dry)");
  p = run_cli(std::string(HG_SOURCE_DIR) + "/experiments/quickstart.yaml --set 'models=[" + d +
              "/mistral]' --set 'strategies=[full]' --set baseline=full --set 'sweep.prompt_tokens=[16]' --set 'sweep.decode_tokens=[2]' -o " +
              d + "/real");
  EXPECT_NE(p.out.find("no model.safetensors"), std::string::npos) << p.out;
  fs::remove_all(d);
}

// Sizes in an experiment file take the CLI's units; a bad one names the file, line and unit.
TEST(ExperimentSpec, SizesTakeUnits) {
  const std::string head = "name: x\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\nsweep:\n";
  const auto pts = expand(parse_experiment(head + "  gpu_kv_bytes: [2GiB, 1.5MB, 4096]\n", "x.yaml"));
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_EQ(pts[0].gpu_kv_bytes, int64_t(2) << 30);
  EXPECT_EQ(pts[1].gpu_kv_bytes, 1500000);
  EXPECT_EQ(pts[2].gpu_kv_bytes, 4096);
  EXPECT_NE(test::input_error_of([&] { parse_experiment(head + "  gpu_kv_bytes: [3XB]\n", "x.yaml"); })
                .find("x.yaml:5: gpu_kv_bytes '3XB': unknown unit 'XB'"),
            std::string::npos);
}

TEST(ResultRows, ABadRowIsNamedByFileLineAndKey) {
  const std::string d = tmp_dir("badrow");
  fs::create_directories(d + "/r");
  Json good = ResultRow::head("e", "p1", 0, "full", "full", 0, true);
  good["figures"] = {{"time_s", 1.5}, {"kv_dtype", "f16"}, {"attended", {{"fraction", 0.25}}}};
  Json no_label = good;
  no_label.erase("label");
  Json bad_repeat = good;
  bad_repeat["repeat"] = "0";
  Json no_figures = good;
  no_figures.erase("figures");
  auto write_rows = [&](const std::vector<Json>& rows) {
    std::ofstream o(d + "/r/rows.jsonl", std::ios::trunc);
    for (auto& r : rows) o << r.dump() << "\n";
  };
  write_rows({good});
  const auto rows = read_rows(d + "/r");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].ok);
  EXPECT_EQ(rows[0].key(), std::make_tuple(std::string("p1"), std::string("full"), 0));
  EXPECT_EQ(rows[0].figure("time_s"), 1.5);
  EXPECT_EQ(rows[0].figure("attended", "fraction"), 0.25);
  EXPECT_TRUE(std::isnan(rows[0].figure("decode_s")));
  EXPECT_EQ(rows[0].figure_text("kv_dtype", "-"), "f16");
  const std::vector<std::pair<Json, std::string>> bad = {{no_label, "rows.jsonl:2: the row has no 'label'"},
                                                         {bad_repeat, "rows.jsonl:2: the row's 'repeat' must be"},
                                                         {no_figures, "rows.jsonl:2: an ok timing row has no 'figures'"}};
  for (auto& [row, what] : bad) {
    write_rows({good, row});
    try {
      read_rows(d + "/r");
      ADD_FAILURE() << "accepted: " << row.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  ExperimentSpec spec = parse_experiment(kBase, "t.yaml");
  fs::remove_all(d + "/w");
  ResultDir out(d + "/w", spec, false, false, "");
  EXPECT_THROW(out.append(no_label), InputError);
  EXPECT_NO_THROW(out.append(good));
  EXPECT_EQ(read_rows(d + "/w").size(), 1u);
  fs::remove_all(d);
}

TEST(ExperimentRun, FailedPointIsARowAndTheSweepGoesOn) {
  const std::string d = tmp_dir("fail");
  const std::string f = write_file(d, "e.yaml", R"(name: f
models: ["synthetic:tiny-llama"]
strategies: [flexgen]
sweep:
  prompt_tokens: [16]
  decode_tokens: [2]
  gpu_memory_bytes: [1000, 0]
)");
  const Proc p = run_cli(f + " -o " + d + "/out");
  EXPECT_EQ(p.status, 1) << p.out;  // some point failed
  const auto rows = read_rows(d + "/out");
  ASSERT_EQ(rows.size(), 2u) << p.out;
  EXPECT_EQ(rows[0].json["status"], "failed");
  EXPECT_EQ(rows[0].json["error"], "out_of_memory");
  EXPECT_NE(rows[0].json["reason"].get<std::string>().find("gpu"), std::string::npos);
  EXPECT_EQ(rows[1].json["status"], "ok");
  // summary.csv: every record (the failed one with its reason included) has the header's fields.
  std::ifstream csv(d + "/out/summary.csv");
  std::string line;
  std::vector<size_t> fields;
  while (std::getline(csv, line)) {
    size_t n = 1;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) ++n;
    }
    fields.push_back(n);
  }
  ASSERT_EQ(fields.size(), 3u);
  EXPECT_EQ(fields[1], fields[0]);
  EXPECT_EQ(fields[2], fields[0]);
  // The directory is never overwritten without --resume or --force.
  EXPECT_EQ(run_cli(f + " -o " + d + "/out").status, 2);
  fs::remove_all(d);
}

// A result directory belongs to one experiment: --resume with another file, other settings or
// another shard is refused (exit 2, naming what differs) and leaves the rows as they were.
TEST(ExperimentRun, ResumeRefusesAnotherExperimentsDirectory) {
  const std::string d = tmp_dir("resume_other");
  const std::string body = "models: [\"synthetic:tiny-llama\"]\nstrategies: [full]\nsweep:\n  prompt_tokens: [8]\n"
                           "  decode_tokens: [1]\n";
  const std::string a = write_file(d, "a.yaml", "name: a\n" + body);
  const std::string b = write_file(d, "b.yaml", "name: b\n" + body);
  ASSERT_EQ(run_cli(a + " -o " + d + "/out").status, 0);
  const auto before = read_rows(d + "/out");
  Proc p = run_cli(b + " --resume " + d + "/out");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("name"), std::string::npos) << p.out;
  p = run_cli(a + " --resume " + d + "/out --set sweep.prompt_tokens=[16]");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("sweep"), std::string::npos) << p.out;
  p = run_cli(a + " --resume " + d + "/out --shard 1/2");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_EQ(read_rows(d + "/out").size(), before.size());
  // The same experiment resumes (nothing left to run).
  EXPECT_EQ(run_cli(a + " --resume " + d + "/out").status, 0);
  fs::remove_all(d);
}

TEST(ExperimentRun, SigkillThenResumeYieldsTheRowsOfAnUninterruptedRun) {
  const std::string d = tmp_dir("resume");
  const std::string f = write_file(d, "e.yaml", R"(name: r
models: ["synthetic:tiny-llama"]
strategies: [full, flexgen, hybridgen]
sweep:
  prompt_tokens: [32, 48, 64, 80]
  decode_tokens: [24]
  hybridgen.gpu_kv_tokens: [8]
repeats: 2
)");
  ASSERT_EQ(run_cli(f + " -o " + d + "/whole").status, 0);
  const auto whole = read_rows(d + "/whole");
  ASSERT_EQ(whole.size(), 4u * 3 * 2);

  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open("/dev/null", O_WRONLY);
    dup2(fd, 1), dup2(fd, 2);
    execl(HG_BINARY, HG_BINARY, f.c_str(), "-o", (d + "/killed").c_str(), (char*)nullptr);
    _exit(127);
  }
  // Kill it once a few rows are down (mid-sweep).
  for (int i = 0; i < 2000; ++i) {
    std::ifstream in(d + "/killed/rows.jsonl");
    const std::string all((std::istreambuf_iterator<char>(in)), {});
    if (std::count(all.begin(), all.end(), '\n') >= 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "the run finished before it was killed";
  const size_t before = read_rows(d + "/killed").size();
  EXPECT_LT(before, whole.size());
  // Simulate a torn line as a kill mid-write leaves it.
  std::ofstream(d + "/killed/rows.jsonl", std::ios::app) << R"({"point_id": "torn)";
  // A merge would drop the torn row without a word: it is refused, naming the directory.
  const Proc m = run_cli("merge " + d + "/killed --out " + d + "/merged");
  EXPECT_EQ(m.status, 2) << m.out;
  EXPECT_NE(m.out.find("its last row is torn"), std::string::npos) << m.out;
  const Proc p = run_cli(f + " --resume " + d + "/killed");
  ASSERT_EQ(p.status, 0) << p.out;
  bool torn = true;
  const auto resumed = read_rows(d + "/killed", &torn);
  EXPECT_FALSE(torn);
  EXPECT_EQ(resumed.size(), whole.size());
  EXPECT_EQ(keys_of(resumed), keys_of(whole));  // no duplicate, none missing
  fs::remove_all(d);
}

const char* kDry = R"(name: m
models: ["synthetic:tiny-llama"]
strategies: [flexgen, moe_lightning, {name: hybridgen, params: {k: fixed, mode: post, k_fixed: 8, gpu_kv_tokens: 16}}]
baseline: flexgen
sweep:
  prompt_tokens: [40, 64, 96]
  decode_tokens: [6]
device: emulated
clock: modeled:machine-a
execute: dry
)";

TEST(ExperimentRun, MergeOfTwoShardsEqualsTheUnshardedRun) {
  const std::string d = tmp_dir("merge");
  const std::string f = write_file(d, "e.yaml", kDry);
  ASSERT_EQ(run_cli(f + " -o " + d + "/all").status, 0);
  ASSERT_EQ(run_cli(f + " --shard 0/2 -o " + d + "/s0").status, 0);
  ASSERT_EQ(run_cli(f + " --shard 1/2 -o " + d + "/s1").status, 0);
  const Proc m = run_cli("merge " + d + "/s1 " + d + "/s0 --out " + d + "/merged");
  ASSERT_EQ(m.status, 0) << m.out;
  const auto all = read_rows(d + "/all"), merged = read_rows(d + "/merged");
  ASSERT_EQ(merged.size(), all.size());
  EXPECT_EQ(keys_of(merged), keys_of(all));
  for (size_t i = 0; i < all.size(); ++i) {  // in the same order, with the same points, work and traffic
    EXPECT_EQ(merged[i].json["point_id"], all[i].json["point_id"]);
    EXPECT_EQ(merged[i].json["label"], all[i].json["label"]);
    EXPECT_EQ(merged[i].json["point"], all[i].json["point"]);
    EXPECT_EQ(merged[i].json["link_bytes_per_step"], all[i].json["link_bytes_per_step"]);
    // Dry runs replay by reported progress, not host timing: the same modeled time every run.
    EXPECT_EQ(merged[i].json["figures"]["time_s"], all[i].json["figures"]["time_s"]);
  }
  auto lines = [](const std::string& p) {
    std::ifstream in(p);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    return std::count(all.begin(), all.end(), '\n');
  };
  EXPECT_EQ(lines(d + "/merged/summary.csv"), lines(d + "/all/summary.csv"));
  // A merge that fails on the way (a file-size limit, as a full disk) over an existing result leaves
  // that result whole and no staging directory beside it.
  {
    FILE* pp = popen(("bash -c 'ulimit -f 4; exec " + std::string(HG_BINARY) + " merge " + d + "/s1 " + d + "/s0 --out " +
                      d + "/merged --force' 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pp)) > 0) out.append(buf, n);
    const int st = pclose(pp);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << out;
    EXPECT_NE(out.find("unchanged"), std::string::npos) << out;
    EXPECT_EQ(keys_of(read_rows(d + "/merged")), keys_of(all));
    EXPECT_EQ(lines(d + "/merged/summary.csv"), lines(d + "/all/summary.csv"));
    for (auto& e : fs::directory_iterator(d))
      EXPECT_EQ(e.path().filename().string().find(".merged.merge"), std::string::npos) << e.path();
  }
  // Nothing lost or mixed: an output that is one of the inputs is refused before anything is
  // removed, and so is a shard of other settings.
  Proc p = run_cli("merge " + d + "/s0 " + d + "/s1 --out " + d + "/s0 --shards 2 --force");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_EQ(read_rows(d + "/s0").size() + read_rows(d + "/s1").size(), all.size());
  ASSERT_EQ(run_cli(f + " --shard 1/2 -o " + d + "/s1b --set seed=7").status, 0);
  p = run_cli("merge " + d + "/s0 " + d + "/s1b --out " + d + "/mixed --shards 2");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("seed"), std::string::npos) << p.out;
  EXPECT_FALSE(fs::exists(d + "/mixed"));
  fs::remove_all(d);
}

// A write that fails (here a file-size limit, as a full disk would) is one line naming the rows
// file and the rows kept, exit 1, and the rows already written stay whole and resumable.
TEST(ExperimentRun, AFailedWriteKeepsTheRowsBeforeIt) {
  const std::string d = tmp_dir("fsize");
  const std::string f = write_file(d, "e.yaml", kDry);
  // Real execution: a dry run's phantom memory is a memfd, which the file-size limit would cap too.
  const std::string real = " --set execute=real";
  ASSERT_EQ(run_cli(f + real + " -o " + d + "/all").status, 0);
  std::ifstream rows_in(d + "/all/rows.jsonl");
  std::string first, second;
  std::getline(rows_in, first);
  std::getline(rows_in, second);
  const uintmax_t cfg = fs::file_size(d + "/all/config.yaml");
  // Room for config.yaml, the first row and half of the second (bash counts 1024-byte blocks).
  const uintmax_t limit_kb = (cfg + first.size() + 1 + second.size() / 2) / 1024 + 1;
  ASSERT_LT(limit_kb * 1024, cfg + first.size() + second.size() + 2) << "rows too small for the limit";
  Proc p{-1, ""};
  FILE* pp = popen(("bash -c 'ulimit -f " + std::to_string(limit_kb) + "; exec " + HG_BINARY + " " + f + real + " -o " + d +
                    "/cut' 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pp)) > 0) p.out.append(buf, n);
  const int st = pclose(pp);
  p.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  EXPECT_EQ(p.status, 1) << p.out;
  // The limit falls in the second row by the first run's sizes; rows carry measured numbers whose
  // digits vary, and the limit is whole KiB, so the cut run may keep two.
  bool torn = true;
  const auto kept = read_rows(d + "/cut", &torn);
  EXPECT_FALSE(torn);
  EXPECT_GE(kept.size(), 1u);
  EXPECT_LT(kept.size(), read_rows(d + "/all").size());
  EXPECT_NE(p.out.find(d + "/cut/rows.jsonl: cannot append a row (File too large); the " +
                       std::to_string(kept.size()) + " rows before it are intact"),
            std::string::npos) << p.out;
  ASSERT_EQ(run_cli(f + real + " --resume " + d + "/cut").status, 0);  // with the limit gone, the rest follows
  EXPECT_EQ(keys_of(read_rows(d + "/cut")), keys_of(read_rows(d + "/all")));
  fs::remove_all(d);
}

// `merge --shards N` names each shard that is absent or incomplete by number and writes nothing;
// with the missing shard run, the same command completes the set.
TEST(ExperimentRun, MergeWithShardsReportsMissingShardsByNumber) {
  const std::string d = tmp_dir("merge_missing");
  const std::string f = write_file(d, "e.yaml", kDry);
  ASSERT_EQ(run_cli(f + " --shard 0/3 -o " + d + "/s0").status, 0);
  ASSERT_EQ(run_cli(f + " --shard 2/3 -o " + d + "/s2").status, 0);
  // Shard 2 loses its last row (a task killed mid-way).
  {
    auto rows = read_rows(d + "/s2");
    std::ofstream o(d + "/s2/rows.jsonl", std::ios::trunc);
    for (size_t i = 0; i + 1 < rows.size(); ++i) o << rows[i].json.dump() << "\n";
  }
  const std::string merge = "merge " + d + "/s0 " + d + "/s1 " + d + "/s2 --shards 3 --out " + d + "/merged";
  Proc m = run_cli(merge);
  EXPECT_EQ(m.status, 1) << m.out;
  EXPECT_NE(m.out.find("shard 1 of 3: missing (no result directory)"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find("shard 2 of 3: incomplete, 1 of 3 rows missing"), std::string::npos) << m.out;
  EXPECT_EQ(m.out.find("shard 0 of 3"), std::string::npos) << m.out;
  EXPECT_FALSE(fs::exists(d + "/merged/rows.jsonl"));
  ASSERT_EQ(run_cli(f + " --shard 1/3 -o " + d + "/s1").status, 0);
  ASSERT_EQ(run_cli(f + " --shard 2/3 --resume " + d + "/s2").status, 0);
  m = run_cli(merge);
  ASSERT_EQ(m.status, 0) << m.out;
  EXPECT_EQ(read_rows(d + "/merged").size(), 9u);
  // A directory of another shard count is refused by name.
  ASSERT_EQ(run_cli(f + " --shard 0/2 -o " + d + "/t0").status, 0);
  m = run_cli("merge " + d + "/t0 --shards 3 --out " + d + "/m2");
  EXPECT_EQ(m.status, 2);
  EXPECT_NE(m.out.find("holds shard 0/2, not one of 3 shards"), std::string::npos) << m.out;
  fs::remove_all(d);
}

// Rows record their inputs' fingerprints; a resume over a changed input (here the platform
// profile) is refused naming the file, and --force resumes anyway with a warning. A merge of rows
// recorded on two versions of one input is refused likewise.
TEST(ExperimentRun, ResumeAndMergeRefuseChangedInputs) {
  const std::string d = tmp_dir("inputs");
  const std::string f =
      write_file(d, "e.yaml",
                 "name: fp\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\nsweep:\n"
                 "  prompt_tokens: [8, 16]\n  decode_tokens: [2]\ndevice: emulated\nclock: modeled:" +
                     d + "/p.yaml\nexecute: dry\n");
  fs::copy_file(std::string(HG_SOURCE_DIR) + "/experiments/platforms/machine-a.yaml", d + "/p.yaml");
  ASSERT_EQ(run_cli(f + " -o " + d + "/R --shard 0/2").status, 0);
  std::ofstream(d + "/p.yaml", std::ios::app) << "# edited\n";
  ASSERT_EQ(run_cli(f + " -o " + d + "/S --shard 1/2").status, 0);
  Proc p = run_cli(f + " --resume " + d + "/R --shard 0/2");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find(d + "/p.yaml: changed since the rows in"), std::string::npos) << p.out;
  p = run_cli("merge " + d + "/R " + d + "/S --out " + d + "/M");
  EXPECT_EQ(p.status, 2) << p.out;
  EXPECT_NE(p.out.find("rows of two versions of " + d + "/p.yaml"), std::string::npos) << p.out;
  EXPECT_FALSE(fs::exists(d + "/M/rows.jsonl"));
  p = run_cli(f + " --resume " + d + "/R --shard 0/2 --force");
  EXPECT_EQ(p.status, 0) << p.out;
  EXPECT_NE(p.out.find("--force: resuming anyway"), std::string::npos) << p.out;
  fs::remove_all(d);
}

// A model directory (Hugging Face: config.json, weights, tokenizer) is fingerprinted by the files it
// holds: one byte changed in any of them, or a file renamed, changes it; a file stays as before.
TEST(ExperimentRun, ModelDirectoriesAreFingerprintedByTheirFiles) {
  const std::string d = tmp_dir("fpdir");
  fs::create_directories(d + "/m");
  write_file(d + "/m", "config.json", "{\"a\": 1}");
  write_file(d + "/m", "model.safetensors", std::string(3 << 20, 'x'));
  const auto id = [&] { return file_fingerprint(d + "/m").value("fnv1a64_size_head_tail", std::string("none")); };
  const std::string first = id();
  EXPECT_NE(first, "none");
  EXPECT_EQ(file_fingerprint(d + "/m")["bytes"].get<int64_t>(), int64_t(3 << 20) + 8);
  {
    std::fstream f(d + "/m/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('y');
  }
  const std::string second = id();
  EXPECT_NE(second, first);
  fs::rename(d + "/m/config.json", d + "/m/config2.json");
  EXPECT_NE(id(), second);
  fs::create_directories(d + "/empty");
  EXPECT_FALSE(file_fingerprint(d + "/empty").value("exists", true));
  fs::remove_all(d);
}

// `submit --dry-run` prints the array script (one task per shard, each into its own directory,
// resuming a resubmitted shard) and the merge job's dependency; --only resubmits chosen shards.
TEST(ExperimentRun, SubmitWritesAnArrayAndAMergeJob) {
  const std::string d = tmp_dir("submit");
  const std::string f = write_file(d, "e.yaml", kDry);
  Proc p = run_cli("submit " + f + " --shards 3 --partition gpu --gres gpu:1 --time 01:00:00 -o " + d + "/r --dry-run");
  ASSERT_EQ(p.status, 0) << p.out;
  for (const char* want : {"#SBATCH --array=0,1,2", "#SBATCH --partition=gpu", "#SBATCH --gres=gpu:1",
                           "#SBATCH --time=01:00:00", "--shard \"$SLURM_ARRAY_TASK_ID/3\"", "/r/shards'/shard-$SLURM_ARRAY_TASK_ID",
                           "--resume \"$d\"", "merge '", "--shards 3 --out '", "--dependency=afterany:ARRAY_ID"})
    EXPECT_NE(p.out.find(want), std::string::npos) << want << "\n" << p.out;
  p = run_cli("submit " + f + " --shards 3 --only 2 -o " + d + "/r --dry-run");
  EXPECT_NE(p.out.find("#SBATCH --array=2\n"), std::string::npos) << p.out;
  p = run_cli("submit " + f + " --shards 4 --dry-run");
  EXPECT_EQ(p.status, 2);
  EXPECT_NE(p.out.find("4 shards for 3 points"), std::string::npos) << p.out;
  p = run_cli("submit " + f + " --shards 3 --only 5 --dry-run");
  EXPECT_EQ(p.status, 2);
  EXPECT_NE(p.out.find("--only shard 5 is not in 0..2"), std::string::npos) << p.out;
  fs::remove_all(d);
}

// clock: modeled:calibrate measures this machine just before each recorded run and replays the run
// on that profile: the row carries the profile it was replayed on (there is no file to point to),
// the provenance says so, and the clock check's ratio is there; the warm-up run is not calibrated.
TEST(ExperimentRun, CalibrateClockReplaysEachRunOnAProfileMeasuredBeforeIt) {
  ExperimentSpec spec = parse_experiment(kDry, "t.yaml",
                                         {"execute=real", "clock=modeled:calibrate", "strategies=[flexgen]",
                                          "sweep.prompt_tokens=[40]", "repeats=2", "warmup=1"});
  Runner run(spec);
  std::vector<Json> rows;
  for (const Point& p : expand(spec)) run.run(p, spec.strategies[0], {}, [&](Json r) { rows.push_back(r); });
  ASSERT_EQ(rows.size(), 2u);
  std::set<double> gemv;
  for (const Json& r : rows) {
    ASSERT_EQ(r["status"], "ok") << r.dump();
    EXPECT_EQ(r["time_basis"], "modeled");
    const Json& md = r["figures"]["modeled"];
    EXPECT_EQ(md["platform"], "calibrate");
    EXPECT_GT(md["profile"]["gpu"]["mem_gbs"].get<double>(), 0);
    EXPECT_GT(md["profile"]["gpu"]["attn_tflops_by_head_dim"]["64"].get<double>(), 0);
    gemv.insert(md["profile"]["gpu"]["mem_gbs"].get<double>());
    EXPECT_EQ(r["provenance"]["inputs"]["platform_profile"]["calibrated_before_run"], true);
    EXPECT_GT(r["figures"]["modeled_over_measured"]["end_to_end"].get<double>(), 0);
    EXPECT_TRUE(r["figures"]["clock_by_stage"].contains("prefill/prefill")) << r["figures"]["clock_by_stage"].dump();
  }
  EXPECT_EQ(gemv.size(), 2u) << "one calibration per recorded run";
  EXPECT_NO_THROW(parse_experiment(kDry, "t.yaml", {"sweep.platform=[calibrate, machine-a]", "clock=modeled"}));
}

// A model or platform name longer than the OS takes is an input error, not a filesystem exception
// (found by fuzz_experiment).
TEST(FuzzRegressions, OverlongModelAndPlatformPathsAreInputErrors) {
  const std::string longname = "/tmp/" + std::string(300, 'x');
  EXPECT_NO_THROW(parse_experiment(std::string(kDry), "t.yaml", {"models=[" + longname + "]"}));
  EXPECT_THROW(parse_experiment(std::string(kDry), "t.yaml", {"clock=modeled:" + longname}), InputError);
}

TEST(ExperimentRun, DryAndRealAgreeOnBytesPerLinkAndFlopsPerStage) {
  // Strategies whose token counts do not depend on values (InfiniGen's do: it is left out).
  // HybridGen's real path stores F32 (its CPU-stage kernels read F32 keys): both runs use F32 for it.
  ExperimentSpec dry = parse_experiment(kDry, "t.yaml", {"hybridgen.kv_dtype=f32"});
  ExperimentSpec real = parse_experiment(kDry, "t.yaml", {"execute=real", "hybridgen.kv_dtype=f32"});
  const auto pts = expand(dry), rpts = expand(real);
  Runner rd(dry), rr(real);
  for (size_t i = 0; i < pts.size(); ++i)
    for (size_t s = 0; s < dry.strategies.size(); ++s) {
      Json a, b;
      rd.run(pts[i], dry.strategies[s], {}, [&](Json r) { a = r; });
      rr.run(rpts[i], real.strategies[s], {}, [&](Json r) { b = r; });
      ASSERT_EQ(a["status"], "ok") << a.dump();
      ASSERT_EQ(b["status"], "ok") << b.dump();
      EXPECT_EQ(a["time_basis"], "modeled (dry)");
      EXPECT_EQ(b["time_basis"], "modeled");
      // The real run is the clock check's: modeled ÷ measured of the same run; a dry one has none.
      EXPECT_FALSE(a["figures"].contains("modeled_over_measured"));
      EXPECT_GT(b["figures"]["modeled_over_measured"]["end_to_end"].get<double>(), 0);
      const std::string what = dry.strategies[s].label + " at " + std::to_string(pts[i].prompt_tokens);
      EXPECT_EQ(a["link_bytes_per_step"], b["link_bytes_per_step"]) << what;
      EXPECT_EQ(a["link_bytes_prefill"], b["link_bytes_prefill"]) << what;
      for (const char* k : {"accel", "cpu", "transfer"})
        EXPECT_DOUBLE_EQ(a["work_per_step"][k]["flops"].get<double>(), b["work_per_step"][k]["flops"].get<double>())
            << what << " " << k;
      EXPECT_EQ(a["tiers"]["gpu"]["peak_bytes"] > 0, true);
    }
}

}  // namespace
}  // namespace hg
