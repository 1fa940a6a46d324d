// Generation loop.
#include "engine/decoder/generate.h"

#include <chrono>
#include <map>

#include "engine/core/error.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {

StageWork forward_work(const Model& m, std::span<const TokenRow> rows, const KvStrategy* kv) {
  const HParams& hp = m.hp;
  int64_t keys = 0, read_keys = 0;
  std::map<int32_t, int64_t> per_seq;  // keys read once per sequence
  for (auto& r : rows) {
    const int64_t n = kv ? kv->accel_attention_keys(r) : int64_t(r.pos) + 1;
    keys += n;
    per_seq[r.seq] = std::max(per_seq[r.seq], n);
  }
  for (auto& [s, n] : per_seq) read_keys += n;
  const double mat_params = double(m.n_params()) - double(m[GlobalSlot::kTokEmbd].numel()) +
                            (hp.tie_embeddings ? double(m[GlobalSlot::kTokEmbd].numel()) : 0.0);
  StageWork w;
  w.flops = 2.0 * mat_params * double(rows.size()) + 4.0 * hp.n_layers * hp.n_heads * hp.head_dim * double(keys);
  // An untied embedding table is only gathered (one row per token), not streamed.
  const int64_t embd = hp.tie_embeddings ? 0 : int64_t(m[GlobalSlot::kTokEmbd].bytes());
  w.bytes[size_t(Tier::kGpu)] = m.weight_bytes() - embd +
                                int64_t(rows.size()) * hp.d_model * int64_t(dtype_size(m.weight_dtype)) +
                                int64_t(2) * hp.n_layers * hp.n_kv_heads * hp.head_dim * 4 * read_keys;
  return w;
}

GenerateResult generate(const Model& model, Backend& backend, KvStrategy& kv,
                        const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opts,
                        const std::function<void(int, int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  const int B = int(prompts.size());
  if (B == 0) input_error("generate: no prompts");
  if (opts.n_new < 0) input_error("generate: -n must be non-negative");
  const int64_t V = model.hp.n_vocab;
  std::vector<int32_t> capacity(static_cast<size_t>(B)), prompt_len(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    if (prompts[size_t(b)].empty()) input_error("generate: prompt {} is empty (no BOS and no text)", b);
    capacity[size_t(b)] = int32_t(prompts[size_t(b)].size()) + std::max(opts.n_new, 1);
    prompt_len[size_t(b)] = int32_t(prompts[size_t(b)].size());
    if (model.traits.pos == PosKind::kLearned && capacity[size_t(b)] > model.hp.max_pos)
      input_error("generate: sequence {} needs {} positions but the model has {} learned positions", b,
                  capacity[size_t(b)], model.hp.max_pos);
  }
  Decoder dec(model, backend, kv, opts.max_rows);
  Runtime* rt = opts.runtime && opts.runtime->device() != DeviceKind::kCpu ? opts.runtime : nullptr;
  int64_t step = 0;
  // Runs one forward, on the accelerator queue when there is one.
  auto forward = [&](std::span<const int32_t> t, std::span<const TokenRow> r, std::span<const int32_t> w, float* lg) {
    if (!rt) return dec.forward(t, r, w, lg);
    rt->log().set_step(step++);
    rt->accel().submit(step == 1 ? "prefill" : "decode", forward_work(model, r, &kv), {}, [&] { dec.forward(t, r, w, lg); }).wait();
  };
  kv.begin(dec.kv_shape(), capacity, prompt_len);

  GenerateResult res;
  res.tokens.resize(size_t(B));
  std::vector<Sampler> samplers;
  for (int b = 0; b < B; ++b) samplers.emplace_back(opts.sampler, uint64_t(b));

  // Prefill: all prompt tokens as one ragged batch; logits of each prompt's last token.
  std::vector<int32_t> toks;
  std::vector<TokenRow> rows;
  std::vector<int32_t> want;
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < prompts[size_t(b)].size(); ++i) {
      toks.push_back(prompts[size_t(b)][i]);
      rows.push_back({b, int32_t(i)});
    }
    want.push_back(int32_t(rows.size()) - 1);
  }
  std::vector<float> logits(size_t(B) * size_t(V));
  auto t0 = clock::now();
  forward(toks, rows, want, logits.data());
  res.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
  res.prefill_tokens = int64_t(toks.size());
  if (opts.n_new == 0) return res;

  std::vector<bool> live(size_t(B), true);
  std::vector<int32_t> last(static_cast<size_t>(B));
  std::vector<int32_t> row_seq;
  auto take = [&](int b, const float* lg) {
    const int32_t id = samplers[size_t(b)].sample(std::span<const float>(lg, size_t(V)));
    res.tokens[size_t(b)].push_back(id);
    last[size_t(b)] = id;
    if (on_token) on_token(b, id);
    if ((opts.stop_at_eos && id == model.tokenizer->eos_id) || int(res.tokens[size_t(b)].size()) >= opts.n_new)
      live[size_t(b)] = false;
  };
  for (int b = 0; b < B; ++b) take(b, logits.data() + int64_t(b) * V);

  t0 = clock::now();
  for (;;) {
    toks.clear();
    rows.clear();
    want.clear();
    row_seq.clear();
    for (int b = 0; b < B; ++b) {
      if (!live[size_t(b)]) continue;
      toks.push_back(last[size_t(b)]);
      rows.push_back({b, int32_t(prompts[size_t(b)].size() + res.tokens[size_t(b)].size()) - 1});
      want.push_back(int32_t(want.size()));
      row_seq.push_back(b);
    }
    if (rows.empty()) break;
    forward(toks, rows, want, logits.data());
    res.decode_tokens += int64_t(rows.size());
    for (size_t i = 0; i < row_seq.size(); ++i) take(row_seq[i], logits.data() + int64_t(i) * V);
  }
  res.decode_s = std::chrono::duration<double>(clock::now() - t0).count();
  return res;
}

}  // namespace hg
