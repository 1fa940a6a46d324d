// Clocks. `measured`: stage times as recorded (wall clock; CUDA events on a GPU). `modeled:<p>`:
// each stage's work turned into time by a platform profile (roofline: max of compute time and
// memory time, plus far-tier latency), then the step's stage graph replayed — a stage starts
// when its queue is free and its dependencies have ended — to get the critical path.
// Modeled results are labelled modeled wherever they appear.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/runtime/event_log.h"

namespace hg {

// Rates of one machine. Datasheet profiles say so in their YAML comments.
struct PlatformProfile {
  std::string name;
  std::string source;      // "datasheet", "calibrated <date>", …
  double gpu_flops = 0;    // FLOP/s of the accelerator (BF16 tensor, dense)
  double gpu_attn_flops = 0;  // FLOP/s of its attention kernel (prefill shape, head dim 128); 0: gpu_flops
  // The same kernel's FLOP/s per head dimension, where measured (`gpu.attn_tflops_by_head_dim`):
  // a stage's attention is charged at the rate of the nearest measured head dimension, else at
  // gpu_attn_flops. Attention kernels run at different efficiency per head dimension.
  std::map<int, double> gpu_attn_flops_by_dim;
  double gpu_mem_gbs = 0;  // HBM GB/s
  // Elements per second of the host backend's exp_shift_sum on the thread that runs the
  // accelerator's stages (the unit of StageWork::elems: score policies). Calibrated profiles
  // measure it; 0 (datasheet profiles): policy work is not charged beyond its FLOPs and bytes.
  double gpu_elem_eps = 0;
  double gpu_mem_gib = 0;
  double cpu_flops = 0;    // FP32 FLOP/s of all cores
  double dram_gbs = 0;     // read GB/s of local DRAM
  // GB/s at which the CPU worker's decode attention kernel reads F16 KV (all its threads): CPU
  // stages stream KV (and weights) at this rate when it is below a tier's read rate. Calibrated
  // profiles measure it; 0 (datasheet profiles): the tiers' read rates.
  double cpu_attn_gbs = 0;
  double dram_gib = 0;
  double far_gbs = 0;      // read GB/s of the far tier (CXL / remote node)
  double far_latency_ns = 0;
  double far_gib = 0;
  // Extra time per separately addressed row a gather reads, beyond its bytes at the tier's GB/s
  // (random rows cost more than a stream: DRAM row activations, page walks). Calibrated profiles
  // measure it (`hgbench calibrate`: random 512 B rows against a stream); datasheet profiles leave
  // it 0, and then gathers are charged their bytes only.
  double dram_row_ns = 0;
  double far_row_ns = 0;
  double h2d_gbs = 0;      // host → device link GB/s
  double d2h_gbs = 0;      // device → host link GB/s
  // Fixed costs (µs), added to a stage's work time: every stage's start after what it waited for
  // (a queue thread's wake-up), each accelerator kernel launch (StageWork::launches) and each
  // transfer's copy call. Calibrated profiles measure them; datasheet profiles leave them 0.
  double stage_us = 0;
  double launch_us = 0;
  double copy_us = 0;
  // What a real machine of this kind achieves (`achieved:`): achieved ÷ peak factors for the GPU's
  // memory and FLOPs and the CPU's DRAM reads and attention, and the fixed costs a measured GPU
  // paid (negative: the `fixed:` costs above). Datasheet profiles take them from a measured GPU
  // and name it in `achieved.source`; without the section every factor is 1.
  struct Achieved {
    double gpu_mem = 1, gpu_flops = 1, cpu_dram = 1, cpu_attn = 1;
    double stage_us = -1, launch_us = -1, copy_us = -1;
    std::string source;
  } achieved;
};

// The two ends of a modeled figure's band. `peak`: the profile's rates, no fixed costs (the
// datasheet's best case). `achieved`: its rates times the achieved factors, with fixed costs.
// For a datasheet profile the profile as written is `peak`; for a calibrated one (measured rates,
// measured fixed costs, factors 1) it is `achieved`.
PlatformProfile peak_profile(const PlatformProfile& p);
PlatformProfile achieved_profile(const PlatformProfile& p);

// The platform name that is no file: `hgbench calibrate`'s measurement of this machine, taken again
// just before each recorded run (clock: modeled:calibrate). On a shared machine whose bandwidth
// moves within minutes, a profile measured earlier cannot tell the clock's error from the drift.
inline constexpr const char* kCalibratePlatform = "calibrate";
inline bool calibrates_each_run(const std::string& platform) { return platform == kCalibratePlatform; }
// The profile accuracy and retrieval runs steer on (RuntimeConfig::stage_clock): the HybridGen
// paper's machine A. A strategy that times its stages to decide (HybridGen's scheduler) then
// decides on modeled times, never wall time, and the same on every run whatever the load.
inline constexpr const char* kSteeringPlatform = "machine-a";

// Loads experiments/platforms/<name>.yaml or a path; strict keys (InputError names file:line and
// the nearest valid key).
PlatformProfile load_platform(const std::string& name_or_path, const std::string& platforms_dir);
// The file a platform name or path names: the path when it exists, else platforms_dir/NAME.yaml.
std::string platform_file(const std::string& name_or_path, const std::string& platforms_dir);
void save_platform(const PlatformProfile& p, const std::string& path, const std::string& comment);

// FLOP/s of the accelerator's attention at head dimension d (0: unknown) on the profile.
double attention_rate(const PlatformProfile& p, int d);
// Seconds a stage takes on the profile.
double modeled_stage_seconds(const StageRecord& r, const PlatformProfile& p);

struct StepTiming {
  double critical_path_s = 0;  // end of the last stage minus start of the first
  double sum_stages_s = 0;     // Σ stage durations (what a fully serial run would take)
  double accel_s = 0, cpu_s = 0, transfer_s = 0;
  double overlap_cpu_accel_s = 0;  // seconds CPU and accelerator stages ran together
};

// Measured timing of the records (times as logged).
StepTiming measured_timing(const std::vector<StageRecord>& recs);
// Modeled timing: durations from the profile, start times from queue order and dependencies.
StepTiming modeled_timing(const std::vector<StageRecord>& recs, const PlatformProfile& p);

}  // namespace hg
