// The accelerator's counters and fixed costs. A metered backend wraps the accelerator's backend:
// every kernel op counts as one launch, every upload, download and device copy as one copy call
// with its bytes, every download, synchronize() and scalar result as a synchronisation (the host
// waits on the device), and every op over host arrays (top-k, Gumbel noise) as host-side policy
// work. With costs set it also spends each event's fixed cost as real time on the calling thread,
// as a GPU's driver does, so that a run on the emulated accelerator pays what a GPU pays.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/backend/backend.h"

namespace hg {

// Fixed costs in microseconds (0: none). sync_us is also what an accelerator stage pays each time
// it waits for another queue's stage.
struct DeviceCosts {
  double launch_us = 0, copy_us = 0, sync_us = 0;
  bool any() const { return launch_us > 0 || copy_us > 0 || sync_us > 0; }
};

// A snapshot of the counters; differences of two give a step's.
struct DeviceCounts {
  int64_t launches = 0;
  int64_t copies_h2d = 0, copies_d2h = 0, copies_d2d = 0;  // copy calls
  int64_t bytes_h2d = 0, bytes_d2h = 0;
  int64_t syncs = 0;   // host waits on the device: downloads, synchronize(), scalar results
  int64_t waits = 0;   // an accelerator stage waiting for another queue's stage (CPU, copy)
  int64_t host_policy_elems = 0;  // elements a policy op reads on the host for the device
  int64_t copies() const { return copies_h2d + copies_d2h + copies_d2d; }
  DeviceCounts operator-(const DeviceCounts& o) const;
  DeviceCounts& operator+=(const DeviceCounts& o);
  // Every field with its name (rows' JSON keys), in declaration order.
  struct Field {
    int64_t DeviceCounts::*member;
    const char* name;
  };
  static const std::array<Field, 9>& fields();
};

// The counters, kept per step: a call counts toward the step of the stage it runs in (a prefetch
// queued in step k counts in step k wherever it runs), given by step_fn (-1 without one).
class DeviceCounters {
 public:
  void add(const DeviceCounts& calls);
  void set_step_fn(std::function<int64_t()> f) { step_fn_ = std::move(f); }
  // Called with each call's launches and copy calls (the runtime charges them to the running stage).
  void set_call_fn(std::function<void(int64_t launches, int64_t copy_calls)> f) { call_fn_ = std::move(f); }
  DeviceCounts snapshot() const;              // every step's
  DeviceCounts of_step(int64_t step) const;  // one step's
  void reset();

 private:
  std::function<int64_t()> step_fn_;
  std::function<void(int64_t, int64_t)> call_fn_;
  mutable std::mutex mu_;
  std::vector<DeviceCounts> by_step_;  // index step + 1 (-1: outside steps)
};

// Spends `us` microseconds of real time on this thread (a spin: a driver's call is CPU time).
void spend_microseconds(double us);

// `inner` with every call counted into `counters` and charged `costs` (counters outlives it).
std::unique_ptr<Backend> make_metered_backend(std::unique_ptr<Backend> inner, DeviceCounters* counters,
                                              DeviceCosts costs);

}  // namespace hg
