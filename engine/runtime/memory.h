// Memory tiers and the ledger every allocation goes through. Tiers: `gpu` (CUDA device memory, or
// the emulated accelerator's pool), `dram` (local NUMA node; pinned when a GPU is present), `far`
// (a CXL or remote NUMA node via libnuma; the local node with a warning on one-node machines).
// The ledger counts current and peak bytes per tier against a capacity; exceeding it is an
// OutOfMemory value (try_allocate) or an OutOfMemoryError (allocate) — never a crash.
// Thread-safe: allocations may come from any queue.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace hg {

enum class Tier : uint8_t { kGpu, kDram, kFar };
constexpr int kNumTiers = 3;
std::string_view tier_name(Tier t);
// Parses "gpu", "dram", "far".
std::optional<Tier> parse_tier(std::string_view s);

struct TierUsage {
  int64_t capacity = 0;  // bytes
  int64_t in_use = 0;
  int64_t peak = 0;
};

// "AoG cannot hold this sequence": what did not fit, as a value.
struct OutOfMemory {
  Tier tier = Tier::kGpu;
  int64_t requested = 0;
  int64_t in_use = 0;
  int64_t capacity = 0;
  bool kv_budget = false;  // the accelerator's KV budget (gpu_kv_bytes), not the tier, was exceeded
  std::string message() const;
};

// What an allocation holds: KV on the gpu tier counts against the KV budget as well as the tier.
enum class MemUse : uint8_t { kOther, kKv };

class TierLedger {
 public:
  TierLedger() = default;
  void set_capacity(Tier t, int64_t bytes);
  // Reserves bytes on tier t, or returns what did not fit.
  std::optional<OutOfMemory> reserve(Tier t, int64_t bytes);
  void release(Tier t, int64_t bytes);
  TierUsage usage(Tier t) const;
  int64_t available(Tier t) const;
  void reset_peaks();

 private:
  mutable std::mutex mu_;
  std::array<TierUsage, kNumTiers> u_{};
};

// Where tiers physically live and how bytes are obtained for them.
struct TierConfig {
  int64_t gpu_memory_bytes = 0;  // 0: what the device (or, emulated, the machine) has
  int64_t dram_bytes = 0;        // 0: the local node's memory
  int64_t far_bytes = 0;         // 0: the far node's memory
  int far_node = -1;             // NUMA node of `far`; -1: the highest-numbered node other than local
  bool pinned_dram = false;      // cudaHostAlloc for dram (set when a CUDA device drives the run)
  // Dry runs: every tier's bytes are phantom memory (engine/core/phantom.h), counted by the ledger
  // against the capacities above as real ones are, so "does not fit" is still a result.
  bool phantom = false;
};

class MemorySystem;

// An owned allocation on one tier; returns its bytes to the ledger when destroyed.
class Allocation {
 public:
  Allocation() = default;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation();

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  int64_t bytes() const { return bytes_; }
  Tier tier() const { return tier_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  friend class MemorySystem;
  MemorySystem* owner_ = nullptr;
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
  Tier tier_ = Tier::kDram;
  bool kv_ = false;  // counted against the KV budget
};

class MemorySystem {
 public:
  // gpu_allocator: how device bytes are obtained (cudaMalloc); null → host memory (emulated).
  struct DeviceAllocator {
    std::function<void*(size_t)> alloc;
    std::function<void(void*)> free;
    std::function<void*(size_t)> host_alloc;  // pinned host memory for dram (cudaHostAlloc)
    std::function<void(void*)> host_free;
    // Maps other host memory (the far tier) into the device's address space and back, so that
    // the device reads it by DMA as it reads pinned dram. Optional.
    std::function<void(void*, size_t)> host_register;
    std::function<void(void*)> host_unregister;
    int64_t device_bytes = 0;
  };
  explicit MemorySystem(const TierConfig& cfg, std::optional<DeviceAllocator> device = std::nullopt);
  ~MemorySystem();

  std::variant<Allocation, OutOfMemory> try_allocate(Tier t, int64_t bytes, MemUse use = MemUse::kOther);
  Allocation allocate(Tier t, int64_t bytes, MemUse use = MemUse::kOther);  // throws OutOfMemoryError
  // The bytes of KV the gpu tier may hold at once (every strategy's resident and staged KV; the
  // experiments' gpu_kv_bytes); 0: no limit beyond the tier's capacity.
  void set_kv_budget(int64_t bytes);
  int64_t kv_budget() const { return kv_budget_; }
  TierUsage kv_usage() const;  // KV on the gpu tier: budget, in use, peak
  const TierLedger& ledger() const { return ledger_; }
  TierLedger& ledger() { return ledger_; }
  // Empty when `far` is a real other node; else the one-line warning that result rows carry.
  const std::string& far_note() const { return far_note_; }
  int far_node() const { return far_node_; }
  int local_node() const { return local_node_; }
  bool device_memory() const { return device_.has_value(); }
  // Dry runs: every allocation is phantom memory, whose values mean nothing (stores skip copying them).
  bool phantom() const { return cfg_.phantom; }

 private:
  // Allocations on `t` are mapped into the device (far memory with a device that maps host memory).
  bool registers(Tier t) const { return t == Tier::kFar && !cfg_.phantom && device_ && device_->host_register; }
  friend class Allocation;
  void free(Allocation& a);
  TierConfig cfg_;
  std::optional<DeviceAllocator> device_;
  TierLedger ledger_;
  mutable std::mutex kv_mu_;
  int64_t kv_budget_ = 0, kv_in_use_ = 0, kv_peak_ = 0;
  int local_node_ = 0;
  int far_node_ = 0;
  bool numa_ = false;
  // Phantom slabs (dry runs), returned all at once with the memory system.
  std::mutex slab_mu_;
  std::vector<std::pair<char*, size_t>> slabs_;
  void* phantom_carve(size_t bytes);
  std::string far_note_;
};

}  // namespace hg
