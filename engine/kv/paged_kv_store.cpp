// The paged tiered KV store: keys per tier in position order, values in pages (paged_kv_store.h).
#include "engine/kv/paged_kv_store.h"

#include <algorithm>
#include <cstring>

#include "engine/core/error.h"

namespace hg {
namespace {
size_t ti(Tier t) { return t == Tier::kDram ? 0 : 1; }
}  // namespace

void PagedKvStore::reset(const KvShape& shape, std::span<const int32_t> capacity, int32_t page_tokens,
                        PlacementPolicy& placement, int64_t dram_bytes, MemorySystem& mem, DType dt) {
  shape_ = shape;
  dt_ = dt;
  es_ = int64_t(dtype_size(dt));
  B_ = int(capacity.size());
  page_ = page_tokens;
  placement_ = &placement;
  mem_ = &mem;
  max_pages_ = 0;
  for (int32_t c : capacity) max_pages_ = std::max(max_pages_, (c + page_ - 1) / page_);
  const int64_t n_pages = int64_t(max_pages_) * shape.n_layers * B_;
  const int64_t page_bytes = int64_t(shape.H_kv) * page_ * shape.D * es_;
  placement.plan(PlacementPlan{n_pages, page_bytes, dram_bytes});
  const size_t n = size_t(shape.n_layers) * size_t(B_);
  key_blocks_.clear();
  key_blocks_.resize(n);
  key_rows_.assign(n, {0, 0});
  dram_before_.assign(n * size_t(max_pages_ + 1), 0);
  value_pages_.clear();
  value_pages_.resize(n * size_t(max_pages_));
  far_value_pages_ = 0;
  for (int l = 0; l < shape.n_layers; ++l)
    for (int b = 0; b < B_; ++b) {
      int32_t* before = dram_before_.data() + idx(l, b) * size_t(max_pages_ + 1);
      const int32_t pages = (capacity[size_t(b)] + page_ - 1) / page_;
      for (int32_t p = 0; p < max_pages_; ++p)
        before[p + 1] = before[p] + (placement.place(KvKind::kKey, global_page(l, b, p), p) == Tier::kDram);
      auto& rows = key_rows_[idx(l, b)];
      rows = {before[pages] * page_, (pages - before[pages]) * page_};
      for (Tier t : {Tier::kDram, Tier::kFar})
        if (rows[ti(t)] > 0)
          key_blocks_[idx(l, b)][ti(t)] = mem.allocate(t, int64_t(shape.H_kv) * rows[ti(t)] * shape.D * es_);
    }
}

Tier PagedKvStore::key_tier(int layer, int seq, int32_t pos) const {
  const int32_t p = pos / page_;
  return dram_pages_before(layer, seq, p + 1) > dram_pages_before(layer, seq, p) ? Tier::kDram : Tier::kFar;
}

Tier PagedKvStore::value_tier(int layer, int seq, int32_t pos) const {
  return placement_->place(KvKind::kValue, global_page(layer, seq, pos / page_), pos / page_);
}

int32_t PagedKvStore::row_of(Tier t, int layer, int seq, int32_t pos) const {
  const int32_t p = pos / page_, dram = dram_pages_before(layer, seq, p);
  return (t == Tier::kDram ? dram : p - dram) * page_ + pos % page_;
}

char* PagedKvStore::keys(Tier t, int layer, int seq, int g) {
  return key_blocks_[idx(layer, seq)][ti(t)].as<char>() + int64_t(g) * key_head_stride(t, layer, seq) * es_;
}

int64_t PagedKvStore::key_head_stride(Tier t, int layer, int seq) const {
  return int64_t(key_rows_[idx(layer, seq)][ti(t)]) * shape_.D;
}

char* PagedKvStore::key(int layer, int seq, int g, int32_t pos) {
  const Tier t = key_tier(layer, seq, pos);
  return keys(t, layer, seq, g) + int64_t(row_of(t, layer, seq, pos)) * shape_.D * es_;
}

int32_t PagedKvStore::key_rows_before(Tier t, int layer, int seq, int32_t n) const {
  if (n <= 0) return 0;
  const int32_t p = n / page_, dram = dram_pages_before(layer, seq, p);
  const int32_t whole = (t == Tier::kDram ? dram : p - dram) * page_;
  return whole + (n % page_ != 0 && key_tier(layer, seq, n - 1) == t ? n % page_ : 0);
}

int32_t PagedKvStore::key_position(Tier t, int layer, int seq, int32_t row) const {
  // The page holding the tier's (row / page)-th page: the first p whose count of the tier's pages
  // up to and including it exceeds that rank.
  const int32_t rank = row / page_;
  const int32_t* before = dram_before_.data() + idx(layer, seq) * size_t(max_pages_ + 1);
  int32_t lo = 0, hi = max_pages_;
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    const int32_t count = t == Tier::kDram ? before[mid + 1] : mid + 1 - before[mid + 1];
    if (count > rank)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo * page_ + row % page_;
}

std::vector<PagedKvStore::Page> PagedKvStore::page_table(int layer, int seq, int32_t n) const {
  std::vector<Page> t;
  for (int32_t first = 0; first < n; first += page_)
    t.push_back(Page{first, std::min(page_, n - first), key_tier(layer, seq, first), value_tier(layer, seq, first)});
  return t;
}

char* PagedKvStore::value(int layer, int seq, int g, int32_t pos) {
  Allocation& pg = value_pages_[idx(layer, seq) * size_t(max_pages_) + size_t(pos / page_)];
  if (pg.empty()) {
    const Tier t = value_tier(layer, seq, pos);
    pg = mem_->allocate(t, int64_t(shape_.H_kv) * page_ * shape_.D * es_);
    far_value_pages_ += t == Tier::kFar;
  }
  return pg.as<char>() + (int64_t(g) * page_ + pos % page_) * shape_.D * es_;
}

void PagedKvStore::write(int layer, std::span<const TokenRow> rows, const float* k, const float* v) {
  const int Hkv = shape_.H_kv, D = shape_.D;
  const int32_t zero = 0;
  const bool phantom = mem_->phantom();
  for (size_t i = 0; i < rows.size(); ++i) {
    const TokenRow r = rows[i];
    if (phantom) {  // a dry run's values mean nothing: the value page is allocated, nothing converted
      value(layer, r.seq, 0, r.pos);
      continue;
    }
    const int64_t at = int64_t(i) * Hkv * D;
    write_kv_host(k + at, 1, Hkv, D, &zero, key(layer, r.seq, 0, r.pos),
                  key_head_stride(key_tier(layer, r.seq, r.pos), layer, r.seq), dt_);
    write_kv_host(v + at, 1, Hkv, D, &zero, value(layer, r.seq, 0, r.pos), int64_t(page_) * D, dt_);
  }
}

void PagedKvStore::copy_tokens(int layer, int src, int dst, int32_t n) {
  const size_t row = size_t(shape_.D * es_);
  if (mem_->phantom()) {  // dry run: the destination's value pages are allocated, nothing copied
    for (int32_t p = 0; p < n; p += page_) value(layer, dst, 0, p);
    return;
  }
  for (int32_t p = 0; p < n; ++p)
    for (int g = 0; g < shape_.H_kv; ++g) {
      std::memcpy(key(layer, dst, g, p), key(layer, src, g, p), row);
      std::memcpy(value(layer, dst, g, p), value(layer, src, g, p), row);
    }
}

void PagedKvStore::key_rows(int layer, int seq, int g, const int32_t* pos, int32_t n, char* dst, RowCopies& out) {
  const int64_t row = row_bytes();
  // Each page's tier and first tier row, looked up once per page the positions enter.
  int32_t page_begin = 0, page_end = 0, base = 0;
  const char* from = nullptr;
  for (int32_t i = 0; i < n; ++i) {
    if (i == 0 || pos[i] < page_begin || pos[i] >= page_end) {
      page_begin = pos[i] / page_ * page_, page_end = page_begin + page_;
      const Tier t = key_tier(layer, seq, page_begin);
      base = row_of(t, layer, seq, page_begin);
      from = keys(t, layer, seq, g);
    }
    out.add(dst + int64_t(i) * row, from + int64_t(base + (pos[i] - page_begin)) * row);
  }
}

void PagedKvStore::value_rows(int layer, int seq, int g, const int32_t* pos, int32_t n, char* dst,
                              RowCopies& out) {
  const int64_t row = row_bytes();
  for (int32_t i = 0; i < n; ++i) {
    out.add(dst + int64_t(i) * row, value(layer, seq, g, pos[i]));
  }
}

void PagedKvStore::gather_keys(Backend& be, int layer, int seq, int g, const int32_t* pos, int32_t n, char* dst) {
  thread_local RowCopies rows;  // kept: gathers run per head and step
  rows.clear();
  key_rows(layer, seq, g, pos, n, dst, rows);
  rows.run(be, row_bytes());
}

void PagedKvStore::gather_values(Backend& be, int layer, int seq, int g, const int32_t* pos, int32_t n,
                                 char* dst) {
  thread_local RowCopies rows;
  rows.clear();
  value_rows(layer, seq, g, pos, n, dst, rows);
  rows.run(be, row_bytes());
}

void PagedKvStore::upload_keys(Backend& be, Tier t, int layer, int seq, int32_t n, char* dst,
                               size_t dst_pitch) {
  key_runs(layer, seq, 0, n, [&](Tier rt, int32_t row, int32_t pos, int32_t len) {
    if (rt != t) return;
    be.upload_2d(dst + int64_t(pos) * shape_.D * es_, dst_pitch,
                 keys(t, layer, seq, 0) + int64_t(row) * shape_.D * es_,
                 size_t(key_head_stride(t, layer, seq) * es_), size_t(int64_t(len) * shape_.D * es_),
                 size_t(shape_.H_kv));
  });
}

void PagedKvStore::upload_values(Backend& be, Tier t, int layer, int seq, int32_t n, char* dst,
                                 size_t dst_pitch) {
  for (int32_t p0 = 0; p0 < n;) {
    const int32_t p1 = std::min(n, (p0 / page_ + 1) * page_);
    if (value_tier(layer, seq, p0) == t)
      be.upload_2d(dst + int64_t(p0) * shape_.D * es_, dst_pitch, value(layer, seq, 0, p0),
                   size_t(int64_t(page_) * shape_.D * es_), size_t(int64_t(p1 - p0) * shape_.D * es_),
                   size_t(shape_.H_kv));
    p0 = p1;
  }
}

}  // namespace hg
