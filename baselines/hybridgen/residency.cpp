// HybridGen's residency: the ring of the newest tokens on the accelerator, offloading the
// oldest to the CPU side, and exact prefill attention over both (residency.h).
#include "baselines/hybridgen/residency.h"

#include <cstring>
#include <map>

namespace hg {

void ResidentRing::reset(const KvShape& shape, std::span<const int32_t> capacity, int32_t resident_tokens,
                         int32_t page_tokens, PlacementPolicy& placement, int64_t dram_bytes) {
  shape_ = shape;
  B_ = int(capacity.size());
  resident_ = resident_tokens, page_ = page_tokens;
  std::vector<int32_t> ring(static_cast<size_t>(B_)), off(static_cast<size_t>(B_));
  for (int b = 0; b < B_; ++b) {
    ring[size_t(b)] = std::min(resident_ + 1, capacity[size_t(b)]);
    off[size_t(b)] = std::max(1, capacity[size_t(b)] - resident_);
  }
  ring_.reset(shape, ring, &rt_.memory(), Tier::kGpu, kv_.dtype());
  offloaded_kv_.reset(shape, off, page_, placement, dram_bytes, rt_.memory(), kv_.dtype());
  offloaded_.assign(size_t(shape.n_layers) * size_t(B_), 0);
  last_pos_.assign(offloaded_.size(), -1);
}

void ResidentRing::trim() {
  for (int l = 0; l < shape_.n_layers; ++l) {
    std::vector<std::pair<int, int32_t>> leaving;
    for (int b = 0; b < B_; ++b) {
      int32_t& off = offloaded_[idx(l, b)];
      while (last_pos_[idx(l, b)] - resident_ + 1 > off) leaving.emplace_back(b, off++);
    }
    if (!leaving.empty()) offload(l, leaving, {}, nullptr, nullptr);
  }
}

void ResidentRing::copy_sequence(int32_t src, int32_t n, int32_t d) {
  const int Hkv = shape_.H_kv;
  const int64_t row = kv_.bytes(shape_.D);
  for (int l = 0; l < shape_.n_layers; ++l) {
    ring_.copy_tokens(l, src, d, std::min(n, resident_ + 1), &be_);
    const int32_t n_off = offloaded_[idx(l, src)];
    // Offloaded rows go from src's tier to dst's (pages are placed per sequence: they may differ).
    for (Tier from : {Tier::kDram, Tier::kFar})
      for (Tier to : {Tier::kDram, Tier::kFar}) {
        auto key_here = [&](int32_t p) {
          return offloaded_kv_.key_tier(l, src, p) == from && offloaded_kv_.key_tier(l, d, p) == to;
        };
        auto value_here = [&](int32_t p) { return vtier(l, src, p) == from && vtier(l, d, p) == to; };
        int64_t rows = 0;
        for (int32_t p = 0; p < n_off; ++p) rows += key_here(p) + value_here(p);
        if (rows == 0) continue;
        rt_.transfers()
            .run(
                from, to, rows * Hkv * row,
                [&] {
                  for (int32_t p = 0; p < n_off; ++p)
                    for (int g = 0; g < Hkv; ++g) {
                      if (key_here(p))
                        std::memcpy(offloaded_kv_.key(l, d, g, p), offloaded_kv_.key(l, src, g, p),
                                    size_t(row));
                      if (value_here(p)) std::memcpy(vrow(l, d, g, p), vrow(l, src, g, p), size_t(row));
                    }
                },
                {}, "fork offloaded kv")
            .wait();
      }
    offloaded_[idx(l, d)] = n_off;
    last_pos_[idx(l, d)] = last_pos_[idx(l, src)];
  }
}

void ResidentRing::append(int layer, std::span<const TokenRow> rows, const float* k, const float* v) {
  const int Hkv = shape_.H_kv, D = shape_.D;
  // Offload tokens leaving the ring (oldest first), then write the new ones into it.
  // (Only long prefill chunks overflow the ring within one call; decode steps were trimmed by
  // the previous end_step.)
  std::vector<std::pair<int, int32_t>> leaving;
  for (auto& r : rows) {
    int32_t& off = offloaded_[idx(layer, r.seq)];
    while (r.pos - resident_ - 1 >= off) leaving.emplace_back(r.seq, off++);
    last_pos_[idx(layer, r.seq)] = std::max(last_pos_[idx(layer, r.seq)], r.pos);
  }
  if (!leaving.empty()) offload(layer, leaving, rows, k, v);
  new_k_ = k, new_v_ = v;
  // New rows into their ring slots (position mod R+1), through the accelerator's write_kv: one
  // call per run of rows of one sequence. Of a run longer than the ring only the last R+1 rows
  // stay (the earlier ones were offloaded above), so no two rows of a call share a slot.
  const int64_t row = int64_t(Hkv) * D;
  for (size_t i0 = 0; i0 < rows.size();) {
    size_t i1 = i0;
    int32_t last = rows[i0].pos;
    while (i1 < rows.size() && rows[i1].seq == rows[i0].seq) last = std::max(last, rows[i1++].pos);
    for (size_t i = i0; i < i1;) {  // sub-runs of rows that stay
      while (i < i1 && rows[i].pos <= last - (resident_ + 1)) ++i;
      size_t j = i;
      slots_.clear();
      while (j < i1 && rows[j].pos > last - (resident_ + 1))
        slots_.push_back(rows[j++].pos % (resident_ + 1));
      if (j > i) {
        const int seq = rows[i].seq;
        be_.write_kv(k + int64_t(i) * row, int64_t(j - i), Hkv, D, slots_.data(), ring_.k_raw(layer, seq),
                     ring_.head_stride(seq), kv_.dtype());
        be_.write_kv(v + int64_t(i) * row, int64_t(j - i), Hkv, D, slots_.data(), ring_.v_raw(layer, seq),
                     ring_.head_stride(seq), kv_.dtype());
      }
      i = j;
    }
    i0 = i1;
  }
}

void ResidentRing::offload(int layer, const std::vector<std::pair<int, int32_t>>& leaving,
                           std::span<const TokenRow> rows, const float* k, const float* v) {
  const int Hkv = shape_.H_kv, D = shape_.D;
  const int64_t row = kv_.bytes(int64_t(Hkv) * D);
  std::array<int64_t, kNumTiers> kbytes{}, vbytes{};
  for (auto& [seq, pos] : leaving) {
    vrow(layer, seq, 0, pos);  // allocates the V page on its tier on first use
    vbytes[size_t(vtier(layer, seq, pos))] += row;
    kbytes[size_t(offloaded_kv_.key_tier(layer, seq, pos))] += row;
  }
  // The token leaving may be one of this call's own rows (prefill chunks longer than the ring):
  // it is then read from k/v (F32, converted to kv_dtype as it is stored), else from its ring slot
  // (kv_dtype). On a device both are device memory: the transfer's body downloads what it needs
  // (the call's rows once; a ring slot per token, or the whole ring when many tokens leave it at once).
  const DType dt = kv_.dtype();
  struct Source {
    const char* base;
    int64_t head_stride;  // elements between the token's KV heads
    bool f32;             // the call's own rows (F32), not a ring slot
  };
  struct Staging {  // host copies the sources point into
    std::vector<float> rows;
    std::vector<char> slots;
    std::map<int, std::vector<char>> ring;  // per sequence
  };
  auto sources = [this, layer, &leaving, rows, Hkv, D](bool key, const float* kv, Staging& st) {
    std::map<std::pair<int, int32_t>, size_t> in_call;
    for (size_t i = 0; i < rows.size(); ++i) in_call[{rows[i].seq, rows[i].pos}] = i;
    const bool host = be_.host_memory();
    const float* call = nullptr;
    int64_t from_ring = 0;
    for (auto& [seq, pos] : leaving) from_ring += !in_call.count({seq, pos});
    std::vector<Source> out;
    out.reserve(leaving.size());
    for (auto& [seq, pos] : leaving) {
      const char* ring_dev = static_cast<const char*>(key ? ring_.k_raw(layer, seq) : ring_.v_raw(layer, seq));
      const int64_t hs = ring_.head_stride(seq), slot = pos % (resident_ + 1);
      if (auto it = in_call.find({seq, pos}); it != in_call.end()) {
        if (!call) call = host_view(be_, kv, rows.size() * size_t(Hkv) * size_t(D), st.rows);
        out.push_back({reinterpret_cast<const char*>(call + int64_t(it->second) * Hkv * D), D, true});
      } else if (host) {
        out.push_back({kv_.at(ring_dev, slot * D), hs, false});
      } else if (from_ring > 32) {
        auto& r = st.ring[seq];
        if (r.empty()) {
          r.resize(size_t(kv_.bytes(int64_t(Hkv) * hs)));
          be_.download(r.data(), ring_dev, r.size());
        }
        out.push_back({kv_.at(r.data(), slot * D), hs, false});
      } else {
        out.push_back({nullptr, D, false});  // downloaded below, one strided copy per token
      }
    }
    if (!host && from_ring <= 32) {
      size_t m = 0;
      for (auto& o : out) m += o.base == nullptr;
      const size_t token = size_t(kv_.bytes(int64_t(Hkv) * D)), row = size_t(kv_.bytes(D));
      st.slots.resize(m * token);
      size_t j = 0;
      for (size_t t = 0; t < leaving.size(); ++t) {
        if (out[t].base) continue;
        auto [seq, pos] = leaving[t];
        const void* ring_dev = key ? ring_.k_raw(layer, seq) : ring_.v_raw(layer, seq);
        char* dst = st.slots.data() + j++ * token;
        be_.download_2d(dst, row, kv_.at(ring_dev, int64_t(pos % (resident_ + 1)) * D),
                        size_t(kv_.bytes(ring_.head_stride(seq))), row, size_t(Hkv));
        out[t].base = dst;
      }
    }
    return out;
  };
  std::vector<Event> ev;
  // K, then V: one body per kind and destination tier; a kind's second body reuses the first's
  // downloads.
  std::array<Staging, 2> staging;
  std::array<std::vector<Source>, 2> src;
  for (const bool key : {true, false})
    for (Tier t : {Tier::kDram, Tier::kFar}) {
      const int64_t bytes = (key ? kbytes : vbytes)[size_t(t)];
      if (bytes == 0) continue;
      ev.push_back(rt_.transfers().run(
          Tier::kGpu, t, bytes,
          [&, key, t] {
            if (rt_.dry()) return;  // phantom memory: the rows' values mean nothing
            std::vector<Source>& from = src[key ? 0 : 1];
            if (from.empty()) from = sources(key, key ? k : v, staging[key ? 0 : 1]);
            const int32_t zero = 0;
            for (size_t i = 0; i < leaving.size(); ++i) {
              auto [seq, pos] = leaving[i];
              if ((key ? offloaded_kv_.key_tier(layer, seq, pos) : vtier(layer, seq, pos)) != t) continue;
              // Every head's row: key rows are key_head_stride apart, a V page's heads page_tokens rows.
              char* dst = key ? offloaded_kv_.key(layer, seq, 0, pos) : vrow(layer, seq, 0, pos);
              const int64_t dst_hs = key ? offloaded_kv_.key_head_stride(t, layer, seq) : int64_t(page_) * D;
              const Source& s = from[i];
              if (s.f32 && dt != DType::kF32) {
                write_kv_host(reinterpret_cast<const float*>(s.base), 1, Hkv, D, &zero, dst, dst_hs, dt);
                continue;
              }
              for (int g = 0; g < Hkv; ++g)
                std::memcpy(kv_.at(dst, g * dst_hs), kv_.at(s.base, g * s.head_stride), size_t(kv_.bytes(D)));
            }
          },
          {}, key ? "offload K" : "offload V"));
    }
  for (auto& e : ev) e.wait();  // the ring slots are reused right after
}

int32_t ResidentRing::attend_exact(int layer, const std::vector<TokenRow>& rows,
                                   const std::vector<size_t>& out_row, const float* q, float scale,
                                   float* out) {
  const int Hkv = shape_.H_kv, D = shape_.D;
  const int64_t hd = int64_t(shape_.H) * D;
  const int32_t ring_slots = resident_ + 1;
  std::map<int32_t, int32_t> last;
  for (auto& r : rows) last[r.seq] = std::max(last[r.seq], r.pos);
  for (auto& [seq_, maxpos] : last) {
    const int32_t seq = seq_;  // a plain variable: lambdas below capture it
    const int32_t n = maxpos + 1, n_off = offloaded_[idx(layer, seq)];
    Allocation kb = rt_.memory().allocate(Tier::kGpu, kv_.bytes(int64_t(Hkv) * n * D), MemUse::kKv);
    Allocation vb = rt_.memory().allocate(Tier::kGpu, kv_.bytes(int64_t(Hkv) * n * D), MemUse::kKv);
    const size_t pitch = size_t(kv_.bytes(int64_t(n) * D));
    // A whole-prompt prefill: its keys and values are this call's own, on the accelerator.
    const bool fresh = write_own_kv(be_, rows, out_row, seq, n, new_k_, new_v_, Hkv, D, kb.as<char>(),
                                    vb.as<char>(), kv_.dtype());
    if (n_off > 0 && !fresh) {
      for (Tier t : {Tier::kDram, Tier::kFar}) {
        const int32_t rows = offloaded_kv_.key_rows_before(t, layer, seq, n_off);
        if (rows == 0) continue;
        rt_.transfers()
            .run(
                t, Tier::kGpu, kv_.bytes(int64_t(rows) * Hkv * D),
                [&, t] { offloaded_kv_.upload_keys(be_, t, layer, seq, n_off, kb.as<char>(), pitch); }, {},
                "prefill K back")
            .wait();
      }
      for (Tier t : {Tier::kDram, Tier::kFar}) {
        int64_t bytes = 0;
        for (int32_t p = 0; p < n_off; ++p) bytes += vtier(layer, seq, p) == t ? kv_.bytes(int64_t(Hkv) * D) : 0;
        if (bytes == 0) continue;
        rt_.transfers()
            .run(
                t, Tier::kGpu, bytes,
                [&, t] { offloaded_kv_.upload_values(be_, t, layer, seq, n_off, vb.as<char>(), pitch); }, {},
                "prefill V back")
            .wait();
      }
    }
    // Resident positions [n_off, n) sit in ring slots p mod (R+1): at most two runs of slots.
    for (int32_t p0 = n_off; p0 < n && !fresh;) {
      const int32_t s0 = p0 % ring_slots, len = std::min(n - p0, ring_slots - s0);
      for (int g = 0; g < Hkv; ++g) {
        const int64_t src = g * ring_.head_stride(seq) + int64_t(s0) * D, dst = (int64_t(g) * n + p0) * D;
        be_.copy(kv_.at(kb.as<char>(), dst), kv_.at(ring_.k_raw(layer, seq), src),
                 size_t(kv_.bytes(int64_t(len) * D)));
        be_.copy(kv_.at(vb.as<char>(), dst), kv_.at(ring_.v_raw(layer, seq), src),
                 size_t(kv_.bytes(int64_t(len) * D)));
      }
      p0 += len;
    }
    std::vector<AttnRow> ar;
    std::vector<size_t> where;
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].seq == seq) {
        ar.push_back(AttnRow{kb.as<char>(), vb.as<char>(), int64_t(n) * D, rows[i].pos + 1});
        where.push_back(out_row[i]);
      }
    // This sequence's query rows gathered, attended, and scattered back (accelerator memory), one
    // copy_rows each way.
    BackendArray<float> qs(be_, where.size() * size_t(hd)), os(be_, where.size() * size_t(hd));
    RowCopies in, back;
    for (size_t j = 0; j < where.size(); ++j) {
      in.add(qs.data() + int64_t(j) * hd, q + int64_t(where[j]) * hd);
      back.add(out + int64_t(where[j]) * hd, os.data() + int64_t(j) * hd);
    }
    in.run(be_, hd * 4);
    be_.attention(attention_args(shape_, ar, qs.data(), scale, os.data(), kv_.dtype()));
    back.run(be_, hd * 4);
    be_.synchronize();  // kb, vb, qs and os are freed at the end of this scope
  }
  return last.rbegin()->second;
}

}  // namespace hg
