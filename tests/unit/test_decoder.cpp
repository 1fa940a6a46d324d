// Whole forward passes: the CPU backend matches `ref` on synthetic llama, qwen2 and opt models;
// batch > 1 with ragged prompts gives the same tokens as batch 1; chunked prefill equals one
// chunk; sampling is seeded.
#include "baselines/full/full.h"
#include "engine/decoder/decoder.h"
#include "engine/decoder/generate.h"
#include "engine/kv/kv_store.h"
#include "engine/formats/formats.h"
#include "engine/tokenizer/tokenizer.h"
#include "test_util.h"

namespace hg {
namespace {

std::vector<float> prefill_logits(const Model& m, Backend& be, const std::vector<int32_t>& toks, int max_rows = 512) {
  FullStrategy kv(be);
  Decoder dec(m, be, kv, max_rows);
  const int32_t cap = int32_t(toks.size());
  kv.begin(dec.kv_shape(), std::span<const int32_t>(&cap, 1), std::span<const int32_t>(&cap, 1));
  std::vector<TokenRow> rows;
  std::vector<int32_t> want;
  for (size_t i = 0; i < toks.size(); ++i) {
    rows.push_back({0, int32_t(i)});
    want.push_back(int32_t(i));
  }
  std::vector<float> logits(toks.size() * size_t(m.hp.n_vocab));
  dec.forward(toks, rows, want, logits.data());
  return logits;
}

class ForwardVsRef : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardVsRef, CpuLogitsMatchRefOracle) {
  Model m = load_model(GetParam());
  std::vector<int32_t> toks = {1, 17, 200, 5, 299, 42, 7, 100, 3, 250, 11};
  auto cpu = make_cpu_backend();
  auto ref = make_ref_backend();
  const auto a = prefill_logits(m, *cpu, toks);
  const auto b = prefill_logits(m, *ref, toks);
  double max_ref = 0;
  for (float v : b) max_ref = std::max(max_ref, double(std::abs(v)));
  ASSERT_GT(max_ref, 0.1);  // the model produces non-trivial logits
  const bool bf16 = m.weight_dtype == DType::kBF16;
  // Whole-model tolerance: F32 accumulates ~1e-6 relative error per op over 2 layers; BF16
  // rounds every projection's input.
  const test::Tol tol = bf16 ? test::Tol{5e-2 * max_ref, 5e-2} : test::Tol{1e-4 * max_ref, 1e-4};
  EXPECT_TRUE(test::all_close(a.data(), b.data(), a.size(), tol)) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Models, ForwardVsRef,
                         ::testing::Values("synthetic:tiny-llama", "synthetic:tiny-qwen2", "synthetic:tiny-opt",
                                           "synthetic:tiny-llama?dtype=bf16", "synthetic:tiny-opt?dtype=bf16"),
                         [](const auto& i) {
                           std::string s = i.param.substr(10);
                           for (auto& c : s)
                             if (!isalnum(c)) c = '_';
                           return s;
                         });

TEST(Decoder, ChunkedPrefillEqualsSingleChunk) {
  Model m = load_model("synthetic:tiny-qwen2");
  auto cpu = make_cpu_backend();
  std::vector<int32_t> toks;
  for (int i = 0; i < 37; ++i) toks.push_back((i * 37 + 5) % 300);
  const auto a = prefill_logits(m, *cpu, toks, 512);
  const auto b = prefill_logits(m, *cpu, toks, 5);
  EXPECT_TRUE(test::all_close(a.data(), b.data(), a.size(), {1e-4, 1e-4}));
}

GenerateOptions greedy_opts(int n_new) {
  GenerateOptions o;
  o.n_new = n_new;
  o.stop_at_eos = false;
  return o;
}

// Each prompt generated alone must give the tokens it got in the batch.
void expect_batch_equals_single(const Model& m, const std::vector<std::vector<int32_t>>& prompts, int n_new) {
  auto cpu = make_cpu_backend();
  FullStrategy kv(*cpu);
  const auto batch = generate(m, *cpu, kv, prompts, greedy_opts(n_new));
  for (size_t b = 0; b < prompts.size(); ++b) {
    FullStrategy kv1(*cpu);
    EXPECT_EQ(batch.tokens[b], generate(m, *cpu, kv1, {prompts[b]}, greedy_opts(n_new)).tokens[0]) << "sequence " << b;
  }
}

class BatchVsSingle : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchVsSingle, RaggedBatchGivesSameTokensAsBatchOne) {
  expect_batch_equals_single(load_model(GetParam()), {{1, 50, 60}, {1, 7, 8, 9, 10, 11, 12, 13}, {1}, {1, 299, 3, 4, 5}},
                             12);
}

INSTANTIATE_TEST_SUITE_P(Models, BatchVsSingle,
                         ::testing::Values("synthetic:tiny-llama", "synthetic:tiny-qwen2", "synthetic:tiny-opt"),
                         [](const auto& i) { return i.param.substr(15); });

// Forced tokens are fed as decode steps after the prompt and not sampled: with exact attention the
// tokens generated after them are those generated after a prompt that ends with them.
TEST(Decoder, ForcedTokensContinueAsAPromptThatEndsWithThem) {
  Model m = load_model("synthetic:tiny-llama");
  auto cpu = make_cpu_backend();
  const std::vector<int32_t> context = {1, 50, 60, 70, 80}, question = {90, 100, 110};
  std::vector<int32_t> whole = context;
  whole.insert(whole.end(), question.begin(), question.end());
  FullStrategy a(*cpu), b(*cpu);
  const auto prefilled = generate(m, *cpu, a, {whole}, greedy_opts(8));
  GenerateOptions o = greedy_opts(8);
  o.forced = {question};
  const auto fed = generate(m, *cpu, b, {context}, o);
  EXPECT_EQ(fed.tokens[0], prefilled.tokens[0]);
  EXPECT_EQ(fed.decode_tokens, prefilled.decode_tokens + int64_t(question.size()));
}

TEST(Decoder, BatchMatchesSingleOnRealModel) {
  HG_REQUIRE_SHARED("models/stories260K/stories260K.gguf");
  Model m = load_model(test::shared_path("models/stories260K/stories260K.gguf"));
  expect_batch_equals_single(m,
                             {m.tokenizer->encode_prompt("Once upon a time"),
                              m.tokenizer->encode_prompt("The cat sat on the mat and"), {1}},
                             40);
}

TEST(Sampler, SeededAndTopKOneIsGreedy) {
  auto logits = test::random_vec(1000, 5, -3, 3);
  SamplerOptions o;
  o.greedy = false;
  o.seed = 42;
  o.top_k = 50;
  o.top_p = 0.9f;
  Sampler a(o, 0), b(o, 0), c(o, 1);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(a.sample(logits));
    sb.push_back(b.sample(logits));
    sc.push_back(c.sample(logits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  o.top_k = 1;
  Sampler k1(o, 3);
  EXPECT_EQ(k1.sample(logits), argmax(logits));
  // top-k 50: every sample is among the 50 largest logits.
  std::vector<float> sorted = logits;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  for (auto id : sa) EXPECT_GE(logits[size_t(id)], sorted[49]);
}

// argmax against the one-pass definition (first index of the largest non-NaN value), over sizes
// around its 16-wide blocks, with ties, NaNs and infinities placed before, inside and after them.
TEST(Sampler, ArgmaxIsTheFirstLargestValue) {
  auto reference = [](const std::vector<float>& x) {
    int32_t best = -1;
    for (size_t i = 0; i < x.size(); ++i)
      if (!std::isnan(x[i]) && (best < 0 || x[i] > x[size_t(best)])) best = int32_t(i);
    return std::max(best, 0);
  };
  std::mt19937 g(7);
  for (size_t n : {0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 1000, 128256}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> x(n);
      std::uniform_int_distribution<int> small(-3, 3);  // few distinct values: many ties
      for (auto& v : x) v = trial % 2 ? float(small(g)) : std::normal_distribution<float>()(g);
      if (n > 0) {
        std::uniform_int_distribution<size_t> at(0, n - 1);
        if (trial >= 2) x[at(g)] = NAN, x[0] = trial == 3 ? NAN : x[0];
        if (trial == 4) x[at(g)] = INFINITY, x[at(g)] = INFINITY;
        if (trial == 5) std::fill(x.begin(), x.end(), -INFINITY), x[at(g)] = NAN;
      }
      EXPECT_EQ(argmax(x), reference(x)) << "n = " << n << ", trial " << trial;
    }
  }
  EXPECT_EQ(argmax(std::vector<float>(40, NAN)), 0);
}

TEST(Synthetic, PresetsHaveThePapersShapes) {
  const auto& p = synthetic_presets();
  auto find = [&](const std::string& n) -> const HParams& {
    for (auto& x : p)
      if (x.name == n) return x.hp;
    throw std::runtime_error("no preset " + n);
  };
  EXPECT_EQ(find("llama-3.1-8b").d_ff, 14336);
  EXPECT_EQ(find("llama-3.1-8b").n_kv_heads, 8);
  EXPECT_EQ(find("qwen2.5-7b").n_vocab, 152064);
  EXPECT_EQ(find("opt-2.7b").head_dim, 80);
  for (const char* n : {"opt-1.3b", "opt-2.7b", "opt-6.7b", "opt-13b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b",
                        "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b"})
    EXPECT_NO_THROW(validate_hparams(find(n), n)) << n;
  // A 2-layer llama-3.2-1b has the real per-layer shapes and is deterministic in its seed.
  Model a = load_model("synthetic:llama-3.2-1b?layers=1&dtype=bf16&seed=7");
  Model b = load_model("synthetic:llama-3.2-1b?layers=1&dtype=bf16&seed=7");
  EXPECT_EQ(a.layers[0][Slot::kWGate].shape, (std::vector<int64_t>{8192, 2048}));
  EXPECT_EQ(0, std::memcmp(a.layers[0][Slot::kWq].buf.data(), b.layers[0][Slot::kWq].buf.data(), a.layers[0][Slot::kWq].bytes()));
  EXPECT_THROW(load_model("synthetic:llama-3.2-1b?layer=2"), InputError);
  EXPECT_THROW(load_model("synthetic:nope"), InputError);
  // Shapes beyond the presets: Llama-3.1-70B and Mistral-7B, or any shape of an architecture.
  EXPECT_EQ(find("llama-3.1-70b").n_layers, 80);
  EXPECT_EQ(find("llama-3.1-70b").d_ff, 28672);
  EXPECT_EQ(find("mistral-7b").n_vocab, 32768);
  LoadOptions phantom;
  phantom.phantom_weights = true;
  const Model w = load_model("synthetic:llama-3.1-8b?hidden=8192&heads=64&kv_heads=8&ffn=28672&layers=80", phantom);
  EXPECT_EQ(w.hp.head_dim, 128);
  EXPECT_EQ(w.layers.at(0)[Slot::kWGate].shape, (std::vector<int64_t>{28672, 8192}));
  EXPECT_EQ(load_model("synthetic:opt-1.3b?hidden=1024&heads=16", phantom).hp.n_kv_heads, 16);
  EXPECT_EQ(load_model("synthetic:tiny-llama?heads=8&head_dim=8", phantom).hp.head_dim, 8);
  EXPECT_NE(test::input_error_of([&] { load_model("synthetic:llama-3.1-8b?hidden=8190&heads=64", phantom); })
                .find("is not heads 64 × a head dimension"),
            std::string::npos);
  EXPECT_THROW(load_model("synthetic:induction?hidden=512", phantom), InputError);
}

// A new request of the same batch shape keeps the KV storage (no allocation, no page faults);
// any other shape gets storage of its own size.
TEST(KvStoreReuse, SameShapeKeepsStorageOtherShapesReallocate) {
  KvStore st;
  const KvShape shape{2, 4, 2, 16, nullptr};
  const std::vector<int32_t> cap = {10, 7};
  st.reset(shape, cap);
  void* k0 = st.k_raw(1, 1);
  const int64_t bytes = st.bytes();
  st.reset(shape, cap);
  EXPECT_EQ(st.k_raw(1, 1), k0);
  EXPECT_EQ(st.bytes(), bytes);
  const std::vector<int32_t> bigger = {10, 9};
  st.reset(shape, bigger);
  EXPECT_EQ(st.capacity(1), 9);
  EXPECT_GT(st.bytes(), bytes);
  st.reset(shape, bigger, nullptr, Tier::kDram, DType::kF16);
  EXPECT_EQ(st.dtype(), DType::kF16);
  EXPECT_LT(st.bytes(), bytes);
}

}  // namespace
}  // namespace hg
