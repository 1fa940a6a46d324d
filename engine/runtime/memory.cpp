// Tier ledger and allocation. `far` uses numa_alloc_onnode on the far node (falling back to the
// local node, with a note, on one-node machines); `dram` uses numa_alloc_local (or the pinned
// allocator when a GPU drives the run); `gpu` uses the device allocator or aligned host memory.
#include "engine/runtime/memory.h"

#include <numa.h>

#include <algorithm>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include "engine/core/error.h"
#include "engine/core/phantom.h"
#include "engine/core/tensor.h"

namespace hg {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kGpu: return "gpu";
    case Tier::kDram: return "dram";
    case Tier::kFar: return "far";
  }
  return "?";
}

std::optional<Tier> parse_tier(std::string_view s) {
  if (s == "gpu") return Tier::kGpu;
  if (s == "dram") return Tier::kDram;
  if (s == "far") return Tier::kFar;
  return std::nullopt;
}

std::string OutOfMemory::message() const {
  if (kv_budget)
    return fmt::format("out of the accelerator's KV budget (gpu_kv_bytes {}): requested {} bytes of KV with {} in use",
                       capacity, requested, in_use);
  return fmt::format("out of memory on tier {}: requested {} bytes with {} of {} in use", tier_name(tier), requested,
                     in_use, capacity);
}

void TierLedger::set_capacity(Tier t, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  u_[size_t(t)].capacity = bytes;
}

std::optional<OutOfMemory> TierLedger::reserve(Tier t, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  TierUsage& u = u_[size_t(t)];
  if (bytes < 0 || u.in_use + bytes > u.capacity) return OutOfMemory{t, bytes, u.in_use, u.capacity};
  u.in_use += bytes;
  u.peak = std::max(u.peak, u.in_use);
  return std::nullopt;
}

void TierLedger::release(Tier t, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  u_[size_t(t)].in_use -= bytes;
}

TierUsage TierLedger::usage(Tier t) const {
  std::lock_guard<std::mutex> l(mu_);
  return u_[size_t(t)];
}

int64_t TierLedger::available(Tier t) const {
  std::lock_guard<std::mutex> l(mu_);
  return u_[size_t(t)].capacity - u_[size_t(t)].in_use;
}

void TierLedger::reset_peaks() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& u : u_) u.peak = u.in_use;
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    if (owner_) owner_->free(*this);
    owner_ = o.owner_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    tier_ = o.tier_;
    kv_ = o.kv_;
    o.owner_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Allocation::~Allocation() {
  if (owner_) owner_->free(*this);
}

namespace {
int64_t node_bytes(int node) {
  if (numa_available() < 0 || numa_max_node() == 0)  // one node: the whole machine (VMs misreport the node)
    return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  long long free_b = 0;
  const long long total = numa_available() >= 0 ? numa_node_size64(node, &free_b) : -1;
  if (total > 0) return total;
  return int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
}
}  // namespace

MemorySystem::MemorySystem(const TierConfig& cfg, std::optional<DeviceAllocator> device)
    : cfg_(cfg), device_(std::move(device)) {
  numa_ = numa_available() >= 0;
  local_node_ = numa_ ? std::max(0, numa_node_of_cpu(sched_getcpu())) : 0;
  const int max_node = numa_ ? numa_max_node() : 0;
  if (cfg.far_node >= 0) {
    if (cfg.far_node > max_node)
      input_error("far_node {} does not exist (this machine has NUMA nodes 0..{})", cfg.far_node, max_node);
    far_node_ = cfg.far_node;
  } else {
    far_node_ = local_node_;
    for (int n = max_node; n >= 0; --n)
      if (n != local_node_ && (!numa_ || numa_bitmask_isbitset(numa_all_nodes_ptr, unsigned(n)))) {
        far_node_ = n;
        break;
      }
  }
  if (far_node_ == local_node_)
    far_note_ = fmt::format("far tier falls back to the local NUMA node {} (this machine has one node)", local_node_);
  const int64_t host = node_bytes(local_node_);
  ledger_.set_capacity(Tier::kDram, cfg.dram_bytes > 0 ? cfg.dram_bytes : host);
  ledger_.set_capacity(Tier::kFar, cfg.far_bytes > 0 ? cfg.far_bytes : (far_node_ == local_node_ ? host : node_bytes(far_node_)));
  const int64_t dev = device_ && device_->device_bytes > 0 ? device_->device_bytes : host;
  ledger_.set_capacity(Tier::kGpu, cfg.gpu_memory_bytes > 0 ? cfg.gpu_memory_bytes : dev);
}

MemorySystem::~MemorySystem() {
  for (auto& [p, n] : slabs_) phantom_free(p, n);
}

void* MemorySystem::phantom_carve(size_t bytes) {
  // Every allocation starts at the base of the largest slab: phantom values are meaningless, so
  // buffers may alias, and a strategy that allocates per page or per prefill chunk maps nothing
  // new (a slab per allocation would run into the kernel's limit on mappings at long contexts).
  // A larger request maps a slab twice the size; older slabs stay for the pointers into them.
  constexpr size_t kSlab = size_t(1) << 30;
  std::lock_guard<std::mutex> l(slab_mu_);
  if (slabs_.empty() || bytes > slabs_.back().second) {
    const size_t n = std::max({kSlab, bytes, slabs_.empty() ? size_t(0) : 2 * slabs_.back().second});
    char* p = static_cast<char*>(phantom_alloc(n));
    if (!p) return nullptr;
    slabs_.emplace_back(p, n);
  }
  return slabs_.back().first;
}

void MemorySystem::set_kv_budget(int64_t bytes) {
  std::lock_guard<std::mutex> l(kv_mu_);
  kv_budget_ = std::max<int64_t>(0, bytes);
  kv_peak_ = kv_in_use_;
}

TierUsage MemorySystem::kv_usage() const {
  std::lock_guard<std::mutex> l(kv_mu_);
  return TierUsage{kv_budget_, kv_in_use_, kv_peak_};
}

std::variant<Allocation, OutOfMemory> MemorySystem::try_allocate(Tier t, int64_t bytes, MemUse use) {
  const bool kv = use == MemUse::kKv && t == Tier::kGpu;
  if (kv) {
    std::lock_guard<std::mutex> l(kv_mu_);
    if (kv_budget_ > 0 && kv_in_use_ + bytes > kv_budget_) return OutOfMemory{t, bytes, kv_in_use_, kv_budget_, true};
    kv_in_use_ += bytes;
    kv_peak_ = std::max(kv_peak_, kv_in_use_);
  }
  auto unkv = [&] {
    if (!kv) return;
    std::lock_guard<std::mutex> l(kv_mu_);
    kv_in_use_ -= bytes;
  };
  if (auto oom = ledger_.reserve(t, bytes)) {
    unkv();
    return *oom;
  }
  void* p = nullptr;
  const size_t n = size_t(std::max<int64_t>(bytes, 1));
  if (cfg_.phantom) {
    p = phantom_carve(n);
  } else if (t == Tier::kGpu && device_) {
    p = device_->alloc(n);
  } else if (t == Tier::kDram && cfg_.pinned_dram && device_ && device_->host_alloc) {
    p = device_->host_alloc(n);
  } else if (t == Tier::kFar && numa_) {
    p = numa_alloc_onnode(n, far_node_);
    if (p) advise_huge_pages(p, n);
  } else if (t == Tier::kDram && numa_ && !cfg_.pinned_dram) {
    p = numa_alloc_local(n);
    if (p) advise_huge_pages(p, n);
  } else {
    p = host_alloc(n);
  }
  if (!p) {
    ledger_.release(t, bytes);
    unkv();
    return OutOfMemory{t, bytes, ledger_.usage(t).in_use, ledger_.usage(t).capacity};
  }
  if (registers(t)) device_->host_register(p, n);
  Allocation a;
  a.owner_ = this;
  a.ptr_ = p;
  a.bytes_ = bytes;
  a.tier_ = t;
  a.kv_ = kv;
  return a;
}

Allocation MemorySystem::allocate(Tier t, int64_t bytes, MemUse use) {
  auto r = try_allocate(t, bytes, use);
  if (auto* oom = std::get_if<OutOfMemory>(&r)) throw OutOfMemoryError(oom->message());
  return std::move(std::get<Allocation>(r));
}

void MemorySystem::free(Allocation& a) {
  if (!a.ptr_) return;
  const size_t n = size_t(std::max<int64_t>(a.bytes_, 1));
  if (registers(a.tier_)) device_->host_unregister(a.ptr_);
  if (cfg_.phantom) {}  // the slabs go with the memory system
  else if (a.tier_ == Tier::kGpu && device_) device_->free(a.ptr_);
  else if (a.tier_ == Tier::kDram && cfg_.pinned_dram && device_ && device_->host_free) device_->host_free(a.ptr_);
  else if (a.tier_ == Tier::kFar && numa_) numa_free(a.ptr_, n);
  else if (a.tier_ == Tier::kDram && numa_ && !cfg_.pinned_dram) numa_free(a.ptr_, n);
  else std::free(a.ptr_);
  ledger_.release(a.tier_, a.bytes_);
  if (a.kv_) {
    std::lock_guard<std::mutex> l(kv_mu_);
    kv_in_use_ -= a.bytes_;
  }
  a.ptr_ = nullptr;
  a.owner_ = nullptr;
  a.kv_ = false;
}

}  // namespace hg
