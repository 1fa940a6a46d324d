// The event log: every stage (accelerator compute, CPU compute, transfer) with its work (FLOPs,
// bytes per tier) and its measured start/end, plus the stages it waited on. Clocks read it:
// `measured` uses the recorded times; `modeled:<platform>` turns the work into time and replays
// the dependencies. Append-only and thread-safe.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/runtime/memory.h"

namespace hg {

enum class StageKind : uint8_t { kAccelCompute, kCpuCompute, kTransfer };
std::string_view stage_kind_name(StageKind k);

struct StageWork {
  double flops = 0;
  double attn_flops = 0;  // the part of `flops` that is attention over keys (its own rate)
  int32_t attn_head_dim = 0;  // head dimension of that attention (picks the profile's rate; 0: unknown)
  std::array<int64_t, kNumTiers> bytes{};  // bytes read or written per tier by a compute stage
  // Transfers: bytes moved from src to dst.
  Tier src = Tier::kDram;
  Tier dst = Tier::kDram;
  int64_t transfer_bytes = 0;
  // Separately addressed rows read per tier (gathers of selected K/V rows), counted on top of their
  // bytes: the modeled clock charges each one the profile's row cost for that tier. 0 for streams.
  std::array<int64_t, kNumTiers> rows{};
  // Kernel launches and device copy calls a stage issues, as the runtime's meter counted them on its
  // thread (the profile's launch and copy-call costs; a transfer stage pays at least one copy call).
  int64_t launches = 0;
  int64_t copy_calls = 0;
  // Elementwise policy work of an accelerator stage (eviction scores), in elements of the host
  // backend's exp_shift_sum: charged at the profile's gpu.elem_gops, after the roofline part.
  double elems = 0;

  // Adds another compute stage's work (FLOPs, bytes, rows, launches, elems; not the transfer fields).
  StageWork& operator+=(const StageWork& o);
  // This work's share f of each count (a stage split into segments).
  StageWork scaled(double f) const;
};

struct StageRecord {
  int64_t id = -1;
  std::string name;
  StageKind kind = StageKind::kCpuCompute;
  int queue = 0;             // queue index (stages on one queue run in order)
  int64_t step = 0;          // decode step (or -1 outside steps)
  StageWork work;
  // Stage ids this one waited for, and the CPU stage whose body submitted it (not waited for; the
  // modeled replay starts this one after it).
  std::vector<int64_t> deps;
  double start_s = 0, end_s = 0;  // measured, seconds since the log's origin
  // Submitted from inside the accelerator stage (segment) `within`, at measured time submit_s: the
  // modeled replay starts this one no earlier than the same fraction of that segment's modeled
  // time (the data it needs was produced up to there). -1: not submitted from an accelerator.
  int64_t within = -1;
  double submit_s = 0;
  // Where the body reported its progress (set_accel_progress): the share of its task's work done
  // at this segment's start and end, and, for a stage submitted from a segment, when it was
  // submitted. The replay uses these instead of measured times, so it does not depend on the
  // host's timing (dry runs). -1: not reported.
  double progress0 = -1, progress1 = -1, submit_progress = -1;
};

class EventLog {
 public:
  EventLog() : origin_(std::chrono::steady_clock::now()) {}
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count(); }
  int64_t reserve_id();
  void record(StageRecord r);
  std::vector<StageRecord> snapshot() const;  // sorted by id
  void clear();
  void set_step(int64_t s) { step_ = s; }
  int64_t step() const { return step_; }

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<StageRecord> records_;
  int64_t next_id_ = 0;
  int64_t step_ = -1;
};

// Measured overlap of two stage kinds within [t0, t1): seconds both were running.
double overlap_seconds(const std::vector<StageRecord>& log, StageKind a, StageKind b);
// Seconds during which at least one stage of kind k ran (union of its intervals).
double busy_seconds(const std::vector<StageRecord>& log, StageKind k);

// Pipeline efficiency over the logged decode steps (step >= 1), averaged per step: busy time per
// stage kind, how much of the CPU stage ran while the accelerator was busy (hidden_frac), the
// step's critical path as measured (first start to last end) and the serial sum of the three
// kinds' busy times. critical_s / serial_s < 1 is the time overlap saved.
struct PipelineSummary {
  int steps = 0;
  double accel_s = 0, cpu_s = 0, transfer_s = 0;  // per step
  double hidden_frac = 0;                          // Σ overlap(cpu, accel) / Σ cpu
  double critical_s = 0, serial_s = 0;             // per step
};
PipelineSummary pipeline_summary(const std::vector<StageRecord>& log);

}  // namespace hg
