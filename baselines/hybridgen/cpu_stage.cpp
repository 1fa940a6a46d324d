// HybridGen's CPU stage: logits of the offloaded keys, selection, and the transfers of logits and
// V rows to the accelerator (cpu_stage.h).
#include "baselines/hybridgen/cpu_stage.h"

#include <numeric>

#include "baselines/speculation.h"
#include "selectors/logit_topk.h"
#include "selectors/sinks_recent.h"

namespace hg {
void CpuStage::reset(const KvShape& shape, int batch) {
  shape_ = shape;
  B_ = batch;
  results_.assign(size_t(shape.n_layers) * size_t(B_), nullptr);
  pool_.clear();
  pool_.resize(2 * size_t(B_));
  take_times();
}

std::shared_ptr<CpuResult> CpuStage::fresh_result(int layer, int seq) {
  auto& r = results_[size_t(layer) * size_t(B_) + size_t(seq)];
  if (!r) r = std::make_shared<CpuResult>();
  r->done = Event{};
  r->arrived.clear();
  return r;
}

CpuStage::Times CpuStage::take_times() {
  std::lock_guard<std::mutex> l(mu_);
  return std::exchange(times_, Times{});
}

void CpuStage::add_query_seconds(double query, double fixed) {
  std::lock_guard<std::mutex> l(mu_);
  times_.query += query;
  times_.fixed += fixed;
}

void CpuStage::submit(int layer, const std::string& what, std::vector<Row> rows, bool pre, int64_t project,
                      Event sent, std::function<Queries()> query) {
  StageWork total;
  for (size_t j = 0; j < rows.size(); ++j)
    total += work(layer, rows[j].r, rows[j].K, pre, j == 0 ? project : 0);
  auto shared = std::make_shared<std::vector<Row>>(std::move(rows));
  const Event done = rt_.cpu().submit(what, total, {sent}, [this, layer, shared, pre, total, query] {
    const auto t0 = Clock::now();
    const Queries qs = query();
    const float* q = qs->data();
    const int64_t hd = int64_t(shape_.H) * shape_.D;
    std::vector<std::vector<float>> lg(shared->size());
    for (size_t j = 0; j < shared->size(); ++j) {
      Row& s = (*shared)[j];
      select(layer, s.r, q + int64_t(j) * hd, s.K, pre, *s.res, lg[j]);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      times_.cpu += rt_.stage_seconds(StageKind::kCpuCompute, total, since(t0));
    }
    const std::vector<Event> arrived = send_results(layer, *shared, std::move(lg));
    for (Row& s : *shared) s.res->arrived = arrived;
  });
  for (Row& s : *shared) s.res->done = done;
}

void CpuStage::project_query(Backend& b, int layer, const float* x, int64_t M, const int32_t* pos, float* h,
                             float* q) const {
  speculative_query(b, *model_, layer, layer, x, M, pos, shape_.rope, h, q);
}

StageWork CpuStage::query_work(int layer, int64_t M, Tier where) const {
  const Weight& wq = model_->layers[size_t(layer)][Slot::kWq];
  StageWork w;
  w.flops = 2.0 * double(wq.rows()) * double(wq.cols()) * double(M);
  w.bytes[size_t(where)] = int64_t(wq.bytes());
  return w;
}

StageWork CpuStage::work(int layer, const TokenRow& r, int32_t K, bool pre, int64_t project) const {
  const int Hkv = shape_.H_kv, D = shape_.D;
  const int32_t n_off = ring_.offloaded(layer, r.seq), k = std::min(K, n_off);
  const int64_t keys = pre ? k : int64_t(n_off) + k;
  StageWork w;
  w.flops = 2.0 * double(shape_.H) * D * double(keys);
  const int64_t key_bytes = kv_.bytes(int64_t(Hkv) * D);
  if (!pre) {
    for (Tier t : {Tier::kDram, Tier::kFar}) {
      const int32_t n_t = ring_.offloaded_kv().key_rows_before(t, layer, r.seq, n_off);
      w.bytes[size_t(t)] += key_bytes * (n_t + std::llround(double(k) * n_t / std::max(1, n_off)));
    }
  } else {
    const auto [s, r0] = pre_runs(k, n_off);
    for (auto [a, b] : {std::pair{0, s}, std::pair{r0, n_off}})
      ring_.offloaded_kv().key_runs(layer, r.seq, a, b, [&](Tier t, int32_t, int32_t, int32_t len) {
        w.bytes[size_t(t)] += key_bytes * len;
        w.rows[size_t(t)] += Hkv;
      });
  }
  if (project > 0) {
    const StageWork q = query_work(layer, project, Tier::kDram);
    w.flops += q.flops;
    w.bytes[size_t(Tier::kDram)] += q.bytes[size_t(Tier::kDram)];
  }
  return w;
}

std::pair<int32_t, int32_t> CpuStage::pre_runs(int32_t K, int32_t n_off) const {
  const SinksAndRecent sel = sinks_and_recent(n_off, K, sinks_);
  return {sel.sinks, sel.recent};
}

void CpuStage::select(int layer, const TokenRow& r, const float* q, int32_t K, bool pre, CpuResult& res,
                      std::vector<float>& lg_sel) {
  const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
  const int32_t n_off = ring_.offloaded(layer, r.seq);
  const float scale = 1.0f / std::sqrt(float(D));
  K = std::min(K, n_off);
  res.k = K;
  res.sel.resize(size_t(Hkv));
  for (auto& v : res.sel) v.clear();  // kept capacity: a result is reused every step
  res.n_tier.assign(size_t(Hkv), {0, 0});
  result_buffers(layer, r.seq, K, res);
  const bool dry = rt_.dry();
  lg_sel.assign(size_t(Hkv) * size_t(G) * size_t(K), 0.0f);
  Backend& cb = rt_.cpu_backend();
  // This worker thread's scratch, grown (and zeroed) only when a stage needs more; the kernels
  // overwrite what they use. lg: [G, K] logits of one KV head's selected positions. Post mode
  // also: score, one per offloaded position; kg, the K selected key rows (kv_dtype).
  thread_local std::vector<float> lg, score;
  thread_local std::vector<char> kg;
  thread_local std::vector<int32_t> far_rows, order, sorted;
  const DType dt = kv_.dtype();
  const int64_t row = kv_.bytes(D);
  if (lg.size() < size_t(G) * size_t(K)) lg.resize(size_t(G) * size_t(K));
  if (!pre && score.size() < size_t(n_off)) score.resize(size_t(n_off));
  if (kg.size() < size_t(K * row)) kg.resize(size_t(K * row));
  const int32_t n_dram = ring_.offloaded_kv().key_rows_before(Tier::kDram, layer, r.seq, n_off);
  for (int g = 0; g < Hkv; ++g) {
    const float* qg = q + int64_t(g) * G * D;
    const char* Kd = ring_.offloaded_kv().keys(Tier::kDram, layer, r.seq, g);
    const char* Kf = ring_.offloaded_kv().keys(Tier::kFar, layer, r.seq, g);
    auto& sel = res.sel[size_t(g)];
    // Logit of query head h for the i-th selected position: [G, s] then [G, K − s] (pre mode's
    // two runs, sinks and most recent; post mode has s = 0).
    int32_t s = 0;
    if (!pre) {
      // post: every offloaded position scored by the group's max logit, top-K by score; then the
      // logits of the K selected. The scores are the max of the very logits group_logits gives
      // (bit for bit), so the selection is the one over all [G, n_off] logits, and only one
      // float per position is written instead of G (BM_GroupLogitsStage, max:1).
      // Each tier's keys in one pass: scores [dram rows | far rows].
      if (dry) {  // no scores (null backend): the K lowest positions, as ties go to the lower
        sel.resize(size_t(K));
        std::iota(sel.begin(), sel.end(), 0);
      } else {
        if (n_dram > 0) cb.group_logit_max(qg, G, Kd, n_dram, D, scale, score.data(), dt);
        if (n_off > n_dram)
          cb.group_logit_max(qg, G, Kf, n_off - n_dram, D, scale, score.data() + n_dram, dt);
        logit_top_k(cb, score.data(), 1, n_off, n_off, K, sel);
      }
      // The selected keys gathered tier by tier, then their logits; the selection back to positions.
      const auto on_dram = std::lower_bound(sel.begin(), sel.end(), n_dram);  // sel is in increasing order
      const int32_t sd = int32_t(on_dram - sel.begin());
      far_rows.assign(on_dram, sel.end());
      for (auto& i : far_rows) i -= n_dram;
      cb.gather_rows(kg.data(), Kd, row, row, sel.data(), sd);
      cb.gather_rows(kg.data() + sd * row, Kf, row, row, far_rows.data(), K - sd);
      cb.group_logits(qg, G, kg.data(), K, D, scale, lg.data(), dt);
      // Rows to positions: a search per page, the next row of the same page one position on.
      const int32_t pg = ring_.offloaded_kv().page_tokens();
      int32_t prev_row = -2, prev_pos = 0;
      for (int32_t i = 0; i < K; ++i) {
        const bool dram = i < sd;
        const int32_t row_i = dram ? sel[size_t(i)] : far_rows[size_t(i - sd)];
        prev_pos =
            i != sd && row_i == prev_row + 1 && row_i % pg != 0
                ? prev_pos + 1
                : ring_.offloaded_kv().key_position(dram ? Tier::kDram : Tier::kFar, layer, r.seq, row_i);
        prev_row = row_i;
        sel[size_t(i)] = prev_pos;
      }
    } else {  // pre: position heuristic first (sinks + most recent offloaded), logits only for those
      int32_t r0;
      std::tie(s, r0) = pre_runs(K, n_off);
      for (int32_t t = 0; t < s; ++t) sel.push_back(t);
      for (int32_t t = r0; t < n_off; ++t) sel.push_back(t);
      HG_CHECK(int32_t(sel.size()) == K);
      // A run whose keys are consecutive rows of one tier is scored where it lies; one that spans
      // tiers (interleaved pages) is gathered first, a copy per run of rows.
      const auto score_run = [&](int32_t a, int32_t len, float* out) {
        int runs = 0;
        const char* first = nullptr;
        ring_.offloaded_kv().key_runs(layer, r.seq, a, a + len, [&](Tier t, int32_t i, int32_t, int32_t) {
          first = (t == Tier::kDram ? Kd : Kf) + i * row;
          ++runs;
        });
        if (runs > 1) {
          const int32_t zero = 0;
          ring_.offloaded_kv().key_runs(
              layer, r.seq, a, a + len, [&](Tier t, int32_t i, int32_t pos, int32_t n) {
                cb.gather_rows(kg.data() + (pos - a) * row, (t == Tier::kDram ? Kd : Kf) + i * row, n * row,
                               0, &zero, 1);
              });
          first = kg.data();
        }
        cb.group_logits(qg, G, first, len, D, scale, out, dt);
      };
      if (s > 0) score_run(0, s, lg.data());
      if (K > s) score_run(r0, K - s, lg.data() + int64_t(G) * s);
    }
    const auto logit = [&](int h, size_t c) {
      return c < size_t(s) ? lg[size_t(h) * size_t(s) + c]
                           : lg[size_t(G) * size_t(s) + size_t(h) * size_t(K - s) + (c - size_t(s))];
    };
    // Position order: the value sum then adds the rows in the order the oracle does, whatever
    // the tiers of their pages (a different order can flip a 16-bit rounding of a later KV row).
    order.resize(sel.size());
    std::iota(order.begin(), order.end(), 0);
    if (!std::is_sorted(sel.begin(), sel.end()))
      std::sort(order.begin(), order.end(),
                [&](int32_t a, int32_t b) { return sel[size_t(a)] < sel[size_t(b)]; });
    sorted.resize(sel.size());
    ValueTierCursor vtier(ring_, layer, r.seq);
    for (size_t i = 0; i < order.size(); ++i) {
      sorted[i] = sel[size_t(order[i])];
      res.n_tier[size_t(g)][vtier.at(sorted[i]) != Tier::kDram]++;
      if (!dry)  // a dry run's logits are never read (the null backend merges nothing)
        for (int h = 0; h < G; ++h)
          lg_sel[(size_t(g) * G + size_t(h)) * size_t(K) + i] = logit(h, size_t(order[i]));
    }
    sel.assign(sorted.begin(), sorted.end());
  }
}

std::vector<Event> CpuStage::send_results(int layer, const std::vector<Row>& rows,
                                          std::vector<std::vector<float>> lg) {
  const int Hkv = shape_.H_kv, D = shape_.D;
  // Logits (dram → gpu), every row's in one transfer, and the selected V rows (their tier → gpu).
  std::vector<Event> ev;
  int64_t lbytes = 0;
  for (const auto& l : lg) lbytes += int64_t(l.size()) * 4;
  ev.push_back(rt_.transfers().run(
      Tier::kDram, Tier::kGpu, lbytes,
      [this, &rows, &lg, lbytes] {
        const auto t = Clock::now();
        for (size_t j = 0; j < rows.size(); ++j) be_.upload(rows[j].res->logits, lg[j].data(), lg[j].size() * 4);
        add_tx(transfer_seconds(Tier::kDram, lbytes, 0, since(t)));
      },
      {}, "cpu logits to gpu"));
  // The selected V rows go from their tier to each row's res.v on the gpu tier in one gather per
  // run of positions within a page. On a device the accelerator reads them by DMA from pinned dram
  // or mapped far memory (Backend::gather_rows); the CPU copies nothing.
  for (int ti = 0; ti < 2; ++ti) {
    const Tier tier = ti == 0 ? Tier::kDram : Tier::kFar;
    int64_t bytes = 0, runs = 0;  // runs of consecutive selected positions within one page
    for (const Row& s : rows)
      for (int g = 0; g < Hkv; ++g) {
        bytes += kv_.bytes(int64_t(s.res->n_tier[size_t(g)][size_t(ti)]) * D);
        tier_segments(layer, s.r.seq, s.res->sel[size_t(g)], tier, [&](int32_t b, int32_t e) {
          runs += ring_.offloaded_kv().value_runs(
              std::span<const int32_t>(s.res->sel[size_t(g)].data() + b, size_t(e - b)));
        });
      }
    if (bytes == 0) continue;
    ev.push_back(rt_.transfers().run_gather(
        tier, Tier::kGpu, bytes, runs,
        [this, &rows, layer, D, Hkv, tier, bytes, runs] {
          const auto t = Clock::now();
          // Each head's rows of this tier go to their places in res.v (position order): every
          // row of every head and sequence in one copy_rows launch.
          thread_local RowCopies copies;
          copies.clear();
          PagedKvStore& store = ring_.offloaded_kv();
          for (const Row& s : rows) {
            const CpuResult& res = *s.res;
            for (int g = 0; g < Hkv; ++g) {
              const auto& sel = res.sel[size_t(g)];
              tier_segments(layer, s.r.seq, sel, tier, [&](int32_t b, int32_t e) {
                store.value_rows(layer, s.r.seq, g, sel.data() + b, e - b,
                                 kv_.at(res.v, (int64_t(g) * res.k + b) * D), copies);
              });
            }
          }
          copies.run(be_, store.row_bytes());
          be_.synchronize();  // the attention reading res.v runs on another thread's stream
          add_tx(transfer_seconds(tier, bytes, runs, since(t)));
        },
        {}, "selected V to gpu"));
  }
  for (auto& e : ev) e.wait();
  return ev;
}

void CpuStage::result_buffers(int layer, int seq, int32_t K, CpuResult& res) {
  const int Hkv = shape_.H_kv, D = shape_.D, G = shape_.H / Hkv;
  const int64_t lbytes = std::max<int64_t>(4, int64_t(Hkv) * G * K * 4),
                vbytes = std::max<int64_t>(4, kv_.bytes(int64_t(Hkv) * K * D));
  std::lock_guard<std::mutex> l(pool_mu_);
  ResultPool& p = pool_[size_t(layer % 2) * size_t(B_) + size_t(seq)];
  grow_allocation(rt_.memory(), Tier::kGpu, p.logits, lbytes);
  grow_allocation(rt_.memory(), Tier::kGpu, p.v, vbytes);
  res.logits = p.logits.as<float>();
  res.v = p.v.as<char>();
}

double CpuStage::transfer_seconds(Tier src, int64_t bytes, int64_t rows, double measured_s) const {
  StageWork w;
  w.src = src, w.dst = Tier::kGpu, w.transfer_bytes = bytes, w.rows[size_t(src)] = rows;
  return rt_.stage_seconds(StageKind::kTransfer, w, measured_s);
}

void CpuStage::add_tx(double s) {
  std::lock_guard<std::mutex> l(mu_);
  times_.tx += s;
}

}  // namespace hg
