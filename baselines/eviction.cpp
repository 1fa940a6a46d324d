// Shared engine of the eviction strategies.
#include "baselines/eviction.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "engine/core/error.h"

namespace hg {

EvictingStrategy::EvictingStrategy(const StrategyContext& ctx, const char* name, const StrategyParams& p)
    : be_(ctx.backend), rt_(require_runtime(ctx, name)), home_dram_(p.get("kv_home") == "dram") {}

ParamSpec kv_home_param() {
  return {"kv_home", ParamSpec::Type::kEnum, "dram", "",
          "where retained KV lives between steps: dram (sent to the accelerator every layer and step, as on the "
          "FlexGen engine of the paper's baselines) or gpu",
          {"dram", "gpu"}};
}

void EvictingStrategy::begin(const KvShape& shape, std::span<const int32_t> capacity,
                             std::span<const int32_t> prompt_len) {
  shape_ = shape;
  prompt_.assign(prompt_len.begin(), prompt_len.end());
  capacity_.assign(capacity.begin(), capacity.end());
  context_.assign(prompt_.begin(), prompt_.end());
  std::vector<int32_t> slots(prompt_.size());
  for (size_t b = 0; b < prompt_.size(); ++b) slots[b] = std::max(prompt_[b], budget(int(b), capacity_[b])) + 1;
  store_.reset(shape, slots, rt_.memory(), home_dram_ ? Tier::kDram : Tier::kGpu);
  staged_.clear();
  scores_.assign(size_t(shape.n_layers) * prompt_.size() * size_t(shape.H_kv), {});
  for (size_t i = 0; i < scores_.size(); ++i) scores_[i].assign(size_t(slots[(i / size_t(shape.H_kv)) % prompt_.size()]), 0.0);
  evicted_ = 0;
}

void EvictingStrategy::evict_to(int layer, int seq, int32_t keep) {
  for (int g = 0; g < shape_.H_kv; ++g) {
    const int32_t n = store_.count(layer, seq, g);
    if (n <= keep) continue;
    victims(layer, seq, g, n - keep, victims_);
    HG_CHECK(int32_t(victims_.size()) == n - keep);
    // Dropped in the policy's order. Each removal moves the last slot into the freed one, so a victim
    // still to come that sat in the last slot is followed there (the slots then end as if the
    // victims had been picked one at a time).
    pending_.assign(size_t(n), -1);
    for (size_t i = 0; i < victims_.size(); ++i) pending_[size_t(victims_[i])] = int32_t(i);
    auto& sc = scores(layer, seq, g);
    for (size_t i = 0; i < victims_.size(); ++i) {
      const int32_t s = victims_[i];
      const int32_t moved = store_.remove(layer, seq, g, s);
      sc[size_t(s)] = sc[size_t(moved)];
      sc[size_t(moved)] = 0.0;
      pending_[size_t(s)] = pending_[size_t(moved)];
      if (pending_[size_t(s)] >= 0 && moved != s) victims_[size_t(pending_[size_t(s)])] = s;
      pending_[size_t(moved)] = -1;
      ++evicted_;
    }
  }
}

void EvictingStrategy::append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) {
  const int D = shape_.D, Hkv = shape_.H_kv;
  // Prefill selection: the first decode step prunes the prompt to the budget.
  for (auto& r : rows)
    if (r.pos == prompt_len(r.seq) && r.pos > 0) {
      context_[size_t(r.seq)] = r.pos;
      evict_to(layer, r.seq, budget(r.seq, r.pos));
    }
  // Keys stored pre-RoPE (rotated back by their original position) where the policy re-rotates.
  const float* ks = k;
  if (cache_positions() && shape_.rope) {
    kin_.assign(k, k + rows.size() * size_t(Hkv) * size_t(D));
    for (size_t i = 0; i < rows.size(); ++i) {
      const int32_t neg = -rows[i].pos;
      be_.rope(kin_.data() + int64_t(i) * Hkv * D, 1, Hkv, D, &neg, *shape_.rope);
    }
    ks = kin_.data();
  }
  auto insert = [&] {
    for (size_t i = 0; i < rows.size(); ++i)
      for (int g = 0; g < Hkv; ++g) {
        const int64_t at = (int64_t(i) * Hkv + g) * D;
        const int32_t s = store_.insert(layer, rows[i].seq, g, rows[i].pos, ks + at, v + at);
        scores(layer, rows[i].seq, g)[size_t(s)] = 0.0;
      }
  };
  if (!home_dram_) return insert();
  // The new tokens' K and V, computed on the accelerator, go to their home in dram.
  rt_.transfers().run(Tier::kGpu, Tier::kDram, int64_t(rows.size()) * Hkv * D * 4 * 2, insert, {}, "kv to dram").wait();
}

std::map<int32_t, std::pair<const float*, const float*>> EvictingStrategy::kv_on_accelerator(
    int layer, std::span<const TokenRow> rows) {
  std::map<int32_t, std::pair<const float*, const float*>> at;
  for (auto& r : rows) at[r.seq] = {store_.k(layer, r.seq), store_.v(layer, r.seq)};
  if (!home_dram_) return at;
  const int D = shape_.D, Hkv = shape_.H_kv;
  int64_t bytes = 0;
  for (auto& [seq, kv] : at) {
    const int64_t stride = store_.head_stride(seq);
    Allocation& a = staged_[seq];
    grow_allocation(rt_.memory(), Tier::kGpu, a, int64_t(2) * Hkv * stride * 4, true);
    for (int g = 0; g < Hkv; ++g) bytes += int64_t(2) * store_.count(layer, seq, g) * D * 4;
    kv = {a.as<float>(), a.as<float>() + Hkv * stride};
  }
  // Each head's retained slots [0, count), K then V, in the store's layout.
  rt_.transfers()
      .run(
          Tier::kDram, Tier::kGpu, bytes,
          [&] {
            for (auto& [seq, kv] : at) {
              const int64_t stride = store_.head_stride(seq);
              for (int g = 0; g < Hkv; ++g) {
                const size_t len = size_t(store_.count(layer, seq, g)) * size_t(D) * 4;
                float* dst = staged_.at(seq).as<float>();
                be_.upload(dst + g * stride, store_.k(layer, seq) + g * stride, len);
                be_.upload(dst + (Hkv + g) * stride, store_.v(layer, seq) + g * stride, len);
              }
            }
          },
          {}, "retained kv to the accelerator")
      .wait();
  return at;
}

void EvictingStrategy::attend(int layer, std::span<const TokenRow> rows, const float* q, float scale, float* out) {
  const int H = shape_.H, Hkv = shape_.H_kv, D = shape_.D, G = group();
  int64_t ld = 0;
  for (auto& r : rows) ld = std::max<int64_t>(ld, store_.capacity(r.seq));
  // Rows per attention call: the taps of a block stay within kTapBytes (a prefill chunk's whole taps
  // would be rows · H · ld floats each: 1 GB per tap for 512 rows at 16K), so that the policy reads
  // them back from cache.
  constexpr size_t kTapBytes = size_t(8) << 20;
  const size_t block = taps() == 0
                           ? rows.size()
                           : std::clamp<size_t>(kTapBytes / (size_t(H) * size_t(ld) * 4), 1, rows.size());
  const size_t tap_floats = block * size_t(H) * size_t(ld);
  if (taps() & kLogits) logits_.resize(tap_floats);
  if (taps() & kProbs) probs_.resize(tap_floats);
  attn_rows_.resize(rows.size());
  const bool rerotate = cache_positions() && shape_.rope;
  const float* qa = q;
  rotated_.clear();
  krot_used_ = 0;
  rot_off_.resize(rows.size());
  const auto kv = kv_on_accelerator(layer, rows);
  if (rerotate) {
    qrot_.assign(q, q + rows.size() * size_t(H) * size_t(D));
    qa = qrot_.data();
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const TokenRow r = rows[i];
    // Slots are in position order during prefill (nothing evicted yet): row at pos p sees p + 1.
    const int32_t n = r.pos < prompt_len(r.seq) ? r.pos + 1 : store_.count(layer, r.seq, 0);
    AttnRow ar{kv.at(r.seq).first, kv.at(r.seq).second, store_.head_stride(r.seq), n};
    if (rerotate) {
      // Keys at their rank within the cache (0..n-1), the query at the current token's rank. One
      // rotated copy per sequence and call: during prefill nothing was evicted, so ranks equal
      // positions and every row of the chunk reads a prefix of the same copy.
      auto it = rotated_.find(r.seq);
      if (it == rotated_.end()) {
        int32_t nmax = 0;
        for (auto& x : rows)
          if (x.seq == r.seq) nmax = std::max(nmax, x.pos < prompt_len(x.seq) ? x.pos + 1 : store_.count(layer, x.seq, 0));
        const size_t off = krot_used_;
        krot_used_ += size_t(Hkv) * size_t(ld) * size_t(D);
        if (krot_.size() < krot_used_) krot_.resize(krot_used_);
        if (tmp_.size() < krot_used_) tmp_.resize(krot_used_);
        float* kb = krot_.data() + off;
        float* vb = tmp_.data() + off;
        // Each head's keys and values in position order, so that row j of every head holds rank j:
        // one RoPE call then rotates all heads, one sine and cosine per rank (not per rank and head).
        // The keys are rotated in a [rank][head][D] copy and then laid out per head for attention.
        // The taps would follow rank order too, so a policy that re-rotates reads none.
        HG_CHECK(taps() == 0);
        if (kstage_.size() < size_t(nmax) * size_t(Hkv) * size_t(D))
          kstage_.resize(size_t(nmax) * size_t(Hkv) * size_t(D));
        std::vector<int32_t> order(static_cast<size_t>(nmax));
        for (int g = 0; g < Hkv; ++g) {
          const int32_t* pos = store_.positions(layer, r.seq, g);
          std::iota(order.begin(), order.end(), 0);
          std::sort(order.begin(), order.end(), [&](int32_t a2, int32_t b2) { return pos[a2] < pos[b2]; });
          const float* ks = kv.at(r.seq).first + g * store_.head_stride(r.seq);
          const float* vs = kv.at(r.seq).second + g * store_.head_stride(r.seq);
          for (int32_t j = 0; j < nmax; ++j) {
            const int64_t src = int64_t(order[size_t(j)]) * D;
            std::copy(ks + src, ks + src + D, kstage_.data() + (int64_t(j) * Hkv + g) * D);
            std::copy(vs + src, vs + src + D, vb + (int64_t(g) * ld + j) * D);  // V in K's layout
          }
        }
        if (ranks_.size() < size_t(nmax)) {
          ranks_.resize(size_t(nmax));
          std::iota(ranks_.begin(), ranks_.end(), 0);
        }
        be_.rope(kstage_.data(), nmax, Hkv, D, ranks_.data(), *shape_.rope);
        for (int g = 0; g < Hkv; ++g)
          for (int32_t j = 0; j < nmax; ++j)
            std::copy_n(kstage_.data() + (int64_t(j) * Hkv + g) * D, D, kb + (int64_t(g) * ld + j) * D);
        it = rotated_.emplace(r.seq, off).first;
      }
      const int32_t delta = (n - 1) - r.pos;  // current token's cache position minus its position
      if (delta != 0) be_.rope(qrot_.data() + i * size_t(H) * size_t(D), 1, H, D, &delta, *shape_.rope);
      ar.head_stride = ld * D;
      rot_off_[i] = it->second;
    }
    attn_rows_[i] = ar;
  }
  // The rotated copies' addresses once every sequence's copy exists (a later one may grow them).
  if (rerotate)
    for (size_t i = 0; i < rows.size(); ++i) {
      attn_rows_[i].k = krot_.data() + rot_off_[i];
      attn_rows_[i].v = tmp_.data() + rot_off_[i];
    }
  for (size_t b0 = 0; b0 < rows.size(); b0 += block) {
    const size_t nb = std::min(block, rows.size() - b0);
    const size_t qoff = b0 * size_t(H) * size_t(D);
    AttentionArgs a = attention_args(shape_, std::span<const AttnRow>(attn_rows_).subspan(b0, nb), qa + qoff,
                                     scale, out + qoff);
    a.logits_out = taps() & kLogits ? logits_.data() : nullptr;
    a.probs_out = taps() & kProbs ? probs_.data() : nullptr;
    a.tap_ld = ld;
    be_.attention(a);
    // Dry runs have no values to score: which tokens are evicted does not change the counts.
    if (taps() != 0 && !rt_.dry())
      for (size_t i = 0; i < nb; ++i) {
        const TokenRow r = rows[b0 + i];
        const size_t off = (i * size_t(H)) * size_t(ld);
        for (int g = 0; g < Hkv; ++g)
          accumulate(layer, r.seq, g,
                     a.logits_out ? a.logits_out + off + size_t(g * G) * size_t(ld) : nullptr,
                     a.probs_out ? a.probs_out + off + size_t(g * G) * size_t(ld) : nullptr, ld,
                     attn_rows_[b0 + i].n_keys, r.pos);
      }
  }
  // Decode rows: back to the budget.
  for (auto& r : rows)
    if (r.pos >= prompt_len(r.seq)) {
      context_[size_t(r.seq)] = r.pos;
      evict_to(layer, r.seq, budget(r.seq, r.pos));
    }
}

void EvictingStrategy::lowest_non_recent(int layer, int seq, int g, int32_t recent, int32_t count,
                                         std::vector<int32_t>& slots) {
  const int32_t n = store_.count(layer, seq, g);
  const int32_t* pos = store_.positions(layer, seq, g);
  std::vector<int32_t> p(pos, pos + n);
  std::nth_element(p.begin(), p.begin() + std::max(0, n - recent), p.end());
  const int32_t cut = recent >= n ? INT32_MIN : p[size_t(n - recent)];  // positions >= cut are recent
  const auto& sc = scores(layer, seq, g);
  slots.clear();
  for (int32_t s = 0; s < n; ++s)
    if (recent <= 0 || pos[s] < cut) slots.push_back(s);
  if (int32_t(slots.size()) < count)
    throw std::logic_error("eviction: fewer tokens outside the recent window than must be evicted");
  // Lowest score; ties go to the oldest token.
  const auto before = [&](int32_t a, int32_t b) {
    return sc[size_t(a)] < sc[size_t(b)] || (sc[size_t(a)] == sc[size_t(b)] && pos[a] < pos[b]);
  };
  first_in_order(slots, count, before);
}

std::map<std::string, double> EvictingStrategy::step_stats() const {
  double held = 0;
  for (size_t b = 0; b < prompt_.size(); ++b) held += store_.count(0, int(b), 0);
  return {{"held_tokens_layer0_head0", held}, {"evicted_total", double(evicted_)}};
}

}  // namespace hg
