// Transfers: the one call through which bytes cross tiers. Each copy runs on a copy queue
// (cudaMemcpyAsync on a copy stream with a GPU, memcpy on the copy worker without), is logged as
// a transfer stage (source, destination, bytes, measured duration) and counted in the totals.
// Copies out of the gpu tier have a queue of their own, as a GPU has a copy engine per direction
// of its full-duplex link: a download does not wait behind uploads, nor they behind it.
#pragma once
#include <array>
#include <functional>
#include <mutex>
#include <span>

#include "engine/backend/metered_backend.h"
#include "engine/runtime/queue.h"

namespace hg {

struct TransferTotals {
  std::array<std::array<int64_t, kNumTiers>, kNumTiers> bytes{};  // [src][dst]
  std::array<std::array<int64_t, kNumTiers>, kNumTiers> count{};
  int64_t bytes_between(Tier src, Tier dst) const { return bytes[size_t(src)][size_t(dst)]; }
  int64_t total_bytes() const;
};

// Separately addressed rows of a gather: the runs of consecutive indices in idx (a row that follows
// its predecessor in the source continues the same read). What the modeled clock charges the
// profile's row cost for.
int64_t gathered_runs(std::span<const int32_t> idx);

class TransferEngine {
 public:
  // copy_fn(dst, src, n, dst_tier, src_tier): the device's copy (default: memcpy).
  using CopyFn = std::function<void(void*, const void*, size_t, Tier, Tier)>;
  // before_submit runs on the submitting thread before each transfer is queued: with a device
  // whose work is asynchronous it waits for the work that thread queued (the copy runs on another
  // thread's stream and may read what that work writes, or overwrite what it reads).
  // in_queue: copies into the gpu tier and between host tiers; out_queue: copies out of the gpu tier.
  TransferEngine(Queue& in_queue, Queue& out_queue, CopyFn copy_fn = {}, std::function<void()> before_submit = {});
  // The device's copy between tiers, run inline: for a run() body that copies piecewise.
  void copy_now(void* dst, Tier dst_tier, const void* src, Tier src_tier, size_t bytes) const {
    copy_(dst, src, bytes, dst_tier, src_tier);
  }

  Event copy(void* dst, Tier dst_tier, const void* src, Tier src_tier, int64_t bytes, std::vector<Event> deps = {},
             std::string name = "copy");
  // Gathers rows: dst row i ← src row rows[i] (row_bytes each, src rows src_stride bytes apart).
  // One transfer stage of rows.size() · row_bytes bytes; its gathered rows (the modeled clock's
  // row cost) are the runs of consecutive source rows. `rows` is copied.
  Event gather_rows(void* dst, Tier dst_tier, const void* src, Tier src_tier, int64_t row_bytes, int64_t src_stride,
                    std::span<const int32_t> rows, std::vector<Event> deps = {}, std::string name = "gather");
  // A custom copy (e.g. scattering rows into a per-head layout) of `bytes` from src to dst tier:
  // `fn` does the copying on the copy queue; it is logged and counted like any transfer.
  Event run(Tier src_tier, Tier dst_tier, int64_t bytes, std::function<void()> fn, std::vector<Event> deps = {},
            std::string name = "copy");
  // The same for a custom gather: `fn` reads `rows` separately addressed rows or runs of rows
  // (`bytes` in all) from src_tier, which the stage records for the modeled clock's row cost.
  Event run_gather(Tier src_tier, Tier dst_tier, int64_t bytes, int64_t rows, std::function<void()> fn,
                   std::vector<Event> deps = {}, std::string name = "gather");
  TransferTotals totals() const;
  void reset_totals();
  // copy() and gather_rows() count their copy calls into `c` (into or out of the gpu tier) and
  // spend copy_us on each; run() bodies copy through the backend, which counts its own calls.
  void set_meter(DeviceCounters* c, double copy_us) { meter_ = c, copy_us_ = copy_us; }

 private:
  void count(Tier src, Tier dst, int64_t bytes);
  Queue& q_in_;
  Queue& q_out_;
  CopyFn copy_;
  std::function<void()> before_submit_;
  // Counts `calls` device copy calls of `bytes` in all between the tiers, and spends their cost.
  void meter(Tier src, Tier dst, int64_t calls, int64_t bytes) const;
  DeviceCounters* meter_ = nullptr;
  double copy_us_ = 0;
  bool host_copy_ = false;  // the default memcpy: gathers use cpu::gather_rows (rows prefetched)
  mutable std::mutex mu_;
  TransferTotals totals_;
};

}  // namespace hg
