// KV placement policies: which tier holds each offloaded page of keys and of values. Chosen by
// name: `dram-only`; `semantic` (K in dram; V in dram while it fits beside all the keys, then far
// — the paper's mapping); `interleave` (pages of both K and V alternate dram/far at a ratio —
// the common baseline, alternating within each layer's and sequence's pages). Pure functions of
// (kind, page) after plan(): no hidden state.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/memory.h"

namespace hg {

enum class KvKind : uint8_t { kKey, kValue };

struct PlacementPlan {
  int64_t n_pages = 0;        // pages of K (and, separately, of V) the store will hold
  int64_t page_bytes = 0;     // bytes of one page of K (= one page of V)
  int64_t dram_available = 0; // bytes of dram the store may use
};

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual std::string name() const = 0;
  // Fixes the decision for a store of plan.n_pages pages per kind.
  virtual void plan(const PlacementPlan& p) = 0;
  // page: the page's number in age order across the whole store (position-major over layers and
  // sequences: what `semantic` fills dram by). block_page: its index within its own layer and
  // sequence, i.e. its address order in that block (what an OS page interleave alternates over).
  virtual Tier place(KvKind kind, int64_t page, int64_t block_page) const = 0;
};

// name: "dram-only", "semantic", "interleave" (dram_ratio: fraction of pages in dram, (0, 1]).
std::unique_ptr<PlacementPolicy> make_placement(const std::string& name, double dram_ratio = 0.5);
std::vector<std::string> placement_names();

}  // namespace hg
