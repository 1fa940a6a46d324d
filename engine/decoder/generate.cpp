// Generation loop.
#include "engine/decoder/generate.h"

#include <chrono>
#include <map>
#include <optional>
#include <random>

#include "engine/core/error.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {

StageWork forward_work(const Model& m, std::span<const TokenRow> rows, const KvStrategy* kv, int64_t logit_rows,
                       int max_rows) {
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
  const int64_t n_rows = int64_t(rows.size()), n_logits = logit_rows < 0 ? n_rows : std::min(logit_rows, n_rows);
  const double head = double(m.output().numel());
  StageWork w;
  w.attn_flops = 4.0 * hp.n_layers * hp.n_heads * hp.head_dim * double(keys);
  w.attn_head_dim = hp.head_dim;
  w.flops = 2.0 * ((mat_params - head) * double(n_rows) + head * double(n_logits)) + w.attn_flops;
  w.launches = forward_launches(m, n_rows, n_logits, max_rows);
  // An untied embedding table is only gathered (one row per token), not streamed.
  const int64_t embd = hp.tie_embeddings ? 0 : int64_t(m[GlobalSlot::kTokEmbd].bytes());
  w.bytes[size_t(Tier::kGpu)] = m.weight_bytes() - embd +
                                int64_t(rows.size()) * hp.d_model * int64_t(dtype_size(m.weight_dtype)) +
                                int64_t(2) * hp.n_layers * hp.n_kv_heads * hp.head_dim *
                                    int64_t(dtype_size(kv ? kv->kv_dtype() : DType::kF32)) * read_keys;
  return w;
}

namespace {

// Writes positions [0, len_b − 1) of every sequence b and layer through kv.append with seeded
// rows in the backend's memory (512 positions per call, as prefill chunks arrive).
void seeded_fill(Backend& be, KvStrategy& kv, const KvShape& shape, const std::vector<std::vector<int32_t>>& prompts,
                 uint64_t seed) {
  constexpr int kChunk = 512;
  const size_t n = size_t(kChunk) * size_t(shape.H_kv) * size_t(shape.D);
  BackendArray<float> k(be, n), v(be, n);
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> h(n);
  for (BackendArray<float>* a : {&k, &v}) {
    for (auto& x : h) x = u(g);
    be.upload(a->data(), h.data(), n * 4);
  }
  std::vector<TokenRow> rows;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const int32_t len = int32_t(prompts[b].size()) - 1;
    for (int32_t p0 = 0; p0 < len; p0 += kChunk) {
      rows.clear();
      for (int32_t p = p0; p < std::min(len, p0 + kChunk); ++p) rows.push_back({int32_t(b), p});
      for (int l = 0; l < shape.n_layers; ++l) kv.append(l, rows, k.data(), v.data());
    }
  }
  kv.end_step();
  be.synchronize();
}

}  // namespace

GenerateResult generate(const Model& model, Backend& backend, KvStrategy& kv,
                        const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opts,
                        const std::function<void(int, int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const int B = int(prompts.size());
  if (B == 0) input_error("generate: no prompts");
  if (opts.n_new < 0) input_error("generate: -n must be non-negative");
  if (!opts.forced.empty() && opts.forced.size() != prompts.size())
    input_error("generate: {} forced token lists for {} prompts", opts.forced.size(), prompts.size());
  auto forced_of = [&](int b) { return opts.forced.empty() ? int32_t(0) : int32_t(opts.forced[size_t(b)].size()); };
  const bool seeded = opts.fill == PromptFill::kSeeded;
  if (seeded && kv.needs_prompt_attention())
    input_error("generate: strategy {} needs the prompt's attention; it cannot start from seeded rows", kv.name());
  const int64_t V = model.hp.n_vocab;
  std::vector<int32_t> capacity(static_cast<size_t>(B)), prompt_len(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    if (prompts[size_t(b)].empty()) input_error("generate: prompt {} is empty (no BOS and no text)", b);
    capacity[size_t(b)] = int32_t(prompts[size_t(b)].size()) + forced_of(b) + std::max(opts.n_new, 1);
    // Seeded rows stand for a prompt of len − 1 tokens; decode starts at its last token.
    prompt_len[size_t(b)] = int32_t(prompts[size_t(b)].size()) - (seeded ? 1 : 0);
    if (model.traits.pos == PosKind::kLearned && capacity[size_t(b)] > model.hp.max_pos)
      input_error("generate: sequence {} needs {} positions but the model has {} learned positions", b,
                  capacity[size_t(b)], model.hp.max_pos);
  }
  std::optional<Decoder> own;
  if (!opts.decoder) own.emplace(model, backend, kv, opts.max_rows);
  Decoder& dec = opts.decoder ? *opts.decoder : *own;
  if (&dec.model() != &model || &dec.kv() != &kv || &dec.backend() != &backend)
    input_error("generate: the decoder given is for another model, strategy or backend");
  Runtime* rt = opts.runtime && opts.runtime->device() != DeviceKind::kCpu ? opts.runtime : nullptr;
  int64_t step = 0;
  // Runs fn as the step's stage on the accelerator queue when there is one (step 0: the prompt).
  auto on_accel = [&](const char* name, StageWork w, const std::function<void()>& fn) {
    if (!rt) return fn();
    rt->log().set_step(step);
    w.launches = 0;  // the runtime's meter adds the launches the forward makes
    rt->accel().submit(name, w, {}, fn).wait();
  };
  auto forward = [&](std::span<const int32_t> t, std::span<const TokenRow> r, std::span<const int32_t> w, float* lg) {
    on_accel(step == 0 ? "prefill" : "decode", forward_work(model, r, &kv, int64_t(w.size()), dec.max_rows()),
             [&] { dec.forward(t, r, w, lg); });
    ++step;
  };
  kv.begin(dec.kv_shape(), capacity, prompt_len);

  GenerateResult res;
  res.tokens.resize(size_t(B));
  std::vector<Sampler> samplers;
  for (int b = 0; b < B; ++b) samplers.emplace_back(opts.sampler, uint64_t(b));
  std::vector<bool> live(size_t(B), true);
  std::vector<int32_t> last(static_cast<size_t>(B));
  std::vector<int32_t> fed(static_cast<size_t>(B), 0);  // forced tokens fed so far
  auto take = [&](int b, const float* lg) {
    if (fed[size_t(b)] < forced_of(b)) {
      last[size_t(b)] = opts.forced[size_t(b)][size_t(fed[size_t(b)]++)];
      return;
    }
    const int32_t id = samplers[size_t(b)].sample(std::span<const float>(lg, size_t(V)));
    res.tokens[size_t(b)].push_back(id);
    last[size_t(b)] = id;
    if (on_token) on_token(b, id);
    if ((opts.stop_at_eos && id == model.tokenizer->eos_id) || int(res.tokens[size_t(b)].size()) >= opts.n_new)
      live[size_t(b)] = false;
  };
  auto length = [&](int b) {  // tokens in sequence b so far
    return int32_t(prompts[size_t(b)].size() + size_t(fed[size_t(b)]) + res.tokens[size_t(b)].size()) - (seeded ? 1 : 0);
  };

  std::vector<int32_t> toks;
  std::vector<TokenRow> rows;
  std::vector<int32_t> want;
  std::vector<float> logits(size_t(B) * size_t(V));
  auto t0 = clock::now();
  if (seeded) {
    on_accel("fill", {}, [&] { seeded_fill(backend, kv, dec.kv_shape(), prompts, opts.fill_seed); });
    ++step;
    res.prefill_s = secs(t0);
    if (opts.after_step) opts.after_step(0);
    for (int b = 0; b < B; ++b) last[size_t(b)] = prompts[size_t(b)].back();
    if (opts.n_new == 0) return res;
  } else {
    // Prefill: all prompt tokens as one ragged batch; logits of each prompt's last token.
    for (int b = 0; b < B; ++b) {
      for (size_t i = 0; i < prompts[size_t(b)].size(); ++i) {
        toks.push_back(prompts[size_t(b)][i]);
        rows.push_back({b, int32_t(i)});
      }
      want.push_back(int32_t(rows.size()) - 1);
    }
    forward(toks, rows, want, logits.data());
    res.prefill_s = secs(t0);
    res.prefill_tokens = int64_t(toks.size());
    if (opts.after_step) opts.after_step(0);
    if (opts.n_new == 0) return res;
    for (int b = 0; b < B; ++b) take(b, logits.data() + int64_t(b) * V);
  }

  std::vector<int32_t> row_seq;
  for (;;) {
    toks.clear();
    rows.clear();
    want.clear();
    row_seq.clear();
    for (int b = 0; b < B; ++b) {
      if (!live[size_t(b)]) continue;
      toks.push_back(last[size_t(b)]);
      rows.push_back({b, length(b) - 1});
      want.push_back(int32_t(want.size()));
      row_seq.push_back(b);
    }
    if (rows.empty()) break;
    GenerateResult::Attended att;
    for (auto& r : rows) {
      const KvStrategy::AttendedKeys a = kv.attended_keys(r);
      att.accel += a.accel, att.cpu += a.cpu, att.context += int64_t(r.pos) + 1;
    }
    t0 = clock::now();
    forward(toks, rows, want, logits.data());
    if (const auto a = kv.last_attended()) att.accel = a->accel, att.cpu = a->cpu;
    res.attended.push_back(att);
    res.decode_tokens += int64_t(rows.size());
    for (size_t i = 0; i < row_seq.size(); ++i) take(row_seq[i], logits.data() + int64_t(i) * V);
    res.step_s.push_back(secs(t0));
    res.decode_s += res.step_s.back();
    if (opts.after_step) opts.after_step(int64_t(res.step_s.size()));
  }
  return res;
}

}  // namespace hg
