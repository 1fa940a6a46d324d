// The runtime a run executes in: the device playing the accelerator (a CUDA GPU, or the
// host-emulated accelerator — the CPU backend on its own worker thread with its own
// capacity-limited `gpu` tier), the memory tiers, the queues (accelerator, a copy queue per link direction, CPU worker),
// transfers and the event log. `device: auto` picks CUDA when a device exists, else the
// emulator; `cuda` without one is an error; `cpu` runs without an accelerator role.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/backend/backend.h"
#include "engine/backend/metered_backend.h"
#include "engine/runtime/clock.h"
#include "engine/runtime/memory.h"
#include "engine/runtime/queue.h"
#include "engine/runtime/transfer.h"

namespace hg {

enum class DeviceKind : uint8_t { kCpu, kEmulated, kCuda };
std::string_view device_kind_name(DeviceKind k);

struct RuntimeConfig {
  std::string device = "auto";  // auto | emulated | cuda | cpu
  TierConfig tiers;
  int accel_threads = 0;  // emulated accelerator's threads (0: emulated_accel_threads())
  int cpu_threads = 0;    // CPU worker queue's threads (0: the rest, at least 1)
  // device "emulated" only: the accelerator's backend, in place of the CPU backend. One with
  // memory of its own (host_memory() false) is set up as a GPU is: the gpu tier on its alloc and
  // transfers through its upload/download (tests: a backend that checks the device-memory contract).
  std::function<std::unique_ptr<Backend>()> device_backend;
  // Dry execution: both backends are `null` (no math), every tier is phantom memory (counted, not
  // backed) and copies are logged and counted but move nothing. Needs stage_clock.
  bool dry = false;
  // When set, strategies that time their own stages to steer themselves (HybridGen's scheduler)
  // take each stage's modeled time on this profile instead of its wall time. Dry runs need it.
  std::optional<PlatformProfile> stage_clock;
  // Fixed costs the emulated accelerator spends as real time on every kernel launch, copy call and
  // synchronisation (device_costs_of(): a profile's measured ones). Ignored by dry runs (their
  // clock charges the profile's) and by cuda (a GPU pays its own).
  DeviceCosts device_costs;
};

// A platform profile's fixed costs as the emulated accelerator's: its achieved (measured) launch,
// copy-call and stage hand-off costs where it has them, else its `fixed:` ones.
DeviceCosts device_costs_of(const PlatformProfile& p);
// Adds c to p's fixed costs (peak and achieved): a profile measured on the bare emulated device
// then replays a run that spent c as real time.
void add_fixed_costs(PlatformProfile& p, const DeviceCosts& c);

// The emulated accelerator's default thread count: half the machine, at least 1.
int emulated_accel_threads();

class Runtime {
 public:
  explicit Runtime(const RuntimeConfig& cfg);
  ~Runtime();

  DeviceKind device() const { return kind_; }
  // E.g. "emulated (cpu backend, 1 thread)" or "cuda:0 NVIDIA H200".
  const std::string& device_description() const { return description_; }
  MemorySystem& memory() { return *mem_; }
  EventLog& log() { return log_; }
  Queue& accel() { return *accel_; }
  Queue& copy() { return *copy_; }          // copies into the gpu tier and between host tiers
  Queue& copy_out() { return *copy_out_; }  // copies out of the gpu tier
  Queue& cpu() { return *cpu_; }
  TransferEngine& transfers() { return *xfer_; }
  Backend& accel_backend() { return *accel_be_; }  // the accelerator's math (runs on accel())
  Backend& cpu_backend() { return *cpu_be_; }      // strategy CPU work (runs on cpu())
  // The backend accel_backend() meters (what RuntimeConfig::device_backend made, for its tests).
  Backend& unmetered_accel_backend() { return *accel_inner_; }
  int accel_threads() const { return accel_threads_; }
  bool dry() const { return dry_; }
  const PlatformProfile* stage_clock() const { return stage_clock_ ? &*stage_clock_ : nullptr; }
  // A stage's time for a strategy's own steering: its modeled time on stage_clock() when there is
  // one, else `measured_s`.
  double stage_seconds(StageKind kind, const StageWork& work, double measured_s) const;
  int cpu_threads() const { return cpu_threads_; }
  // The accelerator's launches, copy calls, synchronisations and bytes so far (metered_backend.h):
  // its backend's ops, the transfers into and out of the gpu tier, and its stages' waits.
  DeviceCounts device_counts() const { return counters_.snapshot(); }
  // One step's (the event log's step numbers: 0 the prompt, 1… the decode steps), and a fresh start.
  DeviceCounts device_counts_of_step(int64_t step) const { return counters_.of_step(step); }
  void reset_device_counts() { counters_.reset(); }
  // The fixed costs this runtime spends as real time (zero unless emulated with device_costs).
  const DeviceCosts& device_costs() const { return costs_; }

 private:
  DeviceCounters counters_;
  DeviceCosts costs_;
  DeviceKind kind_ = DeviceKind::kEmulated;
  std::string description_;
  EventLog log_;
  std::unique_ptr<MemorySystem> mem_;
  std::unique_ptr<Queue> accel_, copy_, cpu_, copy_out_;
  std::unique_ptr<TransferEngine> xfer_;
  std::unique_ptr<Backend> accel_be_, cpu_be_;
  Backend* accel_inner_ = nullptr;
  int accel_threads_ = 1, cpu_threads_ = 1;
  bool dry_ = false;
  std::optional<PlatformProfile> stage_clock_;
};

// Machine measurements for `hgbench calibrate` (profile `this-machine`): the CPU worker's read
// bandwidth of dram and far, row costs and FLOP/s; copy bandwidth; the accelerator's achieved
// kernel rates (GPU, else the emulated accelerator); fixed costs per stage, launch and copy.
struct CalibrateOptions {
  double seconds_per_measure = 0.5;
  int64_t buffer_bytes = int64_t(512) << 20;
};
PlatformProfile calibrate(const CalibrateOptions& o, std::string* notes);
// Best-of-several read bandwidth (GB/s) of a buffer on `tier` with all threads.
double measure_read_gbs(MemorySystem& mem, Tier tier, int64_t bytes, double seconds);
// The profile's row cost: extra ns per random 512 B row read from a buffer on `tier` (16K sorted
// random rows, prefetched as cpu::gather_rows does, all threads, best of several passes) over the
// same bytes at the best rate of stream passes over the buffer interleaved with them. 0 when
// random rows read as fast as the stream.
double measure_row_ns(MemorySystem& mem, Tier tier, int64_t bytes, double seconds);

}  // namespace hg
