// `hgbench eval`: PIQA, OpenBookQA, COPA and RTE through KV strategies, as an accuracy experiment
// built from the options (the same Runner, rows and summary as `hgbench experiments/accuracy.yaml`);
// `--write-requests` writes lm-eval 0.4's requests as JSONL.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "baselines/registry.h"
#include "datasets/tasks.h"
#include "engine/cli/cli.h"
#include "experiments/runner/sweep.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/thread_pool.h"

namespace hg::cli {
namespace {

std::vector<std::string> comma_list(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= s.size()) {
    const size_t c = s.find(',', p);
    const std::string x = s.substr(p, c == std::string::npos ? std::string::npos : c - p);
    if (!x.empty()) out.push_back(x);
    if (c == std::string::npos) break;
    p = c + 1;
  }
  return out;
}

}  // namespace

int cmd_eval(const std::vector<std::string>& args) {
  const std::string cmd = "eval";
  CLI::App app{"Scores multiple-choice tasks (lm-eval 0.4 requests, acc and acc_norm with standard errors) through KV "
               "strategies, with each strategy's fidelity against full attention. Rows, summary.csv, table.txt and "
               "per-item records go to a result directory.",
               cmd};
  std::string model, tasks = "piqa,openbookqa,copa,rte", strategies = "full", context = "prefill", data_dir, output,
                     device = "auto", write_requests, reference = "full",
                     lm_eval = "0.4.9", chat_template = "none";
  std::vector<std::string> sets;
  int shots = 3, limit = 0, threads = hardware_threads();
  double budget = 0.2;
  uint64_t seed = 1234;
  bool add_bos = false, force = false;
  app.add_option("-m,--model", model,
                 "model (GGUF, HF directory, llama2.c .bin, synthetic:<preset>); default: ../shared/models/stories260K");
  app.add_option("--task", tasks, "comma-separated: piqa, openbookqa, copa, rte")->capture_default_str();
  app.add_option("--shots", shots, "few-shot examples per item")->capture_default_str();
  app.add_option("--limit", limit, "first N items of each task (0: all)")->capture_default_str();
  app.add_option("--strategy", strategies, "comma-separated KV strategies (see `hgbench strategies`)")->capture_default_str();
  app.add_option("--set", sets, "strategy parameter S.P=V (repeatable), e.g. h2o.heavy_ratio=0.05");
  app.add_option("--budget", budget,
                 "attended fraction of the context for every budgeted strategy given no --set (its `budget`; 0: each "
                 "strategy's own defaults, which may not compress a few-shot prompt)")
      ->capture_default_str();
  app.add_option("--context", context,
                 "prefill: prefill the context, score the choices as decode steps; stream: every token a decode step")
      ->capture_default_str();
  app.add_option("--data-dir", data_dir, "dataset directory (default: $HG_DATA_DIR, else ../shared/datasets)");
  app.add_option("--fewshot-seed", seed, "seed of the few-shot sampler (lm-eval's default 1234)")->capture_default_str();
  app.add_flag("--add-bos", add_bos, "prepend BOS to every context (lm-eval 0.4.9's HF models add none)");
  app.add_option("--lm-eval", lm_eval, "the lm-eval version whose request rules to follow: 0.3, 0.4.9 or 0.4.10")
      ->capture_default_str();
  app.add_option("--reference", reference, "fidelity reference strategy, or none")->capture_default_str();
  app.add_option("--chat-template", chat_template,
                 "each context as one user turn of a chat template: none, auto (the model's own), llama3 or chatml")
      ->capture_default_str();
  app.add_option("--device", device, "auto (cuda when a device is visible, else the emulated accelerator), emulated or cuda")
      ->capture_default_str();
  app.add_option("-t,--threads", threads, "CPU threads");
  app.add_option("--output,-o", output, "result directory (default: results/eval-<time>-<pid>, new per run)");
  app.add_flag("--force", force, "replace a non-empty output directory");
  app.add_option("--write-requests", write_requests,
                 "write every request as JSONL (task, index, context, choices, gold); without --model, only that");
  if (int rc = parse_cli(app, cmd, args); rc >= 0) return rc;
  check_threads(threads, "eval");
  set_num_threads(threads);
  const std::vector<std::string> task_list = comma_list(tasks), strat_list = comma_list(strategies);
  if (task_list.empty()) input_error("eval: --task is empty (give piqa, openbookqa, copa or rte)");

  if (!write_requests.empty()) {
    const std::string dir = resolve_data_dir(data_dir);
    std::ofstream out(write_requests, std::ios::binary);
    if (!out) input_error("eval: --write-requests {}: cannot write", write_requests);
    size_t n = 0;
    for (auto& t : task_list)
      for (auto& r : build_requests(load_task(t, dir), shots, limit, seed, lm_eval_rules(lm_eval, "eval --lm-eval"))) out << json_text(request_json(r)) << "\n", ++n;
    if (!out.flush()) input_error("eval: --write-requests {}: write failed", write_requests);
    fmt::print("wrote {} requests ({}, {} shots) to {}\n", n, tasks, shots, write_requests);
    if (model.empty()) return 0;
  }
  if (model.empty()) {
    const std::string d = std::string(HG_SOURCE_DIR) + "/../shared/models/stories260K/stories260K.gguf";
    if (!std::filesystem::exists(d)) input_error("eval: give --model (the default ../shared/models/stories260K is absent)");
    model = std::filesystem::weakly_canonical(d).string();
  }

  YAML::Node y;
  y["name"] = "eval";
  y["description"] = "hgbench eval " + tasks;
  y["models"].push_back(model);
  if (!(budget >= 0 && budget <= 1)) input_error("eval: --budget {} (expected a fraction in [0, 1])", budget);
  for (auto& s : strat_list) {
    if (budget > 0 && strategy_info(s).budgeted) {
      YAML::Node e;
      e["name"] = s;
      e["params"]["budget"] = budget;
      y["strategies"].push_back(e);
    } else {
      y["strategies"].push_back(s);
    }
  }
  for (auto& [st, kv] : strategy_sets(sets, cmd, strat_list))
    for (size_t i = 0; i < strat_list.size(); ++i)
      if (strat_list[i] == st) {
        YAML::Node e;
        e["name"] = st;
        for (auto& [k, v] : kv) e["params"][k] = v;
        y["strategies"][i] = e;
      }
  y["eval"]["tasks"] = task_list;
  y["eval"]["shots"] = shots;
  y["eval"]["limit"] = limit;
  y["eval"]["context"] = context;
  if (!data_dir.empty()) y["eval"]["data_dir"] = data_dir;
  y["eval"]["fewshot_seed"] = seed;
  y["eval"]["lm_eval"] = lm_eval;
  if (add_bos) y["eval"]["add_bos"] = "always";
  y["eval"]["reference"] = reference;
  y["eval"]["chat_template"] = chat_template;
  y["device"] = device;
  y["execute"] = "real";
  y["clock"] = "measured";
  // Two runs started in the same second get their own directories.
  if (output.empty())
    output = fmt::format("results/eval-{:%Y%m%d-%H%M%S}-{}", fmt::localtime(std::time(nullptr)), ::getpid());
  SweepOptions so;
  so.output = output;
  so.force = force;
  return run_sweep(parse_experiment(YAML::Dump(y), "hgbench eval"), so);
}

}  // namespace hg::cli
