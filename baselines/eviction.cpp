// Shared engine of the eviction strategies.
#include "baselines/eviction.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "engine/core/error.h"

namespace hg {

EvictingStrategy::EvictingStrategy(const StrategyContext& ctx, const char* name, const StrategyParams& p)
    : be_(ctx.backend),
      rt_(require_runtime(ctx, name)),
      kv_(ctx, p),
      kv_home_(p.get("kv_home")),
      overlap_(p.get_bool("overlap")),
      sequence_basis_(p.get("budget_basis") == "sequence") {
  if (const double b = p.get_float("budget"); b > 0) budget_ = b;
}

std::map<std::string, std::string> EvictingStrategy::effective_params() const {
  std::map<std::string, std::string> e = kv_.effective();
  if (kv_home_ == "auto")
    e["kv_home"] = gpu_layers_ == shape_.n_layers ? "gpu" : gpu_layers_ == 0 ? "dram" : "split";
  e["gpu_kv_layers"] = std::to_string(gpu_layers_);
  return e;
}

ParamSpec budget_basis_param() {
  return {"budget_basis",
          ParamSpec::Type::kEnum,
          "context",
          "",
          "what a ratio budget is a fraction of: the context so far (decode-time eviction), or the sequence's "
          "whole length (prompt and tokens to come, as the authors' attention masks size it)",
          {"context", "sequence"}};
}

ParamSpec kv_home_param() {
  return {
      "kv_home",
      ParamSpec::Type::kEnum,
      "auto",
      "",
      "where retained KV lives between steps: dram (offloaded as FlexGen's cache is, sent to the accelerator "
      "every layer and step), gpu, or auto (as many whole layers on the accelerator as the experiment's "
      "gpu_kv_bytes holds beside two staging layers, the rest on dram; dram without a budget)",
      {"auto", "dram", "gpu"}};
}

void EvictingStrategy::begin(const KvShape& shape, std::span<const int32_t> capacity,
                             std::span<const int32_t> prompt_len) {
  shape_ = shape;
  prompt_.assign(prompt_len.begin(), prompt_len.end());
  capacity_.assign(capacity.begin(), capacity.end());
  context_.assign(prompt_.begin(), prompt_.end());
  std::vector<int32_t> slots(prompt_.size());
  for (size_t b = 0; b < prompt_.size(); ++b)
    slots[b] = std::max(prompt_[b], budget(int(b), capacity_[b])) + 1;
  settle();
  // What fits stays on the accelerator: whole layers of the store (every sequence), as FlexGen's
  // resident layers, the others streamed through the two staging copies.
  int64_t layer_bytes = 0;
  for (int32_t n : slots) layer_bytes += int64_t(2) * shape.H_kv * kv_.bytes(int64_t(n) * shape.D);
  gpu_layers_ = kv_home_ == "gpu" ? shape.n_layers
                : kv_home_ == "dram"
                    ? 0
                    : layers_within_budget(rt_.memory().kv_budget(), layer_bytes, shape.n_layers);
  store_.reset(shape, slots, rt_.memory(), Tier::kDram, &be_, kv_.dtype(), gpu_layers_);
  for (auto& s : staged_) s.clear();
  version_.assign(size_t(shape.n_layers) * prompt_.size(), 0);
  exposed_ = exposed_last_ = 0;
  // A dry run ranks nothing (no taps; evict_to drops the last slots): no score records.
  score_off_.assign(size_t(shape.n_layers) * prompt_.size(), 0);
  size_t records = 0;
  for (int l = 0; l < shape.n_layers; ++l)
    for (size_t b = 0; b < prompt_.size(); ++b)
      score_off_[vidx(l, int(b))] = records, records += size_t(shape.H_kv) * size_t(slots[b]);
  const bool scored = taps() != 0 && !rt_.dry();
  if (!scored) records = 0;
  if (score_slots_.size() < records) score_slots_ = BackendArray<PolicyOps::ScoreSlot>(be_, records);
  // The step's victims: room for two per layer, sequence and KV head (one is a decode step's).
  queued_.clear(), picks_.clear();
  picked_used_ = 0;
  const size_t victims = scored ? std::max<size_t>(64, size_t(2 * shape.n_layers * shape.H_kv) * prompt_.size()) : 0;
  if (picked_.size() < victims) picked_ = BackendArray<int32_t>(be_, victims);
  evicted_ = 0;
}

void EvictingStrategy::victims(int, int, int, int32_t, std::vector<int32_t>&) {
  throw std::logic_error("eviction: a policy without taps must pick its victims");
}

void EvictingStrategy::evict_to(int layer, const std::vector<std::pair<int32_t, int32_t>>& keeps, bool defer) {
  if (!(taps() != 0 && !rt_.dry())) {
    // No scores: the policy's own victims, or in a dry run (nothing to rank, and which slots go does
    // not change what moves) the last ones, whose removal moves no row.
    for (auto [seq, keep] : keeps)
      for (int g = 0; g < shape_.H_kv; ++g) {
        const int32_t n = store_.count(layer, seq, g);
        if (n <= keep) continue;
        if (rt_.dry()) {
          victims_.resize(size_t(n - keep));
          for (int32_t i = 0; i < n - keep; ++i) victims_[size_t(i)] = n - 1 - i;
        } else {
          victims(layer, seq, g, n - keep, victims_);
        }
        remove_victims(layer, seq, g, keep, false);
      }
    store_.flush_removals(layer);
    return;
  }
  // A scoring policy's victims: every head of every listed sequence in one pick on the accelerator,
  // into the step's victims buffer; read back (one download) when they are applied.
  int64_t total = 0;
  for (auto [seq, keep] : keeps)
    for (int g = 0; g < shape_.H_kv; ++g) total += std::max(0, store_.count(layer, seq, g) - keep);
  if (total == 0) return;
  if (picked_used_ + total > int64_t(picked_.size())) {
    // No room left in this step's buffer: apply what is queued (other layers), then grow it if this
    // layer needs more.
    apply_evictions();
    if (int64_t(picked_.size()) < total) picked_ = BackendArray<int32_t>(be_, size_t(2 * total));
  }
  // A pooling policy (SnapKV) smooths each head's scores over its candidates (the slots before the
  // recent window, in position order: nothing was evicted before this pruning) before the pick.
  const bool pooled = pool_kernel() > 0;
  pools_.clear();
  const size_t first = picks_.size();
  for (auto [seq, keep] : keeps)
    for (int g = 0; g < shape_.H_kv; ++g)
      if (const int32_t n = store_.count(layer, seq, g); n > keep) {
        PolicyOps::ScoreSlot* slots = score_slots(layer, seq) + int64_t(g) * store_.capacity(seq);
        const int32_t recent = recent_window(seq);
        picks_.push_back({slots, n, recent, n - keep, picked_used_});
        picked_used_ += n - keep;
        if (!pooled) continue;
        const int32_t* pos = store_.positions(layer, seq, g);
        for (int32_t s = 0; s < n; ++s)
          if (pos[s] != s) throw std::logic_error("eviction: pooled scores need the slots in position order");
        pools_.push_back({slots, n - std::min(recent, n)});
      }
  if (pooled) be_.pool_scores(pools_.data(), int64_t(pools_.size()), pool_kernel(), pool_max());
  be_.pick_evictions(picks_.data() + first, int64_t(picks_.size() - first), picked_.data());
  queued_.push_back({layer, keeps, first});
  if (!defer) apply_evictions();
}

void EvictingStrategy::apply_evictions() {
  if (queued_.empty()) return;
  picked_host_.resize(size_t(picked_used_));
  be_.download(picked_host_.data(), picked_.data(), size_t(picked_used_) * 4);
  for (const QueuedEviction& q : queued_) {
    slot_moves_.clear();
    size_t next_pick = q.first_pick;
    for (auto [seq, keep] : q.keeps)
      for (int g = 0; g < shape_.H_kv; ++g) {
        const int32_t n = store_.count(q.layer, seq, g);
        if (n <= keep) continue;
        const auto& pk = picks_[next_pick++];
        HG_CHECK(pk.n == n && pk.count == n - keep);
        victims_.assign(picked_host_.begin() + pk.at, picked_host_.begin() + pk.at + pk.count);
        for (int32_t v : victims_)
          if (v < 0 || v >= n) throw std::logic_error("eviction: the accelerator picked slot " + std::to_string(v) +
                                                      " of " + std::to_string(n));
        remove_victims(q.layer, seq, g, keep, true);
      }
    if (!slot_moves_.dst.empty()) slot_moves_.run(be_, int64_t(sizeof(PolicyOps::ScoreSlot)));
    store_.flush_removals(q.layer);
  }
  queued_.clear(), picks_.clear();
  picked_used_ = 0;
}

void EvictingStrategy::remove_victims(int layer, int seq, int g, int32_t keep, bool scored) {
  const int32_t n = store_.count(layer, seq, g);
  HG_CHECK(int32_t(victims_.size()) == n - keep);
  ++version(layer, seq);
  // Dropped in the policy's order. Each removal moves the last slot into the freed one, so a victim
  // still to come that sat in the last slot is followed there (the slots then end as if the
  // victims had been picked one at a time).
  pending_.assign(size_t(n), -1);
  for (size_t i = 0; i < victims_.size(); ++i) pending_[size_t(victims_[i])] = int32_t(i);
  if (scored) origin_.resize(size_t(n)), std::iota(origin_.begin(), origin_.end(), 0);
  // The i-th removal moves slot n-1-i (the last live one); the slots followed first, then removed
  // from the store in that order, its rows moved once after every head (flush_removals).
  for (size_t i = 0; i < victims_.size(); ++i) {
    const int32_t s = victims_[i];
    const int32_t moved = n - 1 - int32_t(i);
    if (scored) origin_[size_t(s)] = origin_[size_t(moved)];
    pending_[size_t(s)] = pending_[size_t(moved)];
    if (pending_[size_t(s)] >= 0 && moved != s) victims_[size_t(pending_[size_t(s)])] = s;
    pending_[size_t(moved)] = -1;
    ++evicted_;
  }
  // The score records follow their tokens: each kept slot that changed reads the record its token
  // had at the start (those lie past the kept count, so the moves commute: one copy_rows a layer).
  if (scored) {
    PolicyOps::ScoreSlot* rec = score_slots(layer, seq) + int64_t(g) * store_.capacity(seq);
    for (int32_t s : victims_)
      if (s < keep && origin_[size_t(s)] != s) slot_moves_.add(rec + s, rec + origin_[size_t(s)]);
  }
  store_.remove_deferred(layer, seq, g, victims_, moved_);
}

void EvictingStrategy::append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) {
  const int D = shape_.D, Hkv = shape_.H_kv;
  // Prefill selection: the first decode step prunes the prompt to the budget.
  std::vector<std::pair<int32_t, int32_t>> prune;
  for (auto& r : rows)
    if (r.pos == prompt_len(r.seq) && r.pos > 0) {
      context_[size_t(r.seq)] = r.pos;
      prune.emplace_back(r.seq, keep(r.seq, r.pos));
    }
  if (!prune.empty()) evict_to(layer, prune, false);  // attended now
  // Keys stored pre-RoPE (rotated back by their original position) where the policy re-rotates;
  // rotated on the accelerator, in its memory.
  const size_t n = rows.size() * size_t(Hkv) * size_t(D);
  const float* ks = k;
  if (cache_positions() && shape_.rope) {
    if (kin_.size() < n) kin_ = BackendArray<float>(be_, n);
    be_.copy(kin_.data(), k, n * 4);
    q_delta_.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) q_delta_[i] = -rows[i].pos;
    be_.rope(kin_.data(), int64_t(rows.size()), Hkv, D, q_delta_.data(), *shape_.rope);  // every row at once
    ks = kin_.data();
  }
  new_k_ = ks, new_v_ = v;  // as stored: what an overlapped load adds to its staged copy
  // Rows in the store's memory: the accelerator's (kv_home gpu) or dram.
  // A scoring policy's new slots start at score 0 with their token's position: one put_rows.
  const bool scored = taps() != 0 && !rt_.dry();
  new_slots_.clear(), new_slot_at_.clear();
  auto insert = [&](const float* kr, const float* vr) {
    slots_.resize(size_t(Hkv));
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t at = int64_t(i) * Hkv * D;
      store_.insert_heads(layer, rows[i].seq, rows[i].pos, kr + at, vr + at, slots_.data());
      if (!scored) continue;
      PolicyOps::ScoreSlot* rec = score_slots(layer, rows[i].seq);
      for (int g = 0; g < Hkv; ++g) {
        new_slots_.push_back({0.0, rows[i].pos, 0});
        new_slot_at_.push_back(rec + int64_t(g) * store_.capacity(rows[i].seq) + slots_[size_t(g)]);
      }
    }
    if (!new_slots_.empty())
      be_.put_rows(new_slot_at_.data(), new_slots_.data(), int64_t(sizeof(PolicyOps::ScoreSlot)),
                   int64_t(new_slots_.size()));
  };
  if (!home_dram(layer)) return insert(ks, v);
  // The new tokens' K and V, computed on the accelerator, go to their home in dram.
  rt_.transfers()
      .run(
          Tier::kGpu, Tier::kDram, kv_.bytes(int64_t(n)) * 2,
          [&] {
            std::vector<float> hk, hv;
            insert(host_view(be_, ks, n, hk), host_view(be_, v, n, hv));
          },
          {}, "kv to dram")
      .wait();
}

Event EvictingStrategy::load_retained(int layer, std::map<int32_t, std::vector<int32_t>> counts) {
  const int D = shape_.D, Hkv = shape_.H_kv, par = layer % 2;
  int64_t bytes = 0;
  for (auto& [seq, n] : counts) {
    const int64_t stride = store_.head_stride(seq);
    grow_allocation(rt_.memory(), Tier::kGpu, staged_[par][seq], int64_t(2) * kv_.bytes(Hkv * stride), true, MemUse::kKv);
    for (int g = 0; g < Hkv; ++g) bytes += int64_t(2) * kv_.bytes(int64_t(n[size_t(g)]) * D);
  }
  // Each head's retained slots [0, count), K then V, in the store's layout; the counts as they were
  // when the load was queued (a decode row's append may add a slot while it runs).
  return rt_.transfers().run(
      Tier::kDram, Tier::kGpu, bytes,
      [this, layer, par, counts, D, Hkv] {
        for (const auto& entry : counts) {
          const int seq = entry.first;
          const auto& n = entry.second;
          const int64_t stride = kv_.bytes(store_.head_stride(seq));
          const char* K = static_cast<const char*>(store_.k_raw(layer, seq));
          const char* V = static_cast<const char*>(store_.v_raw(layer, seq));
          char* dst = staged_[par].at(seq).as<char>();
          // Heads holding the same count (a per-head budget, once the prompt is pruned): one
          // strided copy each for K and V; else one per head.
          if (std::all_of(n.begin(), n.end(), [&](int32_t c) { return c == n[0]; })) {
            const size_t len = size_t(kv_.bytes(int64_t(n[0]) * D)), pitch = size_t(stride);
            be_.upload_2d(dst, pitch, K, pitch, len, size_t(Hkv));
            be_.upload_2d(dst + Hkv * stride, pitch, V, pitch, len, size_t(Hkv));
            continue;
          }
          for (int g = 0; g < Hkv; ++g) {
            const size_t len = size_t(kv_.bytes(int64_t(n[size_t(g)]) * D));
            be_.upload(dst + g * stride, K + g * stride, len);
            be_.upload(dst + (Hkv + g) * stride, V + g * stride, len);
          }
        }
      },
      {}, "retained kv to the accelerator, layer " + std::to_string(layer));
}

std::map<int32_t, std::vector<int32_t>> EvictingStrategy::retained_counts(int layer,
                                                                        std::span<const TokenRow> rows) const {
  std::map<int32_t, std::vector<int32_t>> c;
  for (auto& r : rows) {
    auto& v = c[r.seq];
    if (!v.empty()) continue;
    for (int g = 0; g < shape_.H_kv; ++g) v.push_back(store_.count(layer, r.seq, g));
  }
  return c;
}

void EvictingStrategy::prefetch(int layer, std::span<const TokenRow> rows, bool next_step) {
  if (layer >= shape_.n_layers || !home_dram(layer) || !overlap_) return;
  for (auto& r : rows) {
    if (r.pos < prompt_len(r.seq)) return;  // prefill chunks load what they need when they run
    if (!next_step && r.pos == prompt_len(r.seq)) return;  // the first decode step prunes the layer first
  }
  Prefetch& p = prefetch_[size_t(layer % 2)];
  if (p.done.valid()) p.done.wait();
  p.layer = layer;
  p.counts = retained_counts(layer, rows);
  p.version.clear();
  for (auto& [seq, n] : p.counts) p.version[seq] = version(layer, seq);
  p.done = load_retained(layer, p.counts);
}

void EvictingStrategy::settle() {
  for (auto& p : prefetch_) {
    if (p.done.valid()) p.done.wait();
    p = {};
  }
}

bool EvictingStrategy::prefetch_serves(int layer, std::span<const TokenRow> rows,
                                       const std::map<int32_t, std::vector<int32_t>>& counts) const {
  // It was for this layer, nothing was evicted since, and the only slots added since are this
  // call's decode rows (appended last, so the load holds all the others).
  const Prefetch& p = prefetch_[size_t(layer % 2)];
  if (!p.done.valid() || p.layer != layer || p.counts.size() != counts.size()) return false;
  for (auto& [sq, n] : counts) {
    const int32_t seq = sq;  // a structured binding cannot be captured by clang 14
    auto it = p.counts.find(seq);
    if (it == p.counts.end() || p.version.at(seq) != version_[vidx(layer, seq)]) return false;
    const auto added = int32_t(std::count_if(rows.begin(), rows.end(), [&](const TokenRow& r) { return r.seq == seq; }));
    for (size_t g = 0; g < n.size(); ++g)
      if (n[g] != it->second[g] + added) return false;
  }
  return true;
}

std::map<int32_t, std::pair<const void*, const void*>> EvictingStrategy::kv_on_accelerator(
    int layer, std::span<const TokenRow> rows) {
  std::map<int32_t, std::pair<const void*, const void*>> at;
  for (auto& r : rows) at[r.seq] = {store_.k_raw(layer, r.seq), store_.v_raw(layer, r.seq)};
  if (!home_dram(layer)) return at;
  const int D = shape_.D, Hkv = shape_.H_kv, par = layer % 2;
  const auto counts = retained_counts(layer, rows);
  Prefetch& p = prefetch_[size_t(par)];
  // A prefill call that begins its sequences (nothing of them stored before it): every key it
  // attends is one of its own rows, already on the accelerator, written into the staged copy there.
  const auto first = first_new_position(rows);
  const bool fresh = std::all_of(rows.begin(), rows.end(), [&](const TokenRow& r) { return r.pos < prompt_len(r.seq); }) &&
                     std::all_of(first.begin(), first.end(), [](const auto& f) { return f.second == 0; });
  if (fresh) {
    std::vector<int32_t> pos;
    for (size_t i0 = 0; i0 < rows.size();) {
      size_t i1 = i0;
      pos.clear();
      while (i1 < rows.size() && rows[i1].seq == rows[i0].seq) pos.push_back(rows[i1++].pos);
      const int32_t seq = rows[i0].seq;
      const int64_t stride = store_.head_stride(seq);
      grow_allocation(rt_.memory(), Tier::kGpu, staged_[par][seq], int64_t(2) * kv_.bytes(Hkv * stride), true, MemUse::kKv);
      char* dst = staged_[par].at(seq).as<char>();
      const int64_t at_row = int64_t(i0) * Hkv * D;
      be_.write_kv(new_k_ + at_row, int64_t(i1 - i0), Hkv, D, pos.data(), dst, stride, kv_.dtype());
      be_.write_kv(new_v_ + at_row, int64_t(i1 - i0), Hkv, D, pos.data(), dst + kv_.bytes(Hkv * stride), stride,
                   kv_.dtype());
      i0 = i1;
    }
  } else if (prefetch_serves(layer, rows, counts)) {
    p.done.wait();
    // The decode rows' own K and V: already on the accelerator (appended from there), written into
    // their slots of the staged copy in the store's element type.
    for (size_t i = 0; i < rows.size(); ++i) {
      const TokenRow r = rows[i];
      const int64_t stride = store_.head_stride(r.seq);
      char* dst = staged_[par].at(r.seq).as<char>();
      // Each head's last slot (the counts include this row): one write each for K and V.
      slots_.resize(size_t(Hkv));
      for (int g = 0; g < Hkv; ++g) slots_[size_t(g)] = counts.at(r.seq)[size_t(g)] - 1;
      const int64_t at_row = int64_t(i) * Hkv * D;
      write_head_slots(&be_, new_k_ + at_row, new_v_ + at_row, Hkv, D, slots_.data(), int32_t(stride / D), dst,
                       dst + kv_.bytes(Hkv * stride), kv_.dtype(), rows_);
    }
  } else {
    ++exposed_;  // a load the step waits for
    if (p.done.valid()) p.done.wait();
    p = {};
    load_retained(layer, counts).wait();
  }
  p.done = {};
  for (auto& [seq, kv] : at) {
    char* a = staged_[par].at(seq).as<char>();
    kv = {a, a + kv_.bytes(Hkv * store_.head_stride(seq))};
  }
  return at;
}

void EvictingStrategy::attend(int layer, std::span<const TokenRow> rows, const float* q, float scale,
                              float* out) {
  const int H = shape_.H, Hkv = shape_.H_kv, D = shape_.D;
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
  // The taps in the accelerator's memory, where the policy reads them.
  if ((taps() & kLogits) && logits_.size() < tap_floats) logits_ = BackendArray<float>(be_, tap_floats);
  if ((taps() & kProbs) && probs_.size() < tap_floats) probs_ = BackendArray<float>(be_, tap_floats);
  attn_rows_.resize(rows.size());
  const bool rerotate = cache_positions() && shape_.rope;
  const auto kv = kv_on_accelerator(layer, rows);
  const float* qa = q;
  if (rerotate) {
    // One copy per sequence of the call, sized first so that one buffer holds them all: each head's
    // keys and values in position order (row j of every head holds rank j), keys rotated at their
    // rank. During prefill nothing was evicted, so ranks equal positions and every row of the chunk
    // reads a prefix of its sequence's copy. The taps would follow rank order too, so a policy that
    // re-rotates reads none.
    HG_CHECK(taps() == 0);
    rotated_.clear();
    size_t total = 0;
    for (auto& r : rows)
      if (rotated_.emplace(r.seq, total).second) total += size_t(Hkv) * size_t(ld) * size_t(D);
    if (krot_.size() < total)
      krot_ = BackendArray<float>(be_, total), vrot_ = BackendArray<float>(be_, total);
    // Per sequence, every head's rows in rank order in one copy_rows each for K and V (heads
    // nmax rows apart), one conversion of 16-bit rows to F32 and one rotation at the ranks.
    const int64_t row = kv_.bytes(D);
    const bool f32 = kv_.dtype() == DType::kF32;
    std::vector<int32_t> order;
    rot_stride_.clear();
    for (auto& [seq, off] : rotated_) {
      int32_t nmax = 0;
      for (auto& x : rows)
        if (x.seq == seq)
          nmax = std::max(nmax, x.pos < prompt_len(x.seq) ? x.pos + 1 : store_.count(layer, x.seq, 0));
      rot_stride_[seq] = nmax;
      const int64_t n_all = int64_t(Hkv) * nmax;
      if (ranks_.size() < size_t(n_all)) ranks_.resize(size_t(n_all));
      for (int64_t i = 0; i < n_all; ++i) ranks_[size_t(i)] = int32_t(i % std::max(nmax, 1));
      if (!f32 && rot_stage_.size() < size_t(2 * n_all * row))
        rot_stage_ = BackendArray<char>(be_, size_t(2 * n_all * row));
      const auto [ks, vs] = kv.at(seq);
      char* kto = f32 ? reinterpret_cast<char*>(krot_.data() + off) : rot_stage_.data();
      char* vto = f32 ? reinterpret_cast<char*>(vrot_.data() + off) : rot_stage_.data() + n_all * row;
      rot_rows_.clear();
      for (int kind = 0; kind < 2; ++kind)
        for (int g = 0; g < Hkv; ++g) {
          const int32_t* pos = store_.positions(layer, seq, g);
          order.resize(size_t(nmax));
          std::iota(order.begin(), order.end(), 0);
          if (!rt_.dry())  // a dry run's backend moves nothing, so the order it would move in is not needed
            std::sort(order.begin(), order.end(), [&](int32_t a2, int32_t b2) { return pos[a2] < pos[b2]; });
          const char* from = static_cast<const char*>(kind == 0 ? ks : vs) + kv_.bytes(g * store_.head_stride(seq));
          char* to = (kind == 0 ? kto : vto) + int64_t(g) * nmax * row;
          for (int32_t j = 0; j < nmax; ++j) rot_rows_.add(to + int64_t(j) * row, from + int64_t(order[size_t(j)]) * row);
        }
      rot_rows_.run(be_, row);
      if (!f32) {
        be_.convert_to_f32(kto, kv_.dtype(), n_all * D, krot_.data() + off);
        be_.convert_to_f32(vto, kv_.dtype(), n_all * D, vrot_.data() + off);
      }
      if (n_all > 0) be_.rope(krot_.data() + off, n_all, 1, D, ranks_.data(), *shape_.rope);
    }
    const size_t qn = rows.size() * size_t(H) * size_t(D);
    if (qrot_.size() < qn) qrot_ = BackendArray<float>(be_, qn);
    be_.copy(qrot_.data(), q, qn * 4);
    qa = qrot_.data();
  }
  q_delta_.assign(rows.size(), 0);
  bool any_delta = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const TokenRow r = rows[i];
    // Slots are in position order during prefill (nothing evicted yet): row at pos p sees p + 1.
    const int32_t n = r.pos < prompt_len(r.seq) ? r.pos + 1 : store_.count(layer, r.seq, 0);
    AttnRow ar{kv.at(r.seq).first, kv.at(r.seq).second, store_.head_stride(r.seq), n};
    if (rerotate) {
      q_delta_[i] = (n - 1) - r.pos;  // current token's cache position minus its position
      any_delta = any_delta || q_delta_[i] != 0;
      const size_t off = rotated_.at(r.seq);
      ar = AttnRow{krot_.data() + off, vrot_.data() + off, rot_stride_.at(r.seq) * D, n};
    }
    attn_rows_[i] = ar;
  }
  // Every row's query to its cache position in one rotation (a row at delta 0 is left as it is).
  if (any_delta) be_.rope(qrot_.data(), int64_t(rows.size()), H, D, q_delta_.data(), *shape_.rope);
  for (size_t b0 = 0; b0 < rows.size(); b0 += block) {
    const size_t nb = std::min(block, rows.size() - b0);
    const size_t qoff = b0 * size_t(H) * size_t(D);
    AttentionArgs a = attention_args(shape_, std::span<const AttnRow>(attn_rows_).subspan(b0, nb), qa + qoff,
                                     scale, out + qoff, rerotate ? DType::kF32 : kv_.dtype());
    // Taps only for a block with a row the policy scores.
    bool scoring = false;
    for (size_t i = 0; i < nb && taps() != 0; ++i) scoring = scoring || scores_row(rows[b0 + i].seq, rows[b0 + i].pos);
    a.logits_out = scoring && (taps() & kLogits) ? logits_.data() : nullptr;
    a.probs_out = scoring && (taps() & kProbs) ? probs_.data() : nullptr;
    a.tap_ld = ld;
    be_.attention(a);
    if (scoring) add_accel_work(tap_work(a));
    // Dry runs have no values to score: which tokens are evicted does not change the counts.
    if (!scoring || rt_.dry()) continue;
    // The block's scores accumulate where the taps are: one launch.
    const ScorePolicy sp = score_policy();
    PolicyOps::ScoreRows sr;
    sr.rule = sp.rule, sr.seed = sp.seed, sr.layer = layer, sr.H = H, sr.H_kv = Hkv, sr.tap_ld = ld;
    sr.taps = sp.rule == PolicyOps::ScoreRule::kSum ? a.probs_out : a.logits_out;
    HG_CHECK(sr.taps != nullptr);
    score_rows_.resize(nb);
    for (size_t i = 0; i < nb; ++i) {
      const TokenRow r = rows[b0 + i];
      // A row the policy does not score adds nothing (n = 0).
      const int32_t n_keys = scores_row(r.seq, r.pos) ? int32_t(attn_rows_[b0 + i].n_keys) : 0;
      score_rows_[i] = {score_slots(layer, r.seq), store_.capacity(r.seq), n_keys, r.pos, score_tau(r.seq, r.pos)};
    }
    sr.rows = score_rows_.data(), sr.n_rows = int64_t(nb);
    be_.accumulate_scores(sr);
  }
  // Decode rows: back to the budget of the context the next row comes after (this row included),
  // so that a budget of the whole context keeps every token.
  // A sequence with several decode rows in the call goes to the smallest of their budgets (as one
  // eviction per row in turn would leave it: its scores do not change in between).
  std::vector<std::pair<int32_t, int32_t>> decode_keeps;
  for (auto& r : rows)
    if (r.pos >= prompt_len(r.seq)) {
      context_[size_t(r.seq)] = r.pos + 1;
      const int32_t k = keep(r.seq, r.pos + 1);
      auto it = std::find_if(decode_keeps.begin(), decode_keeps.end(), [&](const auto& e) { return e.first == r.seq; });
      if (it == decode_keeps.end()) decode_keeps.emplace_back(r.seq, k);
      else it->second = std::min(it->second, k);
    }
  if (!decode_keeps.empty()) evict_to(layer, decode_keeps, true);  // applied at the step's end
  // The next layer's retained set is fixed now (its evictions ran last step): load it while this
  // layer's FFN and the next one's projections run; after the last layer, the next step's layer 0.
  if (layer + 1 < shape_.n_layers) prefetch(layer + 1, rows, false);
  else last_rows_.assign(rows.begin(), rows.end());
}

void EvictingStrategy::fork(int32_t src, int32_t, std::span<const int32_t> dst) {
  settle();  // a load in flight reads the store; dst's layers load afresh in the next step
  apply_evictions();
  for (int32_t d : dst) {
    for (int l = 0; l < shape_.n_layers; ++l) {
      store_.copy_sequence(l, src, d);
      ++version(l, d);
      if (score_slots_.size() == 0) continue;  // no scores (dry run, or a policy without taps)
      for (int g = 0; g < shape_.H_kv; ++g)
        if (const int32_t live = store_.count(l, src, g); live > 0)
          be_.copy(score_slots(l, d) + int64_t(g) * store_.capacity(d),
                   score_slots(l, src) + int64_t(g) * store_.capacity(src), size_t(live) * sizeof(PolicyOps::ScoreSlot));
    }
    context_[size_t(d)] = context_[size_t(src)];
  }
}

StageWork EvictingStrategy::tap_work(const AttentionArgs& a) const {
  int64_t keys = 0;
  for (int i = 0; i < a.n_rows; ++i) keys += a.rows[i].n_keys;
  const int64_t n = int64_t(a.H) * keys * ((taps() & kLogits ? 1 : 0) + (taps() & kProbs ? 1 : 0));
  StageWork w;
  w.bytes[size_t(Tier::kGpu)] = 2 * n * 4;  // written by the attention, read by the policy
  w.flops = double(n);                      // the policy's add per score
  w.elems = double(n) * policy_elems_per_score();
  return w;
}

void EvictingStrategy::end_step() {
  exposed_last_ = exposed_;
  exposed_ = 0;
  apply_evictions();  // before the next step's first load reads layer 0
  if (!last_rows_.empty()) prefetch(0, last_rows_, true);
  last_rows_.clear();
}

EvictingStrategy::~EvictingStrategy() {
  try {
    settle();
  } catch (...) {  // a failed load was reported to its reader already, or has none left
  }
}

std::map<std::string, double> EvictingStrategy::step_stats() const {
  double held = 0;
  for (size_t b = 0; b < prompt_.size(); ++b) held += store_.count(0, int(b), 0);
  return {{"held_tokens_layer0_head0", held}, {"evicted_total", double(evicted_)},
          {"exposed_loads", double(exposed_last_)}};
}

}  // namespace hg
