// engine/kv as a layer a new strategy builds on: a page-selecting strategy in the manner of Quest
// (Tang et al., ICML 2024), written against engine/kv and the Backend alone.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "baselines/full/full.h"
#include "engine/backend/backend.h"
#include "engine/formats/formats.h"
#include "engine/kv/kv_strategy.h"
#include "engine/kv/paged_kv_store.h"
#include "engine/kv/placement.h"
#include "strategy_test_util.h"

namespace hg {
namespace {

// K and V in a PagedKvStore on dram; per page and KV head the elementwise min and max of its keys.
// A decode row attends, per KV head, the `pages` pages whose upper bound on q·k (over the group's
// query heads) is highest, its own page always among them, exactly over their tokens. Prompt rows
// attend every key. Host memory only (the backend reads dram).
class ToyPageSelect final : public KvStrategy {
 public:
  ToyPageSelect(Backend& be, int32_t page_tokens, int32_t pages) : be_(be), page_(page_tokens), pages_(pages) {}
  std::string_view name() const override { return "toy_page_select"; }
  void begin(const KvShape& s, std::span<const int32_t> cap, std::span<const int32_t> prompt) override {
    shape_ = s, prompt_.assign(prompt.begin(), prompt.end());
    store_.reset(s, cap, page_, *placement_, int64_t(1) << 40, mem_, DType::kF32);
    max_pages_ = (*std::max_element(cap.begin(), cap.end()) + page_ - 1) / page_;
    bounds_.assign(size_t(s.n_layers) * cap.size() * size_t(max_pages_) * size_t(s.H_kv) * size_t(2 * s.D), 0.0f);
  }
  void append(int l, std::span<const TokenRow> rows, const float* k, const float* v) override {
    const int D = shape_.D;
    store_.write(l, rows, k, v);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int g = 0; g < shape_.H_kv; ++g) {
        const float* kr = k + (i * size_t(shape_.H_kv) + size_t(g)) * size_t(D);
        float* b = bound(l, rows[i].seq, rows[i].pos / page_, g);
        const bool first = rows[i].pos % page_ == 0;
        for (int d = 0; d < D; ++d)
          b[d] = first ? kr[d] : std::min(b[d], kr[d]), b[D + d] = first ? kr[d] : std::max(b[D + d], kr[d]);
      }
  }
  void attend(int l, std::span<const TokenRow> rows, const float* q, float scale, float* out) override {
    const int D = shape_.D, G = shape_.H / shape_.H_kv;
    for (size_t i = 0; i < rows.size(); ++i) {
      const TokenRow r = rows[i];
      const auto table = store_.page_table(l, r.seq, r.pos + 1);
      const float* qr = q + i * size_t(shape_.H) * size_t(D);
      selected_ = 0;
      for (int g = 0; g < shape_.H_kv; ++g) {
        std::vector<int32_t> pick(table.size());
        std::iota(pick.begin(), pick.end(), 0);
        if (r.pos >= prompt_[size_t(r.seq)] && int(table.size()) > pages_) {
          std::vector<float> ub(table.size(), -INFINITY);
          for (size_t p = 0; p + 1 < table.size(); ++p)  // the last page (the row's own) is kept
            for (int h = g * G; h < (g + 1) * G; ++h) {
              float s = 0;
              const float* b = bound(l, r.seq, int32_t(p), g);
              for (int d = 0; d < D; ++d) s += std::max(qr[h * D + d] * b[d], qr[h * D + d] * b[D + d]);
              ub[p] = std::max(ub[p], s);
            }
          std::partial_sort(pick.begin(), pick.begin() + pages_ - 1, pick.end() - 1,
                            [&](int32_t a, int32_t b) { return ub[size_t(a)] > ub[size_t(b)]; });
          pick.erase(pick.begin() + pages_ - 1, pick.end() - 1);
          std::sort(pick.begin(), pick.end());
        }
        std::vector<int32_t> pos;  // the picked pages' positions, sorted
        for (int32_t p : pick)
          for (int32_t t = 0; t < table[size_t(p)].count; ++t) pos.push_back(table[size_t(p)].first + t);
        const int32_t n = int32_t(pos.size());
        if (g == 0) kbuf_.assign(size_t(shape_.H_kv * n * D), 0), vbuf_.assign(kbuf_.size(), 0), selected_ = n;
        char *kd = reinterpret_cast<char*>(&kbuf_[size_t(g * n * D)]), *vd = reinterpret_cast<char*>(&vbuf_[size_t(g * n * D)]);
        store_.gather_keys(be_, l, r.seq, g, pos.data(), n, kd);
        store_.gather_values(be_, l, r.seq, g, pos.data(), n, vd);
      }
      const AttnRow ar{kbuf_.data(), vbuf_.data(), int64_t(selected_) * D, selected_};
      be_.attention(attention_args(shape_.H, shape_.H_kv, D, scale, qr, {&ar, 1}, out + i * size_t(shape_.H) * size_t(D)));
    }
  }
  void fork(int32_t src, int32_t n, std::span<const int32_t> dst) override {
    const size_t D = size_t(shape_.D);
    for (int32_t d : dst)
      for (int l = 0; l < shape_.n_layers; ++l) {
        store_.copy_tokens(l, src, d, n);
        for (int g = 0; g < shape_.H_kv; ++g)
          for (int32_t p = 0; p * page_ < n; ++p) std::copy_n(bound(l, src, p, g), 2 * D, bound(l, d, p, g));
      }
  }
  int32_t selected() const { return selected_; }

 private:
  float* bound(int l, int seq, int32_t page, int g) {
    return &bounds_[((size_t(l * int(prompt_.size()) + seq) * size_t(max_pages_) + size_t(page)) * size_t(shape_.H_kv) +
                     size_t(g)) * size_t(2 * shape_.D)];
  }
  Backend& be_;
  int32_t page_, pages_, max_pages_ = 0, selected_ = 0;
  KvShape shape_;
  std::vector<int32_t> prompt_;
  MemorySystem mem_{TierConfig{}};
  std::unique_ptr<PlacementPolicy> placement_ = make_placement("dram-only");
  PagedKvStore store_;
  std::vector<float> bounds_, kbuf_, vbuf_;  // bounds: [layer][seq][page][g][min D, max D]
};

TEST(KvLayer, APageSelectingStrategyOnEngineKvMatchesFullWithEveryPageAndSelectsBelowIt) {
  const Model m = load_model("synthetic:tiny-llama");
  auto be = make_cpu_backend();
  const auto toks = test::token_stream(48, int(m.hp.n_vocab), 3);
  FullStrategy full(*be);
  const auto want = test::step_logits(m, *be, full, toks, 16);
  ToyPageSelect all(*be, 8, 6);  // 6 pages of 8 hold all 48 tokens: exact
  test::expect_steps_close(test::step_logits(m, *be, all, toks, 16), want, 1e-5, "every page selected");
  ToyPageSelect two(*be, 8, 2);  // the row's own page and the best other one
  const auto got = test::step_logits(m, *be, two, toks, 16);
  EXPECT_EQ(two.selected(), 8 + (47 % 8) + 1);  // the last step: one full page and its own 8
  double diff = 0;
  for (size_t s = 1; s < got.size(); ++s)
    for (size_t j = 0; j < got[s].size(); ++j) diff = std::max(diff, double(std::abs(got[s][j] - want[s][j])));
  EXPECT_GT(diff, 1e-3) << "two pages of eight attend as every page would";
  // The prompt's forward attends every key, as full does.
  test::expect_steps_close({got[0]}, {want[0]}, 1e-5, "prompt rows");
}

// In a dry run (phantom memory) the store allocates the value pages that writes and copies reach,
// as the ledger must count them, but reads no row: here the rows' source is an unreadable page.
TEST(KvLayer, APhantomStoreAllocatesValuePagesAndReadsNoRow) {
  TierConfig tc;
  tc.phantom = true;
  MemorySystem mem(tc);
  auto placement = make_placement("dram-only");
  PagedKvStore store;
  const KvShape shape{1, 4, 2, 8, nullptr};
  const std::vector<int32_t> cap = {32, 32};
  store.reset(shape, cap, 8, *placement, int64_t(1) << 40, mem, DType::kF16);
  const int64_t page_bytes = int64_t(shape.H_kv) * 8 * shape.D * 2;
  const int64_t keys = mem.ledger().usage(Tier::kDram).in_use;
  void* none = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(none, MAP_FAILED);
  const std::vector<TokenRow> rows = {{0, 0}, {0, 9}, {0, 10}};  // pages 0 and 1 of sequence 0
  store.write(0, rows, static_cast<const float*>(none), static_cast<const float*>(none));
  EXPECT_EQ(mem.ledger().usage(Tier::kDram).in_use - keys, 2 * page_bytes);
  store.copy_tokens(0, 0, 1, 11);  // sequence 1 gets its own two pages
  EXPECT_EQ(mem.ledger().usage(Tier::kDram).in_use - keys, 4 * page_bytes);
  munmap(none, 4096);
}

// Gathers across pages that alternate between dram and far return, position by position, the rows
// key() and value() address, and value_runs counts the runs of consecutive positions within a page.
TEST(KvLayer, PagedGathersAcrossInterleavedTiersMatchTheRowLookups) {
  MemorySystem mem{TierConfig{}};
  auto placement = make_placement("interleave", 0.5);
  PagedKvStore store;
  const KvShape shape{1, 4, 2, 4, nullptr};
  const int32_t n = 40, page = 4;
  const std::vector<int32_t> cap = {n};
  store.reset(shape, cap, page, *placement, int64_t(1) << 40, mem, DType::kF32);
  std::vector<TokenRow> rows;
  std::vector<float> k, v;
  for (int32_t p = 0; p < n; ++p) {
    rows.push_back({0, p});
    for (int i = 0; i < shape.H_kv * shape.D; ++i)
      k.push_back(float(1000 * p + i)), v.push_back(-float(1000 * p + i));
  }
  store.write(0, rows, k.data(), v.data());
  std::set<Tier> tiers;
  for (int32_t p = 0; p < n; p += page) tiers.insert(store.key_tier(0, 0, p));
  ASSERT_EQ(tiers.size(), 2u) << "the placement puts pages on both tiers";
  auto be = make_cpu_backend();
  const std::vector<int32_t> sel = {0, 1, 2, 3, 4, 6, 7, 9, 13, 14, 15, 16, 17, 30, 31, 32, 39};
  const int32_t m = int32_t(sel.size()), row = shape.D * 4;
  for (int g = 0; g < shape.H_kv; ++g) {
    std::vector<char> gk(size_t(m * row)), gv(gk.size());
    store.gather_keys(*be, 0, 0, g, sel.data(), m, gk.data());
    store.gather_values(*be, 0, 0, g, sel.data(), m, gv.data());
    for (int32_t i = 0; i < m; ++i) {
      EXPECT_EQ(std::memcmp(gk.data() + i * row, store.key(0, 0, g, sel[size_t(i)]), size_t(row)), 0) << i;
      EXPECT_EQ(std::memcmp(gv.data() + i * row, store.value(0, 0, g, sel[size_t(i)]), size_t(row)), 0) << i;
      EXPECT_EQ(reinterpret_cast<const float*>(gk.data() + i * row)[0],
                float(1000 * sel[size_t(i)] + g * shape.D));
    }
  }
  // Runs: {0-3} {4} {6-7} {9} {13-15} {16-17} {30-31} {32} {39}.
  EXPECT_EQ(store.value_runs(sel), 9);
}

// A fork holds the source's keys, values and page bounds: both sequences then attend alike.
TEST(KvLayer, TheToyForkedSequenceAttendsAsItsSource) {
  auto be = make_cpu_backend();
  const KvShape shape{1, 4, 2, 8, nullptr};
  const std::vector<int32_t> cap = {40, 40}, prompt = {20, 20};  // row 29 decodes: pages selected
  ToyPageSelect kv(*be, 4, 3);
  kv.begin(shape, cap, prompt);
  std::vector<float> k(size_t(30 * 2 * 8)), v(k.size()), q(4 * 8), out0(q.size()), out1(q.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = float(std::sin(0.37 * double(i))), v[i] = float(std::cos(0.11 * double(i)));
  for (size_t i = 0; i < q.size(); ++i) q[i] = float(std::sin(1.3 * double(i)));
  std::vector<TokenRow> rows;
  for (int32_t p = 0; p < 30; ++p) rows.push_back({0, p});
  kv.append(0, rows, k.data(), v.data());
  const int32_t dst[] = {1};
  kv.fork(0, 30, dst);
  const TokenRow r0[] = {{0, 29}}, r1[] = {{1, 29}};
  kv.attend(0, r0, q.data(), 0.35f, out0.data());
  kv.attend(0, r1, q.data(), 0.35f, out1.data());
  EXPECT_EQ(out0, out1);
}

}  // namespace
}  // namespace hg
