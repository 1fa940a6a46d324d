// Shared strategy helpers.
#include "baselines/common.h"

#include <algorithm>
#include <variant>

#include "engine/core/error.h"

namespace hg {

int layers_within_budget(int64_t budget, int64_t layer_bytes, int n_layers) {
  if (budget <= 0 || layer_bytes <= 0) return 0;
  if (layer_bytes * n_layers <= budget) return n_layers;
  return int(std::clamp<int64_t>((budget - 2 * layer_bytes) / layer_bytes, 0, n_layers - 1));
}

Runtime& require_runtime(const StrategyContext& ctx, const char* strategy) {
  if (!ctx.runtime) input_error("strategy {} needs a runtime (tiers, queues, transfers)", strategy);
  return *ctx.runtime;
}

std::map<int32_t, int32_t> first_new_position(std::span<const TokenRow> rows) {
  std::map<int32_t, int32_t> m;
  for (auto& r : rows) {
    auto it = m.find(r.seq);
    if (it == m.end()) m[r.seq] = r.pos;
    else it->second = std::min(it->second, r.pos);
  }
  return m;
}

bool write_own_kv(Backend& be, std::span<const TokenRow> rows, std::span<const size_t> at, int32_t seq, int32_t n,
                  const float* k, const float* v, int H_kv, int D, void* dk, void* dv, DType dt) {
  int32_t own = 0;
  for (auto& r : rows) own += r.seq == seq;
  if (own != n) return false;
  auto index = [&](size_t i) { return at.empty() ? i : at[i]; };
  std::vector<int32_t> pos;
  for (size_t i = 0; i < rows.size();) {
    if (rows[i].seq != seq) {
      ++i;
      continue;
    }
    size_t j = i;
    pos.clear();
    while (j < rows.size() && rows[j].seq == seq && index(j) == index(i) + (j - i)) pos.push_back(rows[j++].pos);
    const int64_t off = int64_t(index(i)) * H_kv * D, m = int64_t(j - i);
    be.write_kv(k + off, m, H_kv, D, pos.data(), dk, int64_t(n) * D, dt);
    be.write_kv(v + off, m, H_kv, D, pos.data(), dv, int64_t(n) * D, dt);
    i = j;
  }
  return true;
}

const float* host_view(Backend& be, const float* p, size_t n, std::vector<float>& staging) {
  if (be.host_memory()) return p;
  staging.resize(n);
  be.download(staging.data(), p, n * 4);
  return staging.data();
}

AttentionArgs attention_args(const KvShape& s, std::span<const AttnRow> rows, const float* q, float scale, float* out,
                             DType kv_dtype) {
  return attention_args(s.H, s.H_kv, s.D, scale, q, rows, out, kv_dtype);
}

void grow_allocation(MemorySystem& mem, Tier tier, Allocation& a, int64_t bytes, bool slack, MemUse use) {
  if (a.bytes() >= bytes) return;
  const int64_t want = slack ? std::max(bytes, a.bytes() + a.bytes() / 2) : bytes;
  a = {};
  auto r = mem.try_allocate(tier, want, use);
  a = std::holds_alternative<Allocation>(r) ? std::move(std::get<Allocation>(r)) : mem.allocate(tier, bytes, use);
}

}  // namespace hg
