// The error catalogue (docs/errors.md): the entries no other suite covers, and a check that every
// test the catalogue names exists, so that the document and the suite cannot drift apart.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "baselines/registry.h"
#include "engine/core/atomic_file.h"
#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/decoder/host_estimate.h"
#include "engine/formats/formats.h"
#include "engine/formats/gguf.h"
#include "engine/runtime/memory.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"
#include "experiments/runner/recorder.h"
#include "experiments/runner/runner.h"
#include "experiments/runner/spec.h"
#include "experiments/runner/sweep.h"
#include "test_util.h"

namespace hg {
namespace {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// A GGUF v3 file with one tensor of ggml type 12 (Q4_K), which hgbench does not read.
TEST(Errors, UnsupportedTensorTypeNamesTheTensor) {
  std::string b = "GGUF";
  auto u32 = [&](uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); };
  u32(3), u64(1), u64(0);       // version, one tensor, no key-values
  u64(1), b += "w";             // name
  u32(1), u64(256), u32(12), u64(0);  // 1 dim of 256, type 12, offset 0
  b.resize((b.size() + 31) / 32 * 32, '\0');
  b.append(144, '\0');  // one Q4_K block
  const std::string p = test::temp_path("q4k.gguf");
  test::write_file(p, b);
  const std::string e = message_of([&] { GgufFile g(p); });
  EXPECT_NE(e.find(p + ": tensor 'w' has type ggml type 12 (supported: F32, F16, BF16, Q8_0)"), std::string::npos) << e;
}

TEST(Errors, StrategyRefusedOnTheCudaDevice) {
  for (auto& s : strategies()) {
    EXPECT_NO_THROW(check_strategy_device(s, DeviceKind::kEmulated)) << s.name;
    EXPECT_NO_THROW(check_strategy_device(s, DeviceKind::kCpu)) << s.name;
    // Every method runs on the cuda device; `null` (the harness's overhead probe) does not.
    EXPECT_EQ(s.runs_on_cuda, s.name != "null") << s.name;
  }
  std::string on;
  for (auto& s : strategies())
    if (s.runs_on_cuda) on += (on.empty() ? "" : ", ") + s.name;
  try {
    check_strategy_device(strategy_info("null"), DeviceKind::kCuda);
    ADD_FAILURE() << "null was accepted on the cuda device";
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()), "strategy null does not run on the cuda device yet (" + on + " do); use --device emulated");
  }
  EXPECT_NE(on.find("infinigen"), std::string::npos);
}

TEST(Errors, AbsentNumaNodeIsNamed) {
  TierConfig c;
  c.far_node = 4096;
  const std::string e = message_of([&] { MemorySystem m(c); });
  EXPECT_NE(e.find("far_node 4096 does not exist (this machine has NUMA nodes 0.."), std::string::npos) << e;
}

TEST(Errors, OutputDirectoryIsNeverOverwrittenNorFollowed) {
  const ExperimentSpec spec = parse_experiment("name: e\nmodels: [synthetic:tiny-llama]\nstrategies: [full]\n", "e.yaml");
  const fs::path d = fs::temp_directory_path() / ("hg_err_out_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "full");
  std::ofstream(d / "full" / "keep.txt") << "mine";
  std::string e = message_of([&] { ResultDir r((d / "full").string(), spec, false, false, ""); });
  EXPECT_NE(e.find("the output directory is not empty (--resume to continue it, --force to replace it)"),
            std::string::npos) << e;
  EXPECT_TRUE(fs::exists(d / "full" / "keep.txt"));
  fs::create_directories(d / "elsewhere");
  fs::create_directory_symlink(d / "elsewhere", d / "link");
  e = message_of([&] { ResultDir r((d / "link").string(), spec, false, true, ""); });
  EXPECT_NE(e.find("is a symbolic link; give a real directory"), std::string::npos) << e;
  EXPECT_TRUE(fs::is_empty(d / "elsewhere"));
  fs::remove_all(d);
}

// An experiment run in a child process: `yaml` in a fresh directory, interrupted with `signals`
// SIGINTs once rows.jsonl holds `rows` rows. Its exit status and output.
struct Interrupted {
  fs::path dir;
  std::string out, file, text;
  int status = -1;
};
Interrupted run_interrupted(const std::string& name, const std::string& yaml, int rows, int signals) {
  Interrupted r;
  r.dir = fs::temp_directory_path() / ("hg_err_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(r.dir);
  fs::create_directories(r.dir);
  r.file = (r.dir / "e.yaml").string();
  std::ofstream(r.file) << yaml;
  r.out = (r.dir / "out").string();
  const std::string log = (r.dir / "log.txt").string();
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1), dup2(fd, 2);
    execl(HG_BINARY, HG_BINARY, r.file.c_str(), "-o", r.out.c_str(), (char*)nullptr);
    _exit(127);
  }
  for (int i = 0; i < 6000; ++i) {
    std::ifstream in(r.out + "/rows.jsonl");
    const std::string all((std::istreambuf_iterator<char>(in)), {});
    if (std::count(all.begin(), all.end(), '\n') >= rows) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Each signal after the first once the last was acknowledged (two pending SIGINTs are one).
  for (int k = 0; k < signals; ++k) {
    kill(pid, SIGINT);
    for (int i = 0; k + 1 < signals && i < 2000; ++i) {
      std::ifstream lin(log);
      const std::string t((std::istreambuf_iterator<char>(lin)), {});
      if (t.find("Ctrl-C:") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  int st = 0;
  waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream lin(log);
  r.text.assign(std::istreambuf_iterator<char>(lin), {});
  return r;
}

// Ctrl-C: acknowledged at once; the current run finishes, the summary is written, exit 130, and
// --resume completes it.
TEST(Errors, InterruptedRunExits130AndResumes) {
  const Interrupted r = run_interrupted("int",
                                        "name: i\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full, flexgen]\n"
                                        "sweep:\n  prompt_tokens: [64, 96, 128, 160, 192, 224]\n  decode_tokens: [48]\n"
                                        "repeats: 3\n",
                                        2, 1);
  if (r.status == 0) GTEST_SKIP() << "the run finished before the signal arrived";
  EXPECT_EQ(r.status, 130) << r.text;
  EXPECT_NE(r.text.find("Ctrl-C: finishing the current run"), std::string::npos) << "acknowledged at once: " << r.text;
  EXPECT_NE(r.text.find("hgbench: interrupted after"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("continue with hgbench --resume " + r.out), std::string::npos) << r.text;
  EXPECT_TRUE(fs::exists(r.out + "/summary.csv"));
  const size_t kept = read_rows(r.out).size();
  EXPECT_LT(kept, 36u);
  std::string cmd = std::string(HG_BINARY) + " " + r.file + " --resume " + r.out + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  EXPECT_EQ(read_rows(r.out).size(), 36u);
  fs::remove_all(r.dir);
}

// A second Ctrl-C stops during a run and still writes the summary of the rows so far.
TEST(Errors, SecondInterruptStopsAtOnceWithTheSummary) {
  const Interrupted r = run_interrupted("int2",
                                        "name: i2\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full, flexgen]\n"
                                        "sweep:\n  prompt_tokens: [64, 128]\n  decode_tokens: [4000]\nrepeats: 3\n",
                                        1, 2);
  if (r.status == 0) GTEST_SKIP() << "the run finished before the signals arrived";
  EXPECT_EQ(r.status, 130) << r.text;
  EXPECT_NE(r.text.find("stopping now"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("stopped; "), std::string::npos) << r.text;
  EXPECT_TRUE(fs::exists(r.out + "/summary.csv")) << r.text;
  EXPECT_TRUE(fs::exists(r.out + "/table.txt")) << r.text;
  EXPECT_LT(read_rows(r.out).size(), 12u);
  fs::remove_all(r.dir);
}

// Numbers are parsed into their field's type without narrowing, a key is given once, and an
// experiment or profile is a regular file: each a one-line error naming the file and line.
TEST(Errors, NumbersDoNotNarrowKeysAreUniqueFilesAreRegular) {
  const std::string head = "name: x\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\n";
  for (auto [extra, says] :
       {std::pair{"repeats: 3000000000", "x.yaml:4: 'repeats' must be <= 2147483647"},
        {"warmup: 4294967296", "x.yaml:4: 'warmup' must be <= 2147483647"},
        {"sweep: {prompt_tokens: [3000000000]}", "x.yaml:4: 'prompt_tokens' must be <= 2147483647"},
        {"sweep: {gpu_kv_bytes: [99999999999999999999]}", "x.yaml:4: 'gpu_kv_bytes' must be <= 9223372036854775807"},
        {"name: y", "x.yaml:4: duplicate key 'name' (first at line 1)"},
        {"sweep: {batch: [1], batch: [2]}", "duplicate key 'sweep.batch'"},
        {"clock: modeled:/tmp", "x.yaml:4: /tmp: not a regular file"}}) {
    const std::string e = message_of([&] { (void)parse_experiment(head + extra + "\n", "x.yaml"); });
    EXPECT_NE(e.find(says), std::string::npos) << extra << ": " << e;
  }
  for (const char* f : {"/dev/zero", "/tmp"}) {
    const std::string e = message_of([&] { (void)load_experiment(f); });
    EXPECT_NE(e.find(std::string(f) + ": not a regular file"), std::string::npos) << e;
  }
}

// Paths and scripts: a name is one path component; --force replaces only a result directory;
// submit refuses a value that would start a shell line in its job script.
TEST(Errors, NamesForceAndSubmitValuesAreSafe) {
  const std::string head = "models: [\"synthetic:tiny-llama\"]\nstrategies: [full]\n";
  for (const char* name : {"../escape", "a/b", ".."}) {
    const std::string e = message_of([&] { (void)parse_experiment("name: \"" + std::string(name) + "\"\n" + head, "n.yaml"); });
    EXPECT_NE(e.find("n.yaml:1: name '" + std::string(name) + "' must be letters"), std::string::npos) << e;
  }
  const fs::path d = fs::temp_directory_path() / ("hg_err_force_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "precious");
  std::ofstream(d / "precious" / "thesis.tex") << "keep me";
  const ExperimentSpec spec = parse_experiment("name: f\n" + head, "f.yaml");
  const std::string e = message_of([&] { ResultDir r((d / "precious").string(), spec, false, true, ""); });
  EXPECT_NE(e.find("not an hgbench result directory"), std::string::npos) << e;
  EXPECT_TRUE(fs::exists(d / "precious" / "thesis.tex"));
  { ResultDir r((d / "result").string(), spec, false, false, ""); }  // a result directory: replaced
  EXPECT_NO_THROW({ ResultDir r((d / "result").string(), spec, false, true, ""); });
  const std::string f = (d / "s.yaml").string();
  std::ofstream(f) << "name: s\n" << head << "sweep:\n  prompt_tokens: [8, 16]\n";
  const std::string cmd = std::string(HG_BINARY) + " submit " + f + " --shards 2 --dry-run --gres $'gpu:1\\nrm -rf ~' -o " +
                          (d / "out").string() + " > " + (d / "log").string() + " 2>&1";
  const int st = std::system(("bash -c " + std::string("\"") + cmd + "\"").c_str());
  EXPECT_EQ(WEXITSTATUS(st), 2);
  std::ifstream lg(d / "log");
  const std::string text((std::istreambuf_iterator<char>(lg)), {});
  EXPECT_NE(text.find("--gres"), std::string::npos) << text;
  EXPECT_EQ(text.find("#SBATCH"), std::string::npos) << text;
  // A newline in the output directory (from -o or the file's `output:`) would end the #SBATCH
  // --output line and a comment: refused, and no script is printed.
  const std::string cmd2 = std::string(HG_BINARY) + " submit " + f + " --shards 1 --dry-run -o $'" +
                           (d / "o").string() + "\ntouch " + (d / "PWNED").string() + "\n#' > " +
                           (d / "log2").string() + " 2>&1";
  const int st2 = std::system(("bash -c " + std::string("\"") + cmd2 + "\"").c_str());
  EXPECT_EQ(WEXITSTATUS(st2), 2);
  std::ifstream lg2(d / "log2");
  const std::string text2((std::istreambuf_iterator<char>(lg2)), {});
  EXPECT_NE(text2.find("the output directory"), std::string::npos) << text2;
  EXPECT_EQ(text2.find("#SBATCH"), std::string::npos) << text2;
  EXPECT_FALSE(fs::exists(d / "PWNED"));
  fs::remove_all(d);
}

// One writer per result directory, named by its normal path: `X/nope/../R` is R (not empty: refused
// without --resume or --force), and a second writer while the first holds R is refused naming it.
TEST(Errors, OneWriterPerResultDirectory) {
  const fs::path d = fs::temp_directory_path() / ("hg_err_lock_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const ExperimentSpec spec =
      parse_experiment("name: f\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\n", "f.yaml");
  {
    ResultDir first((d / "R").string(), spec, false, false, "");
    std::string e = message_of([&] { ResultDir again((d / "R").string(), spec, true, false, ""); });
    EXPECT_NE(e.find("another hgbench (pid " + std::to_string(getpid()) + ")"), std::string::npos) << e;
    e = message_of([&] { ResultDir forced((d / "R").string(), spec, false, true, ""); });
    EXPECT_NE(e.find("another hgbench"), std::string::npos) << e;
    EXPECT_TRUE(fs::exists(d / "R" / "config.yaml"));  // the holder's files untouched
  }
  const std::string e =
      message_of([&] { ResultDir dotted((d / "nope" / ".." / "R").string(), spec, false, false, ""); });
  EXPECT_NE(e.find("R: the output directory is not empty"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "nope"));
  EXPECT_NO_THROW(
      { ResultDir resumed((d / "R" / "").string(), spec, true, false, ""); });  // released, and R/ is R
  fs::remove_all(d);
}

TEST(Errors, SweepLimitIsAnError) {
  std::string y = "name: big\nmodels: [synthetic:tiny-llama]\nstrategies: [full]\nsweep:\n";
  for (const char* axis : {"prompt_tokens", "decode_tokens", "batch"}) {
    y += std::string("  ") + axis + ": [";
    for (int i = 1; i <= 60; ++i) y += std::to_string(i) + (i < 60 ? ", " : "]\n");
  }
  const ExperimentSpec s = parse_experiment(y, "big.yaml");
  const std::string e = message_of([&] { (void)expand(s); });
  EXPECT_NE(e.find("big.yaml: the sweep expands to more than 100000 points"), std::string::npos) << e;
}

// A point whose size this machine cannot hold is an out_of_memory row before anything of its size
// is allocated (the estimate: engine/decoder/host_estimate.h); the sweep goes on. Batch 10^9 and a
// prompt of 2^31 − 1 tokens each come back in well under a second.
TEST(Errors, APointBeyondThisMachinesMemoryIsAnOutOfMemoryRow) {
  const std::string y =
      "name: big\nmodels: [\"synthetic:llama-3.1-8b?dtype=f16\"]\nstrategies: [flexgen, hybridgen]\nsweep:\n"
      "  prompt_tokens: [2147483647, 2048]\n  batch: [1000000000, 1]\n  decode_tokens: [4]\ndevice: "
      "emulated\n"
      "clock: modeled:machine-a\nexecute: dry\n";
  ExperimentSpec spec = parse_experiment(y, "big.yaml");
  Runner run(spec);
  int oom = 0, ok = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Point& p : expand(spec))
    for (auto& e : spec.strategies)
      run.run(p, e, {}, [&](Json r) {
        const bool small = p.prompt_tokens == 2048 && p.batch == 1;
        if (small) {
          ok += r["status"] == "ok";
          return;
        }
        ASSERT_EQ(r["status"], "failed") << r.dump();
        EXPECT_EQ(r["error"], "out_of_memory") << r.dump();
        EXPECT_NE(r["reason"].get<std::string>().find("needs an estimated"), std::string::npos) << r.dump();
        ++oom;
      });
  EXPECT_EQ(oom, 6);
  EXPECT_EQ(ok, 2);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  // The estimate grows with every factor and saturates instead of wrapping.
  const HParams hp = load_model("synthetic:llama-3.1-8b?dtype=f16", LoadOptions{std::nullopt, true}).hp;
  const int64_t a = generation_host_estimate(hp, 2048, 4, 1, 2048, true).bytes;
  EXPECT_GT(generation_host_estimate(hp, 4096, 4, 1, 4096, true).bytes, a);
  EXPECT_GT(generation_host_estimate(hp, 2048, 4, 2, 4096, true).bytes, a);
  EXPECT_GT(generation_host_estimate(hp, 2048, 4, 1, 2048, false).bytes, a);
  EXPECT_GT(generation_host_estimate(hp, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, false).bytes, int64_t(1)
                                                                                                       << 60);
}

// Files in model and result directories are opened only when regular and within a size cap: a
// FIFO, /dev/zero, a directory or a link loop is one line naming the file, never a block, a read
// without end or an internal error; a special id from config.json is checked against the vocabulary
// before the tokenizer library sees it.
TEST(Errors, OnlyRegularFilesAreReadFromModelAndResultDirectories) {
  const fs::path d = test::temp_path("special_files");
  fs::remove_all(d);
  fs::create_directories(d);
  const auto says = [](const std::function<void()>& f) { return message_of(f); };
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", d / "zero");
  fs::create_directory(d / "dir");
  fs::create_symlink(d / "loop_b", d / "loop_a");
  fs::create_symlink(d / "loop_a", d / "loop_b");
  for (auto [name, what] : {std::pair{"fifo", "a FIFO"},
                            {"zero", "a character device"},
                            {"dir", "a directory"},
                            {"loop_a", "Too many levels of symbolic links"}}) {
    const std::string p = (d / name).string();
    EXPECT_NE(says([&] { (void)read_regular_file(p); }).find(p + ": "), std::string::npos) << name;
    EXPECT_NE(says([&] { (void)read_regular_file(p); }).find(what), std::string::npos) << name;
    EXPECT_NE(says([&] { MappedFile m(p); }).find(what), std::string::npos) << name;
  }
  { std::ofstream(d / "big") << std::string(100, 'x'); }
  EXPECT_NE(says([&] { (void)read_regular_file((d / "big").string(), 10); }).find("above the 10 bytes"),
            std::string::npos);
  // A model directory whose config.json is each of them; a result directory whose rows are.
  for (const char* name : {"fifo", "zero", "dir", "loop_a"}) {
    const fs::path m = d / ("model_" + std::string(name));
    fs::create_directory(m);
    fs::create_symlink(d / name, m / "config.json");
    const std::string e = says([&] { (void)load_model(m.string()); });
    EXPECT_NE(e.find((m / "config.json").string()), std::string::npos) << name << ": " << e;
    const fs::path r = d / ("result_" + std::string(name));
    fs::create_directory(r);
    fs::create_symlink(d / name, r / "rows.jsonl");
    const std::string re = says([&] { (void)read_rows(r.string()); });
    EXPECT_NE(re.find((r / "rows.jsonl").string()), std::string::npos) << name << ": " << re;
  }
  // bos_token_id far beyond the vocabulary (a library CHECK would abort the process).
  if (fs::exists(test::shared_path("models/stories260K-hf"))) {
    const fs::path m = d / "bos";
    fs::create_directory(m);
    for (auto& e : fs::directory_iterator(test::shared_path("models/stories260K-hf")))
      if (e.path().filename() != "config.json") fs::create_symlink(e.path(), m / e.path().filename());
    std::ifstream in(test::shared_path("models/stories260K-hf/config.json"));
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["bos_token_id"] = 100000000;
    std::ofstream(m / "config.json") << cfg.dump();
    EXPECT_NE(says([&] { (void)load_model(m.string()); }).find("bos_token_id 100000000 is not a token"),
              std::string::npos);
  }
  fs::remove_all(d);
}

// Inputs the fuzzers found (scripts/fuzz), written here by the tests themselves.

// llama2.c header with vocab_size INT32_MIN: its sign was negated before the range check (UB).
TEST(FuzzRegressions, Llama2cVocabSizeIntMinIsAnError) {
  const fs::path d = fs::temp_directory_path() / ("hg_fz_l2c_" + std::to_string(getpid()));
  fs::create_directories(d);
  const int32_t h[7] = {64, 128, 2, 4, 2, INT32_MIN, 128};
  test::write_file((d / "m.bin").string(), std::string(reinterpret_cast<const char*>(h), sizeof h));
  const std::string e = message_of([&] { (void)load_model("llama2c:" + (d / "m.bin").string()); });
  EXPECT_NE(e.find("header field vocab_size = -2147483648 is invalid"), std::string::npos) << e;
  fs::remove_all(d);
}

// llama2.c header fields near their limit: the implied file size overflowed 64 bits (UB) before it
// was compared with the file's.
TEST(FuzzRegressions, Llama2cHugeHeaderIsAnErrorWithoutOverflow) {
  const fs::path d = fs::temp_directory_path() / ("hg_fz_l2c2_" + std::to_string(getpid()));
  fs::create_directories(d);
  const int32_t h[7] = {1 << 24, 1 << 24, 1 << 24, 1 << 20, 1 << 20, 1 << 24, 1 << 24};
  test::write_file((d / "m.bin").string(), std::string(reinterpret_cast<const char*>(h), sizeof h));
  const std::string e = message_of([&] { (void)load_model("llama2c:" + (d / "m.bin").string()); });
  EXPECT_NE(e.find("m.bin"), std::string::npos) << e;
  fs::remove_all(d);
}

// A YAML key that is a list ([a]: 1) threw yaml-cpp's conversion exception out of the parser.
TEST(FuzzRegressions, NonScalarYamlKeyIsAnError) {
  const std::string e = message_of([] { (void)parse_experiment("name: k\n[a, b]: 1\n", "k.yaml"); });
  EXPECT_NE(e.find("k.yaml:2: a key in the document must be a plain name"), std::string::npos) << e;
}

// A SentencePiece-style vocabulary whose piece looks like a byte piece but is not hex (<0xZZ>) made
// std::stoi throw out of the tokenizer (and <0x-1> would have indexed byte -1).
TEST(FuzzRegressions, ByteLikePiecesThatAreNotHexAreOrdinaryPieces) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<0xZZ>", "<0x-1>", "<0x41>", "a"};
  auto t = make_spm_bpe_tokenizer(pieces, {}, {2, 3, 3, 1, 1, 6, 1}, false);
  EXPECT_EQ(t->encode("A"), (std::vector<int32_t>{5}));
  EXPECT_EQ(t->encode("a"), (std::vector<int32_t>{6}));
}

// tokenizer.json whose fields have unexpected JSON types (a number for the document, a string for
// an added token's id) threw nlohmann's type_error out of the loader.
TEST(FuzzRegressions, TokenizerJsonWithWrongTypesIsAnError) {
  const std::string p = test::temp_path("bad_tokenizer.json");
  for (const std::string& text :
       {std::string("7"), std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": "x"}]})"),
        std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [[1, 2]]}})")}) {
    test::write_file(p, text);
    const std::string e = message_of([&] { (void)load_hf_tokenizer_json(p)->encode("a"); });
    EXPECT_NE(e.find(p), std::string::npos) << text << " → " << e;
  }
  // A Split pre-tokenizer without a regex object: GPT-2's split, as for a ByteLevel one.
  test::write_file(p, R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Split", "pattern": 3}})");
  EXPECT_NO_THROW((void)load_hf_tokenizer_json(p));
}

// `synthetic:…?layers=100000` was not capped (files cap at 1024) and allocated its weights before any
// check: the cap is the files' cap, and weights beyond the machine's memory are an out-of-memory error.
TEST(FuzzRegressions, SyntheticLayersAreCappedAndTheirWeightsCheckedBeforeAllocation) {
  EXPECT_NE(message_of([] { (void)load_model("synthetic:stories110m?layers=100000"); })
                .find("synthetic:stories110m: layer count 100000 is above the supported maximum 1024"),
            std::string::npos);
  const int64_t avail = host_memory_available();
  if (avail < 0 || avail > int64_t(800e9)) GTEST_SKIP() << "this machine may hold 1000 layers of Llama-3.1-8B";
  try {
    (void)load_model("synthetic:llama-3.1-8b?layers=1000");
    ADD_FAILURE() << "1000 layers of Llama-3.1-8B loaded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("needs an estimated 876.7 GB of host memory (1000 layers of weights)"),
              std::string::npos)
        << e.what();
  }
  LoadOptions phantom;  // a dry run's phantom weights take no memory: no check
  phantom.phantom_weights = true;
  EXPECT_NO_THROW((void)load_model("synthetic:llama-3.1-8b?layers=1000", phantom));
}

// A tiktoken file of one line with rank 16000000 built a vocabulary of 16M empty tokens (a 10 s
// timeout under the fuzzer); ranks far beyond the file's entries are an error.
TEST(FuzzRegressions, TiktokenRankFarBeyondTheEntriesIsAnError) {
  const std::string p = test::temp_path("sparse.tiktoken");
  test::write_file(p, "YQ== 0\nYg== 16000000\n");
  const std::string e = message_of([&] { (void)load_tiktoken(p, PreSplit::kQwen2); });
  EXPECT_NE(e.find(p + ":2: rank 16000000 is far beyond the file's 2 entries"), std::string::npos) << e;
}

// A model name that is not UTF-8 made the point id's JSON text throw mid-expansion; such strings
// now become U+FFFD in ids and rows.
TEST(FuzzRegressions, AnExperimentIsOneDocumentOfUtf8TextAndOutputIsAPath) {
  // Bytes that are not UTF-8, NUL and other control bytes: the line and column, not a copy in config.yaml.
  for (auto [y, says] :
       {std::pair<std::string, std::string>{"name: u\nmodels: [\"synthetic:tiny-llama\xf8\"]\n",
                                            "u.yaml:2: column 31: byte 0xf8 is not UTF-8"},
        {std::string("name: u\nmodels: [\"synthetic:tiny\0-llama\"]\n", 36),
         "u.yaml:2: column 25: control byte 0x00"},
        {"name: u\nmodels: [\"a\xc0\xaf"
         "b\"]\n",
         "byte 0xc0 is not UTF-8"},  // an overlong '/'
        {"name: u\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\n---\nname: v\n",
         "u.yaml:4: a second YAML document"},
        // yaml-cpp's LoadAll never returns on a stray ',' (a fuzzer timeout): one line, promptly.
        {",", "u.yaml:1: YAML syntax error: no document can start here"},
        {"# an experiment\n\n, gpu_kv_tokens: 32}}\nname: u\n", "u.yaml:3: YAML syntax error"},
        {"name: u\n...\n,\n", "u.yaml:3: a second YAML document"},
        {"name: u\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\noutput: 5\n",
         "u.yaml:4: 'output' must be a path, got 5"},
        {"name: u\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\noutput: true\n",
         "'output' must be a path, got true"}}) {
    const std::string e = message_of([&] { (void)parse_experiment(y, "u.yaml"); });
    EXPECT_NE(e.find(says), std::string::npos) << "'" << e << "'";
  }
  EXPECT_NE(message_of([&] {
              (void)parse_experiment("name: u\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\n",
                                     "u.yaml",
                                     {"output=a\x01"
                                      "b"});
            }).find("--set 'output=a\\x01b': control byte 0x01"),
            std::string::npos);
  EXPECT_NO_THROW(
      (void)parse_experiment("name: u\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\noutput: "
                             "\"5\"\ndescription: naïve — 東京\n",
                             "u.yaml"));
  // A row whose text is not UTF-8 (a failure's reason can quote a file's bytes) is still written and read
  // back.
  const std::string y = "name: u\nmodels: [\"synthetic:tiny-llama\"]\nstrategies: [full]\n";
  const ExperimentSpec s = parse_experiment(y, "u.yaml");
  std::vector<Point> pts;
  ASSERT_NO_THROW(pts = expand(s));
  ASSERT_EQ(pts.size(), 1u);
  EXPECT_EQ(pts[0].id, expand(s)[0].id);
  const fs::path d = fs::temp_directory_path() / ("hg_fz_utf_" + std::to_string(getpid()));
  fs::remove_all(d);
  {
    ResultDir out(d.string(), s, false, false, "");
    nlohmann::ordered_json row = ResultRow::head("u", pts[0].id, 0, "full", "full", 0, false);
    row["reason"] = pts[0].model + "\xf8";
    ASSERT_NO_THROW(out.append(row));
  }
  EXPECT_EQ(read_rows(d.string()).size(), 1u);
  fs::remove_all(d);
}

// Every test docs/errors.md names is a test of this binary, so an entry
// cannot point at a test that was renamed or removed.
// Summaries, tables, profiles and merged rows are whole or keep their previous version: a write
// that fails (here: past the file-size limit, as a full disk) or is abandoned leaves the old file
// and no temporary; a destination in a missing directory is an input error naming it.
TEST(AtomicFiles, AFailedOrAbandonedWriteKeepsThePreviousFile) {
  const fs::path d = fs::temp_directory_path() / ("hg_atomic_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string p = (d / "table.txt").string();
  write_file_atomic(p, "old\n");
  {
    AtomicFile f(p);
    f.write("new, never committed\n");
  }
  auto slurp = [&] {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  EXPECT_EQ(slurp(), "old\n");
  const pid_t child = fork();
  if (child == 0) {  // a 4 KiB file-size limit: the 1 MiB write fails in commit()
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &lim);
    try {
      write_file_atomic(p, std::string(1 << 20, 'x'));
    } catch (const IoError& e) {
      _exit(std::string(e.what()).find(p + ": write failed") == std::string::npos ? 3 : 0);
    }
    _exit(4);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(slurp(), "old\n");
  size_t files = 0;
  for (auto& e : fs::directory_iterator(d)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "a temporary was left behind";
  write_file_atomic(p, "new\n");
  EXPECT_EQ(slurp(), "new\n");
  EXPECT_THROW(write_file_atomic((d / "no" / "such" / "x").string(), "x"), InputError);
  fs::remove_all(d);
}

TEST(Errors, CatalogueNamesExistingTests) {
  std::ifstream in(std::string(HG_SOURCE_DIR) + "/docs/errors.md");
  ASSERT_TRUE(in) << "docs/errors.md is missing";
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  std::set<std::string> have;
  const auto* ut = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < ut->total_test_suite_count(); ++i) {
    const auto* s = ut->GetTestSuite(i);
    for (int j = 0; j < s->total_test_count(); ++j) {
      std::string suite = s->name(), name = s->GetTestInfo(j)->name();
      // Parameterised suites appear as Prefix/Suite.Name/param: the catalogue names Suite.Name.
      if (auto slash = suite.find('/'); slash != std::string::npos) suite = suite.substr(slash + 1);
      if (auto slash = name.find('/'); slash != std::string::npos) name = name.substr(0, slash);
      have.insert(suite + "." + name);
    }
  }
  const std::regex ref("`([A-Z][A-Za-z0-9]*\\.[A-Z][A-Za-z0-9]*)`");
  int named = 0;
  for (std::sregex_iterator it(doc.begin(), doc.end(), ref), end; it != end; ++it) {
    ++named;
    EXPECT_TRUE(have.count((*it)[1])) << "docs/errors.md names " << (*it)[1] << ", which is not a test";
  }
  EXPECT_GE(named, 15);
}

}  // namespace
}  // namespace hg
