// Transfers.
#include "engine/runtime/transfer.h"

#include <cstring>

#include "engine/backend/cpu/kernels.h"

namespace hg {

int64_t TransferTotals::total_bytes() const {
  int64_t t = 0;
  for (auto& r : bytes)
    for (auto b : r) t += b;
  return t;
}

int64_t gathered_runs(std::span<const int32_t> idx) {
  int64_t n = 0;
  for (size_t i = 0; i < idx.size(); ++i) n += i == 0 || idx[i] != idx[i - 1] + 1;
  return n;
}

TransferEngine::TransferEngine(Queue& in_queue, Queue& out_queue, CopyFn copy_fn, std::function<void()> before_submit)
    : q_in_(in_queue), q_out_(out_queue), copy_(std::move(copy_fn)), before_submit_(std::move(before_submit)) {
  host_copy_ = !copy_;
  if (!copy_) copy_ = [](void* d, const void* s, size_t n, Tier, Tier) { std::memcpy(d, s, n); };
}

void TransferEngine::count(Tier src, Tier dst, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  totals_.bytes[size_t(src)][size_t(dst)] += bytes;
  totals_.count[size_t(src)][size_t(dst)] += 1;
}

Event TransferEngine::copy(void* dst, Tier dst_tier, const void* src, Tier src_tier, int64_t bytes,
                           std::vector<Event> deps, std::string name) {
  return run(src_tier, dst_tier, bytes,
             [=, this] {
               meter(src_tier, dst_tier, 1, bytes);
               copy_(dst, src, size_t(bytes), dst_tier, src_tier);
             },
             std::move(deps), std::move(name));
}

Event TransferEngine::gather_rows(void* dst, Tier dst_tier, const void* src, Tier src_tier, int64_t row_bytes,
                                  int64_t src_stride, std::span<const int32_t> rows, std::vector<Event> deps,
                                  std::string name) {
  const auto n = int64_t(rows.size());  // before idx moves into the task
  const int64_t runs = src_stride == row_bytes ? gathered_runs(rows) : n;
  std::vector<int32_t> idx(rows.begin(), rows.end());
  return run_gather(src_tier, dst_tier, row_bytes * n, runs,
                    [=, this, idx = std::move(idx)] {
                      // The host gather copies each run of rows at once; the device's, each row.
                      meter(src_tier, dst_tier, host_copy_ ? runs : int64_t(idx.size()), row_bytes * n);
                      if (host_copy_)
                        return cpu::gather_rows(dst, src, row_bytes, src_stride, idx.data(), int64_t(idx.size()));
                      auto* d = static_cast<char*>(dst);
                      auto* s = static_cast<const char*>(src);
                      for (size_t i = 0; i < idx.size(); ++i)
                        copy_(d + int64_t(i) * row_bytes, s + int64_t(idx[i]) * src_stride, size_t(row_bytes), dst_tier,
                              src_tier);
                    },
                    std::move(deps), std::move(name));
}

Event TransferEngine::run(Tier src_tier, Tier dst_tier, int64_t bytes, std::function<void()> fn, std::vector<Event> deps,
                          std::string name) {
  return run_gather(src_tier, dst_tier, bytes, 0, std::move(fn), std::move(deps), std::move(name));
}

Event TransferEngine::run_gather(Tier src_tier, Tier dst_tier, int64_t bytes, int64_t rows, std::function<void()> fn,
                                 std::vector<Event> deps, std::string name) {
  StageWork w;
  w.src = src_tier;
  w.dst = dst_tier;
  w.transfer_bytes = bytes;
  w.rows[size_t(src_tier)] = rows;
  count(src_tier, dst_tier, bytes);
  if (before_submit_) before_submit_();
  Queue& q = src_tier == Tier::kGpu && dst_tier != Tier::kGpu ? q_out_ : q_in_;
  return q.submit(std::move(name), w, std::move(deps), std::move(fn));
}

void TransferEngine::meter(Tier src, Tier dst, int64_t calls, int64_t bytes) const {
  if (!meter_ || (src != Tier::kGpu && dst != Tier::kGpu)) return;  // between host tiers
  if (src == Tier::kGpu && dst == Tier::kGpu) meter_->add({.copies_d2d = calls});
  else if (dst == Tier::kGpu) meter_->add({.copies_h2d = calls, .bytes_h2d = bytes});
  else meter_->add({.copies_d2h = calls, .bytes_d2h = bytes});
  spend_microseconds(copy_us_ * double(calls));
}

TransferTotals TransferEngine::totals() const {
  std::lock_guard<std::mutex> l(mu_);
  return totals_;
}

void TransferEngine::reset_totals() {
  std::lock_guard<std::mutex> l(mu_);
  totals_ = {};
}

}  // namespace hg
