// The Runner: the measured generation loop every command goes through (warm-up, repeats, prefill,
// decode steps, the stage log, clocks, the pipeline summary), and the figures it yields. The
// Recorder (recorder.h) turns each finished run into a result row.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "datasets/needle.h"
#include "datasets/score.h"
#include "datasets/tasks.h"
#include "engine/core/model.h"
#include "engine/decoder/generate.h"
#include "engine/decoder/host_estimate.h"
#include "engine/runtime/clock.h"
#include "engine/runtime/event_log.h"
#include "engine/runtime/runtime.h"
#include "engine/runtime/transfer.h"
#include "experiments/runner/spec.h"

namespace hg {

class KvStrategy;

// What one generation left behind: the result, measured step times, the stage log, traffic per
// link, tier peaks and the strategy's per-step records.
struct Measurement {
  GenerateResult gen;
  std::vector<double> step_s;  // measured wall time of each decode step after the warm-up
  std::vector<StageRecord> log;
  TransferTotals prefill_xfer, decode_xfer;
  std::array<TierUsage, kNumTiers> tiers{};
  TierUsage gpu_kv{};  // KV on the gpu tier: the budget (capacity; 0: none), in use, peak
  std::vector<std::map<std::string, double>> step_stats;  // per decode step after the warm-up
  // The accelerator's launches, copy calls, synchronisations and bytes (metered_backend.h): the
  // prompt's, and each decode step's after the warm-up.
  DeviceCounts prefill_device;
  std::vector<DeviceCounts> step_device;
};

// A counter set as a row's JSON object; divided by `per` (a mean over steps).
nlohmann::ordered_json device_counts_json(const DeviceCounts& c, double per = 1);
// Its one-line form for --step-stats: "launches=… syncs=… h2d=N/B …".
std::string device_counts_line(const DeviceCounts& c);

// Runs one generation (the prompt, then decode steps) and collects the Measurement; the first
// `warmup_steps` decode steps run but are left out of it (times, stage log, traffic, records).
// `rt` may be null (no accelerator: no stage log). on_token and opts.after_step are called as
// generate() calls them.
Measurement measure_generation(Runtime* rt, const Model& model, Backend& backend, KvStrategy& kv,
                               const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opts,
                               int warmup_steps = 0, const std::function<void(int, int32_t)>& on_token = {});

// The set-up every measured run shares (run, bench, generate):
// n token ids, BOS then uniform ids drawn from rng (the first three ids, the usual special tokens,
// left out): the same prompt for every strategy and repeat of a seed.
std::vector<int32_t> seeded_prompt(const Model& model, int n, std::mt19937_64& rng);
// The weights charged to the accelerator's tier; OutOfMemoryError when they do not fit there.
void reserve_weights(Runtime& rt, const Model& model);

// The figures of one Measurement; every printed or recorded figure is defined here once.
struct Figures {
  double prefill_s = 0;          // measured
  double decode_s = 0;           // measured, all decode steps
  double decode_token_s = 0;     // measured median per decode step
  double decode_token_min_s = 0, decode_token_max_s = 0;
  double end_to_end_s = 0;       // prefill + decode, measured
  int64_t prefill_tokens = 0, decode_tokens = 0, decode_steps = 0;
  PipelineSummary pipeline;      // measured, from the stage log
  // Modeled on a platform (set when a profile is given): the same stages' work replayed.
  bool modeled = false;
  std::string platform;
  double m_prefill_s = 0, m_decode_token_s = 0, m_end_to_end_s = 0;
  double m_accel_s = 0, m_cpu_s = 0, m_transfer_s = 0, m_critical_s = 0, m_serial_s = 0;  // per decode step
  // The same log replayed at the two ends of the profile's band (peak_profile, achieved_profile):
  // the run's decisions (a scheduler's K, its mode) as they were taken, their cost at each end.
  struct Replay {
    double prefill_s = 0, decode_token_s = 0, end_to_end_s = 0;
  } m_peak, m_achieved;
  // Work per decode step, from the stage log: FLOPs per stage kind, bytes per tier per stage kind.
  std::array<double, 3> flops_per_step{};                       // [StageKind]
  std::array<std::array<double, kNumTiers>, 3> bytes_per_step{};  // [StageKind][Tier]
  // Bytes per decode step over each link [src][dst], and in the prefill.
  std::array<std::array<double, kNumTiers>, kNumTiers> link_bytes_per_step{}, link_bytes_prefill{};
  std::map<std::string, double> stats_last, stats_mean;
  // A scheduler's decisions per decode step (HybridGen: K and mode_pre), run-length encoded as
  // [value, steps] pairs.
  std::map<std::string, std::vector<std::pair<double, int>>> trajectory;
  // Mean over the measured decode steps of the keys attended per row (logits on the accelerator,
  // on the CPU) and of their share of the visible context.
  double attended_accel = 0, attended_cpu = 0, attended_fraction = 0;
  // Per stage name and phase ("prefill"/"decode"): stages, their summed measured duration and the
  // same stages' modeled durations (each stage alone, no replay): where the clock departs.
  struct StageSum {
    int64_t count = 0;
    double measured_s = 0, modeled_s = 0;
  };
  std::map<std::string, StageSum> stage_sums;
  // The time rows are compared by: end-to-end latency (the prefill and every decode step, the
  // paper's metric in Figs. 15-17), modeled when modeled; decode_time_s() is the decode phase.
  double time_s() const { return modeled ? m_end_to_end_s : end_to_end_s; }
  double decode_time_s() const { return modeled ? m_end_to_end_s - m_prefill_s : decode_s; }
  double prefill_time_s() const { return modeled ? m_prefill_s : prefill_s; }
  double token_s() const { return modeled ? m_decode_token_s : decode_token_s; }
};
Figures figures(const Measurement& m, const PlatformProfile* profile);
// The accelerator KV budget gpu_kv_share gives at point p: that share of the point's whole KV
// (2 × layers × KV heads × head dim × batch × (prompt + decode) tokens, 2 bytes each).
int64_t share_kv_bytes(const Model& model, const Point& p);
// Rows of the prompt's one prefill forward (prompt × batch, within int32), and the host memory the
// point needs (a needle point: its haystack and answer), estimated before anything is allocated.
int64_t prefill_rows_of(const Point& p);
HostEstimate point_host_estimate(const HParams& hp, const Point& p, bool dry);
// A file's identity for provenance: absolute path, size and a fingerprint of its size, first and
// last MiB ({path, exists: false} when it is missing).
nlohmann::ordered_json file_fingerprint(const std::string& path);

// Runs experiment points: one (point, strategy entry) at a time, each repeat a fresh runtime and
// strategy over the same prompt and model (the model is kept between runs with the same spec).
class Runner {
 public:
  explicit Runner(const ExperimentSpec& spec);
  ~Runner();
  // Runs warm-up then repeats of `entry` at `p`; on_row(row) for each repeat not in `skip` (the
  // finished ones of a resumed run). A failure becomes a row with status "failed" and its reason.
  void run(const Point& p, const StrategyEntry& entry, const std::vector<int>& skip,
           const std::function<void(nlohmann::ordered_json)>& on_row);
  // Accuracy points: per-item records go to items_dir/<point id>.<label>.r<repeat>.jsonl when set;
  // on_items(done, total) reports scoring progress.
  std::string items_dir;
  // Accuracy references are kept here (one file per key) and read back by a resumed run.
  std::string reference_dir;
  std::function<void(int done, int total)> on_items;

 private:
  const Model& model_for(const std::string& spec);
  const PlatformProfile& profile(const std::string& name);  // a stored platform, loaded once
  DeviceCosts device_costs();  // the spec's device_costs, its profile loaded once
  nlohmann::ordered_json run_once(const Point& p, const StrategyEntry& entry, int repeat, bool record);
  nlohmann::ordered_json run_eval_once(const Point& p, const StrategyEntry& entry, int repeat);
  nlohmann::ordered_json run_needle_once(const Point& p, const StrategyEntry& entry, int repeat);
  const ExperimentSpec& spec_;
  std::string model_key_;
  std::unique_ptr<Model> model_;
  std::map<std::string, PlatformProfile> profiles_;  // loaded once per platform name
  std::map<std::string, TaskData> tasks_;            // loaded once per task
  // Fidelity references, scored once per (model, task, shots, limit, seed, context mode, lm-eval
  // rules, reference strategy) and reused by every strategy and swept parameter of the process.
  std::map<std::string, std::shared_ptr<const ReferenceScores>> references_;
  // The same for retrieval tasks: the reference's greedy outputs per item.
  std::map<std::string, std::vector<std::vector<int32_t>>> needle_refs_;
  std::optional<Haystack> essay_;  // RULER's essay haystack, loaded by the first point that needs it
  std::map<std::string, QaCorpus> qa_;  // qa_1's and qa_2's files, likewise
};

// Provenance of this build and machine (commit and dirty flag, build type, compiler, CPU, GPU).
nlohmann::ordered_json provenance();

// The row of a failed run.
nlohmann::ordered_json failed_row(const ExperimentSpec& spec, const Point& p, const StrategyEntry& e, int repeat,
                                  const std::string& error_class, const std::string& reason);

}  // namespace hg
