// Placement policies.
#include "engine/kv/placement.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "engine/core/error.h"

namespace hg {
namespace {

class DramOnly final : public PlacementPolicy {
 public:
  std::string name() const override { return "dram-only"; }
  void plan(const PlacementPlan&) override {}
  Tier place(KvKind, int64_t, int64_t) const override { return Tier::kDram; }
};

// Keys first: K pages in dram; V pages fill what dram has left, the rest go far. When dram cannot
// hold every key, the least recently generated K pages (the lowest-numbered) go far as well and
// every V page is far (§4.4: keys are evicted from DRAM by LRG).
class Semantic final : public PlacementPolicy {
 public:
  std::string name() const override { return "semantic"; }
  void plan(const PlacementPlan& p) override {
    if (p.page_bytes <= 0) {
      k_far_pages_ = 0, v_dram_pages_ = p.n_pages;
      return;
    }
    const int64_t fit = std::clamp<int64_t>(p.dram_available / p.page_bytes, 0, INT64_MAX);
    k_far_pages_ = std::max<int64_t>(0, p.n_pages - fit);
    v_dram_pages_ = std::clamp<int64_t>(fit - p.n_pages, 0, p.n_pages);
  }
  Tier place(KvKind kind, int64_t page, int64_t) const override {
    if (kind == KvKind::kKey) return page < k_far_pages_ ? Tier::kFar : Tier::kDram;
    return page < v_dram_pages_ ? Tier::kDram : Tier::kFar;
  }

 private:
  int64_t k_far_pages_ = 0, v_dram_pages_ = 0;
};

// Page p of a block is in dram when floor((p + 1) r) > floor(p r): a fraction r of each layer's and
// sequence's pages, evenly spread.
class Interleave final : public PlacementPolicy {
 public:
  explicit Interleave(double r) : r_(r) {}
  std::string name() const override { return "interleave"; }
  void plan(const PlacementPlan&) override {}
  Tier place(KvKind, int64_t, int64_t page) const override {
    return std::floor(double(page + 1) * r_ + 1e-9) > std::floor(double(page) * r_ + 1e-9) ? Tier::kDram : Tier::kFar;
  }

 private:
  double r_;
};

}  // namespace

std::vector<std::string> placement_names() { return {"dram-only", "semantic", "interleave"}; }

std::unique_ptr<PlacementPolicy> make_placement(const std::string& name, double dram_ratio) {
  if (name == "dram-only") return std::make_unique<DramOnly>();
  if (name == "semantic") return std::make_unique<Semantic>();
  if (name == "interleave") {
    if (!(dram_ratio > 0 && dram_ratio <= 1)) input_error("interleave: dram_ratio {} must be in (0, 1]", dram_ratio);
    return std::make_unique<Interleave>(dram_ratio);
  }
  input_error("unknown placement '{}' (expected dram-only, semantic or interleave)", name);
}

}  // namespace hg
