// Placement policies.
#include "engine/runtime/placement.h"

#include <cmath>

#include "engine/core/error.h"

namespace hg {
namespace {

class DramOnly final : public PlacementPolicy {
 public:
  std::string name() const override { return "dram-only"; }
  void plan(const PlacementPlan&) override {}
  Tier place(KvKind, int64_t) const override { return Tier::kDram; }
};

// Keys first: all K pages in dram; V pages fill what dram has left, the rest go far.
class Semantic final : public PlacementPolicy {
 public:
  std::string name() const override { return "semantic"; }
  void plan(const PlacementPlan& p) override {
    const int64_t left = p.dram_available - p.n_pages * p.page_bytes;
    v_dram_pages_ = p.page_bytes > 0 ? std::clamp<int64_t>(left / p.page_bytes, 0, p.n_pages) : p.n_pages;
  }
  Tier place(KvKind kind, int64_t page) const override {
    if (kind == KvKind::kKey) return Tier::kDram;
    return page < v_dram_pages_ ? Tier::kDram : Tier::kFar;
  }

 private:
  int64_t v_dram_pages_ = 0;
};

// Page p is in dram when floor((p + 1) r) > floor(p r): a fraction r of pages, evenly spread.
class Interleave final : public PlacementPolicy {
 public:
  explicit Interleave(double r) : r_(r) {}
  std::string name() const override { return "interleave"; }
  void plan(const PlacementPlan&) override {}
  Tier place(KvKind, int64_t page) const override {
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
