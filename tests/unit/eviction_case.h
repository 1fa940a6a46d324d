// Inputs of the eviction score ops (PolicyOps::accumulate_scores, pick_evictions): records of a
// few sequences with distinct, scattered positions and random taps, shared by the CPU and CUDA tests.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "engine/backend/policy_ops.h"
#include "test_util.h"

namespace hg::test {

struct EvictionCase {
  int H = 6, H_kv = 2;
  int64_t slot_ld = 0, tap_ld = 0;
  std::vector<int32_t> n;                      // keys per row (row r's sequence is r)
  std::vector<PolicyOps::ScoreSlot> slots;     // [rows, H_kv, slot_ld]
  std::vector<float> taps;                     // [rows, H, tap_ld]
};

// Rows of n[r] keys; positions a random permutation of a sparse range (evicted tokens leave gaps);
// scores random with some ties.
inline EvictionCase eviction_case(std::vector<int32_t> n, uint64_t seed) {
  EvictionCase c;
  c.n = std::move(n);
  const int32_t mx = *std::max_element(c.n.begin(), c.n.end());
  c.slot_ld = mx + 3, c.tap_ld = mx + 1;
  const size_t rows = c.n.size();
  c.slots.resize(rows * size_t(c.H_kv) * size_t(c.slot_ld));
  std::mt19937 g{uint32_t(seed)};
  for (size_t r = 0; r < rows; ++r)
    for (int h = 0; h < c.H_kv; ++h) {
      std::vector<int32_t> pos(size_t(3 * c.slot_ld));
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), g);
      for (int64_t t = 0; t < c.slot_ld; ++t) {
        auto& s = c.slots[(r * size_t(c.H_kv) + size_t(h)) * size_t(c.slot_ld) + size_t(t)];
        s.pos = pos[size_t(t)];
        s.score = double(g() % 7) * 0.125;  // ties
      }
    }
  c.taps = random_vec(rows * size_t(c.H) * size_t(c.tap_ld), seed + 1, -4, 4);
  return c;
}

// The ScoreRows of a case over `slots` (the case's, or a copy of them elsewhere).
inline std::vector<PolicyOps::ScoreRows::Row> score_rows(const EvictionCase& c, PolicyOps::ScoreSlot* slots) {
  std::vector<PolicyOps::ScoreRows::Row> rows;
  for (size_t r = 0; r < c.n.size(); ++r)
    rows.push_back({slots + r * size_t(c.H_kv) * size_t(c.slot_ld), c.slot_ld, c.n[r], int32_t(100 + r), 1.0 + 0.5 * double(r)});
  return rows;
}

// Picks over every (row, head) of a case: count victims outside `recent`.
inline std::vector<PolicyOps::EvictionPick> eviction_picks(const EvictionCase& c, const PolicyOps::ScoreSlot* slots,
                                                           int32_t recent, int32_t count) {
  std::vector<PolicyOps::EvictionPick> picks;
  int64_t at = 0;
  for (size_t r = 0; r < c.n.size(); ++r)
    for (int h = 0; h < c.H_kv; ++h) {
      const int32_t k = std::min(count, c.n[r] - std::min(recent, c.n[r]));
      if (k <= 0) continue;
      picks.push_back({slots + (r * size_t(c.H_kv) + size_t(h)) * size_t(c.slot_ld), c.n[r], recent, k, at});
      at += k;
    }
  return picks;
}

}  // namespace hg::test
