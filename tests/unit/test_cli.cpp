// The hgbench binary: help texts, exit status 2 with a one-line error for bad input, and a real
// generate/info run.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "engine/backend/backend.h"
#include "engine/core/cpu_features.h"
#include "engine/runtime/memory.h"
#include "test_util.h"

namespace hg {
namespace {

struct CmdResult {
  int status;
  std::string out;  // stdout and stderr
};

// env: assignments placed before the command ("NAME=value ...").
CmdResult run(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + " " + std::string(HG_BINARY) + " " + args + " 2>&1";
  CmdResult r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(Cli, HelpForEverySubcommand) {
  EXPECT_EQ(run("--help").status, 0);
  for (const char* c : {"generate", "info", "models", "strategies", "calibrate", "bench", "export"}) {
    const CmdResult r = run(std::string(c) + " --help");
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_FALSE(r.out.empty()) << c;
  }
}

TEST(Cli, BadInputExitsTwoWithOneLine) {
  std::vector<std::string> cases = {
      "generate", "generate --model /nonexistent.gguf", "info --model synthetic:nope",
      "generate --model synthetic:tiny-llama --bogus", "generate --model synthetic:tiny-llama -n x",
      "frobnicate", "generate --model synthetic:tiny-llama -t 100000 -n 2",
      "bench --model synthetic:tiny-llama --threads 1,100000",
      "generate --model synthetic:tiny-llama --strategy nope", "export --model synthetic:tiny-llama",
      "export --model synthetic:tiny-opt --out " + test::temp_path("cli_opt.gguf"),
      "bench --model synthetic:tiny-llama --backend nope",
      "bench --model synthetic:tiny-llama --strategy flexgen,nope",
      "bench --model synthetic:tiny-llama --strategy flexgen --set h2o.heavy_ratio=1",
      "bench --model synthetic:tiny-llama --strategy flexgen --backend cpu",
      "bench --model synthetic:tiny-llama --strategy flexgen --kv f16",
      "bench --model synthetic:tiny-llama --strategy flexgen --device cpu",
      "bench --model synthetic:tiny-llama --device emulated",
      // Sizes checked before anything is allocated: positions beyond the model's (and beyond 32
      // bits), and a prefill larger than this machine's memory.
      "generate --model synthetic:tiny-llama -n 2147483647",
      "generate --model synthetic:tiny-llama --prompt-tokens 2147483647",
      "bench --model synthetic:tiny-llama --context 2147483647",
      "bench --model synthetic:tiny-llama --prefill 2147483647"};
  if (cuda_device_count_or_zero() == 0) {  // with a device these run
    cases.push_back("generate --model synthetic:tiny-llama --backend cuda");
    cases.push_back("generate --model synthetic:tiny-llama --device cuda");
    cases.push_back("bench --model synthetic:tiny-llama --backend cuda --kv f32");
  }
  for (const std::string& args : cases) {
    const CmdResult r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
  }
  // An experiment whose model does not exist: one line naming it, before anything runs or is written.
  const std::string out = test::temp_path("cli_missing_model");
  for (const std::string cmd : {"", "validate "}) {
    const CmdResult r = run(cmd + std::string(HG_SOURCE_DIR) + "/experiments/quickstart.yaml --set models=[/nonexistent] " +
                            (cmd.empty() ? "-o " + out : ""));
    EXPECT_EQ(r.status, 2) << cmd << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << cmd << r.out;
    EXPECT_NE(r.out.find("/nonexistent"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  // --set errors name the flag as typed: a parameter the strategy lacks, a strategy the file lacks,
  // a key an override made (no line of its own).
  const std::string qs = std::string(HG_SOURCE_DIR) + "/experiments/quickstart.yaml";
  for (auto [set, says] : {std::pair{"hybridgen.k_fixd=3", "strategy hybridgen has no parameter 'k_fixd' (did you mean 'k_fixed'"},
                           {"h2o.kv_ratio=0.3", "--set 'h2o.kv_ratio=0.3'"},
                           {"sweep.hybridgen.k_fixd=3", "(--set): unknown key 'sweep.hybridgen.k_fixd'"}}) {
    const CmdResult r = run("validate " + qs + " --set " + set);
    if (std::string(set).rfind("h2o", 0) == 0) {  // h2o is in quickstart: accepted
      EXPECT_EQ(r.status, 0) << r.out;
      continue;
    }
    EXPECT_EQ(r.status, 2) << set << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << set << "\n" << r.out;
    EXPECT_EQ(r.out.find(":0:"), std::string::npos) << r.out;
  }
  const CmdResult absent = run("validate " + std::string(HG_SOURCE_DIR) + "/experiments/kv_ratio.yaml --set moe_lightning.micro_batches=2");
  EXPECT_EQ(absent.status, 2);
  EXPECT_NE(absent.out.find("strategy moe_lightning is not in"), std::string::npos) << absent.out;
  // A misspelt command gets the nearest one; --version answers.
  const CmdResult typo = run("valdate x.yaml");
  EXPECT_EQ(typo.status, 2);
  EXPECT_NE(typo.out.find("did you mean 'validate'"), std::string::npos) << typo.out;
  const CmdResult version = run("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_EQ(version.out.rfind(std::string("hgbench ") + HG_VERSION, 0), 0u) << version.out;
  // The CPU kernels' level from the environment: unknown, or one this CPU lacks.
  std::vector<std::pair<std::string, std::string>> env_cases = {
      {"HG_CPU_ISA=avx2", "HG_CPU_ISA=avx2: expected portable, avx512 or avx512_bf16"}};
  if (!cpu_supports(CpuIsa::kAvx512Bf16))
    env_cases.emplace_back("HG_CPU_ISA=avx512_bf16", "HG_CPU_ISA=avx512_bf16: this CPU does not support it");
  for (const auto& [env, what] : env_cases) {
    const CmdResult r = run("info --model synthetic:tiny-llama", env);
    EXPECT_EQ(r.status, 2) << env << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << env << "\n" << r.out;
    EXPECT_NE(r.out.find(what), std::string::npos) << r.out;
  }
}

bool numa_fallback_expected() {
  MemorySystem mem(TierConfig{});
  return mem.far_node() == mem.local_node();
}

TEST(Cli, BenchAndStrategyRunsOnSyntheticModel) {
  CmdResult r = run("bench --model synthetic:tiny-llama --context 16,64 --threads 1 --steps 2 --prefill 8 --kv f16");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("ratio"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prefill 8 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ratio range"), std::string::npos) << r.out;  // paired per-step references
  EXPECT_NE(r.out.find("1-stream"), std::string::npos) << r.out;     // and the one-stream reference
  EXPECT_NE(r.out.find("median of 3"), std::string::npos) << r.out;
  EXPECT_EQ(run("bench --model synthetic:tiny-llama --context 0").status, 2);
  // The strategies on the emulated accelerator: a row per strategy and context, HybridGen's record.
  r = run("bench --model synthetic:tiny-llama --strategy flexgen,moe_lightning,hybridgen --device emulated "
          "--context 40,72 --steps 2 --set hybridgen.gpu_kv_tokens=16");
  EXPECT_EQ(r.status, 0) << r.out;
  auto has_row = [&](const std::string& name, const std::string& ctx) {
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::istringstream words(line);
      std::string a, b;
      if (words >> a >> b && a == name && b == ctx) return true;
    }
    return false;
  };
  for (const char* name : {"flexgen", "moe_lightning", "hybridgen"})
    for (const char* ctx : {"40", "72"}) EXPECT_TRUE(has_row(name, ctx)) << name << " " << ctx << "\n" << r.out;
  EXPECT_NE(r.out.find("last step: K="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("link GB/s"), std::string::npos) << r.out;
  // InfiniGen calibrates on the prompt's attention: bench fills its cache by a real prefill, after
  // which layer 1 fetches speculatively (a cache filled by append() alone never calibrates and
  // loads every layer's full KV: fetched_tokens=0).
  r =
      run("bench --model synthetic:tiny-llama --strategy infinigen --device emulated --context 40 --steps 2 "
          "--set infinigen.full_layers=1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("filled by a prefill of 40 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("last step: fetched_tokens="), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("fetched_tokens=0\n"), std::string::npos) << r.out;
  r = run("bench --model synthetic:tiny-llama --strategy flexgen --device emulated --context 40 --steps 2 "
          "--clock modeled:h200-measured");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("MODELED on h200-measured"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[modeled, not measured]"), std::string::npos) << r.out;
  EXPECT_EQ(run("bench --model synthetic:tiny-llama --strategy flexgen --clock modeled:no-such-machine").status, 2);
  EXPECT_EQ(run("bench --model synthetic:tiny-llama --clock modeled:h200-measured").status, 2);
  r = run("generate --model synthetic:tiny-qwen2 --prompt-tokens 40 -n 4 --device emulated --strategy hybridgen "
          "--set hybridgen.gpu_kv_tokens=8 --step-stats --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step 3: K="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device emulated"), std::string::npos) << r.out;
  // V pages on `far`: on a one-node machine the run says that far is local memory.
  r = run("generate --model synthetic:tiny-qwen2 --prompt-tokens 40 -n 2 --device emulated --strategy hybridgen "
          "--set hybridgen.gpu_kv_tokens=8 --set hybridgen.placement=interleave --set hybridgen.page_tokens=4 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  if (numa_fallback_expected()) {
    EXPECT_NE(r.out.find("far tier falls back"), std::string::npos) << r.out;
  }
  EXPECT_EQ(run("generate --model synthetic:tiny-qwen2 --strategy h2o --set flexgen.overlap=false").status, 2);
  EXPECT_EQ(run("generate --model synthetic:tiny-qwen2 --device emulated --clock modeled:no-such-machine").status, 2);
  // export → a GGUF that generate loads (llama.cpp's conventions are checked in test_formats).
  const std::string gguf = test::temp_path("cli_export.gguf");
  r = run("export --model \"synthetic:tiny-llama?dtype=f16\" --out " + gguf);
  EXPECT_EQ(r.status, 0) << r.out;
  r = run("generate --model " + gguf + " --prompt-tokens 8 -n 4 --quiet");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("weights f16"), std::string::npos) << r.out;
}

// `tokenize` on a folder with tokenizer files and no model (no config.json) gives the ids the
// whole model directory gives; a folder with neither is one line naming what it expected.
TEST(Cli, TokenizeLoadsATokenizerOnlyFolder) {
  HG_REQUIRE_SHARED("models/stories260K-hf/tokenizer.model");
  const std::string d = test::temp_path("tok_only");
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  for (const char* f : {"tokenizer.model", "tokenizer_config.json"})
    std::filesystem::copy_file(test::shared_path(std::string("models/stories260K-hf/") + f), d + "/" + f);
  const CmdResult a = run("tokenize -m " + d + " -p 'Once upon a time' --ids");
  const CmdResult b = run("tokenize -m " + test::shared_path("models/stories260K-hf") + " -p 'Once upon a time' --ids");
  EXPECT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  std::filesystem::remove(d + "/tokenizer.model");
  const CmdResult c = run("tokenize -m " + d + " -p x");
  EXPECT_EQ(c.status, 2) << c.out;
  EXPECT_NE(c.out.find("no tokenizer (expected tokenizer.model, tokenizer.json"), std::string::npos) << c.out;
  std::filesystem::remove_all(d);
}

TEST(Cli, GenerateAndInfoOnRealModel) {
  HG_REQUIRE_SHARED("models/stories260K/stories260K.gguf");
  const std::string m = test::shared_path("models/stories260K/stories260K.gguf");
  CmdResult r = run("generate --model " + m + " -n 24 --threads 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Once upon a time, there was a little girl named Lily."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode: 23 tokens"), std::string::npos) << r.out;
  r = run("info --model " + test::shared_path("models/stories260K/stories260K.bin"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("architecture:   llama"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters:     260032"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace hg
