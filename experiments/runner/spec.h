// Experiment files: a strict YAML schema (unknown keys name file:line and the nearest valid key),
// `--set key=value` overrides on any key, and the Cartesian expansion into points with stable ids.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "datasets/needle.h"
#include "datasets/tasks.h"

namespace hg {

// One entry of `strategies`: a registered strategy, its parameters and the label rows carry.
struct StrategyEntry {
  std::string name;
  std::string label;  // defaults to name; unique within a file
  std::map<std::string, std::string> params;
  // This entry's accelerator KV budget as a share of each point's whole KV, in place of the
  // point's (0: the point's): e.g. `full` at 1, the "it fits" regime beside the offloading methods.
  double gpu_kv_share = 0;
};

// An accuracy experiment's `eval` block: its points are model × task × sweep, each scored on the
// task's items instead of timed on generated tokens.
struct EvalSpec {
  bool enabled = false;
  std::vector<std::string> tasks;  // piqa, openbookqa, copa, rte
  int shots = 3;
  int limit = 0;                   // items per task (0: all)
  std::string context = "prefill"; // prefill | stream
  std::string data_dir;            // "" → --data-dir / HG_DATA_DIR / ../shared/datasets
  // The essay haystack of RULER's essay tasks: a text file, or JSON with "text" (RULER's
  // PaulGrahamEssays.json); "" → PIQA's train split in the data directory (datasets/needle.h).
  std::string haystack;
  // RULER's qa_1 and qa_2 read a user's SQuAD v2 and HotpotQA JSON (datasets/needle.h).
  std::string squad, hotpotqa;
  uint64_t fewshot_seed = 1234;
  LmEvalRules lm_eval;             // the lm-eval version's request rules (eval.lm_eval, copa_spacing, add_bos)
  std::string reference = "full";  // fidelity against this strategy ("none": no fidelity)
  // Retrieval tasks: query_aware prefills the whole prompt, question included; query_agnostic
  // (kvpress's default) prefills the context and feeds the question as decode steps, so that a
  // strategy compresses the context before it sees what will be asked.
  std::string protocol = "query_aware";
  // none | auto (the model's own) | llama3 | chatml: each prompt as one user turn of the template
  // and the assistant's generation prompt (engine/tokenizer/chat_template.h).
  std::string chat_template = "none";
};

// A retrieval task's point without needle_tokens / depth in its sweep.
constexpr int kNeedleTokensDefault = 4096, kNeedleDepthDefault = 50, kNeedleItemsDefault = 50;

struct ExperimentSpec {
  std::string file;  // where it came from ("" for specs built in code)
  std::string name, description;
  std::vector<std::string> models;
  std::vector<StrategyEntry> strategies;
  std::string baseline;  // a label of `strategies`; every time is normalised to it
  // Sweep axes in file order: key → values as strings (numbers printed plainly).
  std::vector<std::pair<std::string, std::vector<std::string>>> sweep;
  std::string device = "emulated";  // emulated | cuda | auto
  std::string clock = "measured";   // measured | modeled | modeled:<platform>
  std::string execute = "real";     // real | dry | auto (resolve_execute)
  // off | <platform>: the emulated accelerator of real runs spends that profile's measured launch,
  // copy-call and synchronisation costs as real time (device_costs_of()).
  std::string device_costs = "off";
  int repeats = 1;
  int warmup = 0;
  uint64_t seed = 1;
  std::string output;     // result directory ("" → results/<name>)
  EvalSpec eval;
  YAML::Node effective;   // the document after overrides, as run
};

// One point of the sweep: everything but the strategy. Rows are point × strategy × repeat.
struct Point {
  int index = 0;                // position in the expansion
  std::string id;               // hash of `values` (stable across runs, files and machines)
  std::string model;
  int prompt_tokens = 1024;
  int decode_tokens = 16;
  int batch = 1;
  std::string placement;        // "" → the strategies' defaults
  int64_t gpu_memory_bytes = 0; // 0 → the platform's (dry) or the device's
  int64_t gpu_kv_bytes = 0;     // KV every strategy may hold on the accelerator at once; 0: no limit
  // The same budget as a share of the point's whole KV (every layer, batch × (prompt + decode)
  // tokens, 16-bit elements), resolved per point when the model's shape is known; 0: not set.
  double gpu_kv_share = 0;
  std::string platform;         // "" with a measured clock
  // Accuracy points (spec.eval.enabled).
  std::string task;
  int shots = 0, limit = 0;
  std::string context;
  int needle_tokens = 0;  // retrieval tasks: prompt length in tokens (0: not one)
  int depth = -1;         // retrieval tasks: the needle's depth in percent (-1: not one)
  // Strategy parameters swept as `strategy.param`: strategy name → param → value.
  std::map<std::string, std::map<std::string, std::string>> strategy_params;
  nlohmann::ordered_json values;  // the effective point as recorded in rows
};

// One sweep axis. The table (sweep_axes()) is where an axis lives: how a value is checked, where
// it goes in a Point, how the point records it (and so summary.csv's column of that name). A new
// axis is an entry there and, when it is a new kind of setting, a Point field and its use.
struct SweepAxis {
  std::string name;
  bool timing = true;     // an axis of performance experiments
  bool accuracy = false;  // an axis of accuracy (eval) experiments
  // Checks one value (the experiment's strategies already parsed); returns its canonical text.
  std::function<std::string(const ExperimentSpec&, const std::string& file, const YAML::Node&)> parse;
  // Sets the value on a point.
  std::function<void(Point&, const std::string&, const ExperimentSpec&)> apply;
  // Writes the point's value into its recorded values; unset for axes that are strategy
  // parameters (recorded under strategy_params).
  std::function<void(nlohmann::ordered_json&, const Point&)> record;
  std::string csv_default;  // summary.csv's cell when a row's point does not record the axis
};
// In the order points record them.
const std::vector<SweepAxis>& sweep_axes();
const SweepAxis* sweep_axis(const std::string& name);

// Loads and validates FILE, applying `sets` ("a.b=value", value parsed as YAML) first.
ExperimentSpec load_experiment(const std::string& file, const std::vector<std::string>& sets = {});
// The same from YAML text (tests); `file` names it in errors.
ExperimentSpec parse_experiment(const std::string& yaml, const std::string& file, const std::vector<std::string>& sets = {});

// The Cartesian product of models × sweep axes, in file order (the last axis varies fastest).
std::vector<Point> expand(const ExperimentSpec& spec);

// `execute: auto` becomes real on a CUDA device (device cuda, clock measured) or dry without one
// (device emulated, the file's modeled clock); returns the line saying which ("" when not auto).
std::string resolve_execute(ExperimentSpec& spec, bool have_gpu);

// The keys `sweep` accepts besides `strategy.param`.
const std::vector<std::string>& sweep_keys();

// FNV-1a, 64 bits: the hash of point ids and reference files.
uint64_t fnv1a(const std::string& s);

}  // namespace hg
