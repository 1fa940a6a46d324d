// Multiple-choice scoring through a strategy.
#include "datasets/score.h"

#include "engine/runtime/bandwidth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "engine/core/atomic_file.h"
#include "engine/core/error.h"
#include "engine/core/mapped_file.h"
#include "engine/decoder/generate.h"
#include "engine/runtime/runtime.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {
namespace {

// Length in characters (code points) of UTF-8 text, as Python's len() counts it.
size_t char_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// log-softmax of one row, in double.
void log_softmax(const float* x, int64_t V, std::vector<float>& out) {
  double m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = std::max(m, double(x[i]));
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(x[i]) - m);
  const double lse = m + std::log(s);
  out.resize(size_t(V));
  for (int64_t i = 0; i < V; ++i) out[size_t(i)] = float(double(x[i]) - lse);
}

template <class T>
int argmax(const std::vector<T>& v) {
  return int(std::max_element(v.begin(), v.end()) - v.begin());  // first of equal maxima, as numpy
}

}  // namespace

nlohmann::ordered_json PairedComparison::json() const {
  return {{"n", n},          {"diff", diff}, {"ci95", {ci_lo, ci_hi}}, {"mcnemar_p", mcnemar_p},
          {"only_strategy_right", b}, {"only_reference_right", c}};
}

PairedComparison paired_compare(const std::vector<int>& s, const std::vector<int>& r, int resamples, uint64_t seed) {
  HG_CHECK(s.size() == r.size());
  PairedComparison p;
  p.n = int(s.size());
  if (p.n == 0) return p;
  std::vector<int> d(s.size());
  long sum = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    d[i] = s[i] - r[i];
    sum += d[i];
    p.b += d[i] > 0, p.c += d[i] < 0;
  }
  p.diff = double(sum) / p.n;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, s.size() - 1);
  std::vector<double> means(size_t(std::max(1, resamples)));
  for (double& m : means) {
    long t = 0;
    for (size_t i = 0; i < s.size(); ++i) t += d[pick(rng)];
    m = double(t) / p.n;
  }
  std::sort(means.begin(), means.end());
  const auto at = [&](double q) { return means[std::min(means.size() - 1, size_t(q * double(means.size() - 1) + 0.5))]; };
  p.ci_lo = at(0.025), p.ci_hi = at(0.975);
  // Exact binomial: P(X <= min(b, c)) for X ~ Bin(b + c, 1/2), doubled, in logs (n up to thousands).
  const int nd = p.b + p.c, k = std::min(p.b, p.c);
  if (nd > 0) {
    double tail = 0;
    for (int i = 0; i <= k; ++i)
      tail += std::exp(std::lgamma(nd + 1.0) - std::lgamma(i + 1.0) - std::lgamma(nd - i + 1.0) - nd * std::log(2.0));
    p.mcnemar_p = std::min(1.0, 2 * tail);
  }
  return p;
}

double mean_stderr(const std::vector<double>& v) {
  return v.size() < 2 ? 0 : sample_sd(v) / std::sqrt(double(v.size()));
}

ContextMode parse_context_mode(const std::string& s, const std::string& where) {
  if (s == "prefill") return ContextMode::kPrefill;
  if (s == "stream") return ContextMode::kStream;
  input_error("{}: context '{}' (expected prefill or stream)", where, s);
}

const char* context_mode_name(ContextMode m) { return m == ContextMode::kPrefill ? "prefill" : "stream"; }

EncodedRequest encode_request(const Tokenizer& tok, const Request& r, bool add_bos, int max_length,
                              const ChatTemplate* chat) {
  EncodedRequest e;
  if (chat && chat->applied()) {
    const ChatPrompt p = encode_chat(tok, *chat, r.context);
    e.context = p.head;
    e.context.insert(e.context.end(), p.user.begin(), p.user.end());
    e.context.insert(e.context.end(), p.tail.begin(), p.tail.end());
    for (auto& c : r.continuations) e.continuations.push_back(tok.encode(p.tail_text + c));
    add_bos = add_bos && (e.context.empty() || e.context[0] != tok.bos_id);
  } else {
    std::string ctx = r.context;
    const size_t keep = ctx.find_last_not_of(" \t\n\r\f\v");
    const std::string moved = keep == std::string::npos ? ctx : ctx.substr(keep + 1);
    ctx.resize(ctx.size() - moved.size());
    e.context = tok.encode(ctx);
    const size_t n_ctx = e.context.size();
    for (auto& c : r.continuations) {
      const std::vector<int32_t> whole = tok.encode(ctx + moved + c);
      e.continuations.emplace_back(whole.begin() + int64_t(std::min(n_ctx, whole.size())), whole.end());
    }
  }
  if (add_bos) {
    if (tok.bos_id < 0) input_error("{} item {}: the tokenizer has no BOS token to add", r.task, r.index);
    e.context.insert(e.context.begin(), tok.bos_id);
  }
  if (e.context.empty()) {
    // lm-eval scores an empty context after the end-of-text token.
    const int32_t pre = tok.eos_id >= 0 ? tok.eos_id : tok.bos_id;
    if (pre < 0) input_error("{} item {}: empty context and the tokenizer has no BOS or EOS", r.task, r.index);
    e.context.push_back(pre);
  }
  if (max_length > 0) {
    size_t longest = 1;
    for (auto& c : e.continuations) longest = std::max(longest, c.size());
    if (longest > size_t(max_length))
      input_error("{} item {}: a continuation of {} tokens is longer than the model's {} positions", r.task, r.index,
                  longest, max_length);
    const size_t room = size_t(max_length) + 1 - longest;
    if (e.context.size() > room) {
      e.truncated = int(e.context.size() - room);
      e.context.erase(e.context.begin(), e.context.begin() + int64_t(e.truncated));
    }
  }
  return e;
}

nlohmann::ordered_json ItemScore::json() const {
  nlohmann::ordered_json j;
  j["index"] = index;
  j["gold"] = gold;
  j["pred"] = pred;
  j["pred_norm"] = pred_norm;
  j["context_tokens"] = context_tokens;
  if (truncated) j["truncated"] = truncated;
  j["ll"] = ll;
  j["tokens"] = tokens;
  j["greedy"] = greedy;
  return j;
}

ItemScore ItemScore::from_json(const nlohmann::json& j) {
  ItemScore s;
  s.index = j.at("index").get<int>();
  s.gold = j.at("gold").get<int>();
  s.pred = j.at("pred").get<int>();
  s.pred_norm = j.at("pred_norm").get<int>();
  s.context_tokens = j.at("context_tokens").get<int>();
  s.truncated = j.value("truncated", 0);
  s.ll = j.at("ll").get<std::vector<double>>();
  s.tokens = j.at("tokens").get<std::vector<int>>();
  s.greedy = j.at("greedy").get<std::vector<bool>>();
  return s;
}

Scorer::Scorer(const Model& model, Backend& backend, KvStrategy& kv, Runtime* rt, ContextMode mode, bool add_bos,
               int batch_seqs)
    : model_(model), be_(backend), kv_(kv), rt_(rt && rt->device() != DeviceKind::kCpu ? rt : nullptr), mode_(mode),
      add_bos_(add_bos), batch_seqs_(std::max(1, batch_seqs)), dec_(model, backend, kv) {}

// Decode rows' attended keys: from attended_keys() before the forward, or the strategy's own count
// of the forward that ended (last_attended(), summed over its decode rows).
void Scorer::count_attended(std::span<const TokenRow> rows, bool before) {
  double ctx = 0, att = 0;
  for (const TokenRow& r : rows) {
    if (size_t(r.seq) >= prompt_.size() || r.pos < prompt_[size_t(r.seq)]) continue;
    ctx += double(r.pos) + 1;
    if (before) {
      const KvStrategy::AttendedKeys a = kv_.attended_keys(r);
      att += double(std::min<int64_t>(a.accel + a.cpu, int64_t(r.pos) + 1));
    }
  }
  if (ctx == 0) return;
  if (before) {
    pending_attended_ = att, pending_context_ = ctx;
    return;
  }
  if (const auto a = kv_.last_attended()) pending_attended_ = std::min(ctx, double(a->accel + a->cpu));
  attended_keys_ += pending_attended_, context_keys_ += pending_context_;
  pending_attended_ = pending_context_ = 0;
}

void Scorer::forward(std::span<const int32_t> t, std::span<const TokenRow> rows, std::span<const int32_t> want,
                     float* lg) {
  count_attended(rows, true);
  ++work_.forwards;
  for (const TokenRow& r : rows)
    ++(size_t(r.seq) < prompt_.size() && r.pos >= prompt_[size_t(r.seq)] ? work_.decode_rows : work_.prefill_rows);
  if (!rt_) {
    dec_.forward(t, rows, want, lg);
    count_attended(rows, false);
    if (on_step_) on_step_();
    return;
  }
  rt_->log().set_step(step_);
  StageWork w = forward_work(model_, rows, &kv_, int64_t(want.size()), dec_.max_rows());
  w.launches = 0;  // the runtime's meter adds the launches the forward makes
  rt_->accel().submit(step_ == 0 ? "prefill" : "decode", w, {}, [&] { dec_.forward(t, rows, want, lg); }).wait();
  ++step_;
  // Scoring is timed on the wall clock; kept, the event log would hold every stage of the run
  // (millions for HybridGen over a task).
  rt_->log().clear();
  count_attended(rows, false);
  if (on_step_) on_step_();
}

ItemScore Scorer::score(const Request& r, ChoiceLogprobs* logprobs) {
  ItemScore out;
  score_all(std::span<const Request>(&r, 1), logprobs != nullptr, [&](size_t, ItemScore& s, ChoiceLogprobs& lp) {
    out = std::move(s);
    if (logprobs) *logprobs = std::move(lp);
  });
  return out;
}

void Scorer::score_all(std::span<const Request> reqs, bool logprobs, const ItemDone& done) {
  // Items of similar length share a batch (a stream-mode batch runs as long as its longest item).
  std::vector<EncodedRequest> enc(reqs.size());
  std::vector<size_t> order(reqs.size()), len(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    enc[i] = encode_request(*model_.tokenizer, reqs[i], add_bos_, model_.hp.max_pos, &chat_);
    order[i] = i;
    size_t longest = 0;
    for (auto& c : enc[i].continuations) longest = std::max(longest, c.size());
    len[i] = enc[i].context.size() + longest;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return len[a] < len[b]; });
  if (kv_.needs_prompt_attention() && !calibrated_ && !reqs.empty()) calibrate(enc);
  // An item's sequences and the KV positions they hold (each choice: the context and its tokens).
  auto seqs_of = [&](size_t i) { return std::max<size_t>(1, enc[i].continuations.size()); };
  auto tokens_of = [&](size_t i) { return seqs_of(i) * len[i]; };
  for (size_t i0 = 0; i0 < order.size();) {
    size_t i1 = i0 + 1, seqs = seqs_of(order[i0]), tokens = tokens_of(order[i0]);
    while (i1 < order.size() && seqs + seqs_of(order[i1]) <= size_t(batch_seqs_) &&
           tokens + tokens_of(order[i1]) <= size_t(kBatchTokens)) {
      seqs += seqs_of(order[i1]);
      tokens += tokens_of(order[i1++]);
    }
    score_batch(reqs, enc, std::span<const size_t>(order).subspan(i0, i1 - i0), logprobs, done);
    if (on_batch_) on_batch_(int(i1 - i0));
    i0 = i1;
  }
}

void Scorer::calibrate(std::span<const EncodedRequest> enc) {
  std::vector<int32_t> longest = calibration_;
  if (longest.empty())
    for (const EncodedRequest& e : enc)
      if (e.context.size() > longest.size()) longest = e.context;
  const int32_t n = int32_t(longest.size());
  std::vector<TokenRow> rows;
  for (int32_t p = 0; p < n; ++p) rows.push_back({0, p});
  const int32_t cap[1] = {n}, prompt[1] = {n};
  step_ = 0;
  prompt_.clear();  // a calibration is not scored
  kv_.begin(dec_.kv_shape(), cap, prompt);
  forward(longest, rows, {}, nullptr);
  calibrated_ = true;
}

void Scorer::score_batch(std::span<const Request> reqs, std::span<const EncodedRequest> enc,
                         std::span<const size_t> which, bool logprobs,
                         const ItemDone& done) {
  const int64_t V = model_.hp.n_vocab;
  // Per item: its encoding, its first sequence (the context runs there; choice c is sequence base + c),
  // the prompt (prefill mode: all but the last context token; stream mode: one token) and scores.
  struct Item {
    EncodedRequest e;
    int32_t base = 0, n_ctx = 0, prompt = 0, C = 0;
    ItemScore s;
    ChoiceLogprobs lp;
  };
  std::vector<Item> items(which.size());
  std::vector<int32_t> capacity, prompt_len;
  for (size_t j = 0; j < which.size(); ++j) {
    const Request& r = reqs[which[j]];
    Item& it = items[j];
    it.e = enc[which[j]];
    it.C = std::max(1, int(it.e.continuations.size()));
    it.e.continuations.resize(size_t(it.C));
    it.n_ctx = int32_t(it.e.context.size());
    // Prefill mode prefills all but the last context token exactly; that token is a decode step, so
    // that every scored position (the first continuation token included) comes from a step the
    // strategy shapes. Stream mode: a one-token prompt, every other token a decode step.
    it.prompt = mode_ == ContextMode::kPrefill ? std::max<int32_t>(1, it.n_ctx - 1) : 1;
    it.base = int32_t(capacity.size());
    for (int c = 0; c < it.C; ++c) {
      const int32_t cap = it.n_ctx + std::max<int32_t>(1, int32_t(it.e.continuations[size_t(c)].size()));
      // The last continuation token is scored, not fed: capacity − 1 positions are used.
      if (model_.traits.pos == PosKind::kLearned && cap - 1 > model_.hp.max_pos)
        input_error("{} item {}: {} tokens, but the model has {} learned positions", r.task, r.index, cap - 1,
                    model_.hp.max_pos);
      capacity.push_back(cap);
      prompt_len.push_back(it.prompt);
    }
    it.s.index = r.index;
    it.s.gold = r.gold;
    it.s.context_tokens = it.n_ctx;
    it.s.truncated = it.e.truncated;
    it.s.ll.assign(size_t(it.C), 0.0);
    it.s.tokens.assign(size_t(it.C), 0);
    it.s.greedy.assign(size_t(it.C), true);
    if (logprobs) it.lp.assign(size_t(it.C), {});
  }
  step_ = 0;
  prompt_ = prompt_len;
  kv_.begin(dec_.kv_shape(), capacity, prompt_len);

  std::vector<int32_t> toks, want;
  std::vector<TokenRow> rows;
  // Per wanted logits row: its item, and the choice it scores (-1: every choice, the context's last
  // token) and the continuation token it scores.
  struct Want {
    size_t item;
    int choice, k;
  };
  std::vector<Want> wants;
  std::vector<float> logits, lp;
  auto score_row = [&](const float* x, Item& it, int c, int k) {
    const int32_t target = it.e.continuations[size_t(c)][size_t(k)];
    it.s.ll[size_t(c)] += double(lp[size_t(target)]);
    it.s.tokens[size_t(c)] += 1;
    if (std::max_element(x, x + V) - x != target) it.s.greedy[size_t(c)] = false;
    if (logprobs) it.lp[size_t(c)].push_back(lp);
  };
  auto take = [&]() {
    for (size_t w = 0; w < wants.size(); ++w) {
      const float* x = logits.data() + int64_t(w) * V;
      log_softmax(x, V, lp);
      Item& it = items[wants[w].item];
      if (wants[w].choice >= 0) {
        score_row(x, it, wants[w].choice, wants[w].k);
        continue;
      }
      for (int c = 0; c < it.C; ++c)
        if (!it.e.continuations[size_t(c)].empty()) score_row(x, it, c, 0);
    }
  };
  // After the context's last token: the choices continue from forks of the context's sequence.
  auto fork = [&](Item& it) {
    if (it.C < 2) return;
    std::vector<int32_t> dst;
    for (int c = 1; c < it.C; ++c) dst.push_back(it.base + c);
    kv_.fork(it.base, it.n_ctx, dst);
  };

  // The prompts, in one forward (chunked by the decoder).
  toks.clear(), rows.clear(), want.clear(), wants.clear();
  for (size_t j = 0; j < items.size(); ++j) {
    const Item& it = items[j];
    for (int32_t p = 0; p < it.prompt; ++p) toks.push_back(it.e.context[size_t(p)]), rows.push_back({it.base, p});
    if (it.prompt == it.n_ctx) want.push_back(int32_t(rows.size()) - 1), wants.push_back({j, -1, 0});
  }
  logits.resize(want.size() * size_t(V));
  forward(toks, rows, want, logits.data());
  take();
  for (auto& it : items)
    if (it.prompt == it.n_ctx) fork(it);

  // Decode steps: step t feeds each item's position prompt + t, the context's on its first sequence,
  // then each choice's teacher-forced tokens on its own (the last token is scored, not fed).
  for (int32_t t = 0;; ++t) {
    toks.clear(), rows.clear(), want.clear(), wants.clear();
    for (size_t j = 0; j < items.size(); ++j) {
      const Item& it = items[j];
      const int32_t pos = it.prompt + t;
      if (pos < it.n_ctx) {
        toks.push_back(it.e.context[size_t(pos)]), rows.push_back({it.base, pos});
        if (pos == it.n_ctx - 1) want.push_back(int32_t(rows.size()) - 1), wants.push_back({j, -1, 0});
        continue;
      }
      const int k = pos - it.n_ctx;  // the continuation token fed at pos
      for (int c = 0; c < it.C; ++c) {
        const auto& cont = it.e.continuations[size_t(c)];
        if (int(cont.size()) <= k + 1) continue;
        toks.push_back(cont[size_t(k)]), rows.push_back({it.base + c, pos});
        want.push_back(int32_t(rows.size()) - 1), wants.push_back({j, c, k + 1});
      }
    }
    if (rows.empty()) break;
    logits.resize(want.size() * size_t(V));
    forward(toks, rows, want, logits.data());
    take();
    for (auto& it : items)
      if (it.prompt + t == it.n_ctx - 1) fork(it);
  }

  for (size_t j = 0; j < items.size(); ++j) {
    Item& it = items[j];
    const Request& r = reqs[which[j]];
    it.s.pred = argmax(it.s.ll);
    std::vector<double> norm(static_cast<size_t>(it.C));
    for (int c = 0; c < it.C; ++c)
      norm[size_t(c)] = it.s.ll[size_t(c)] / double(std::max<size_t>(1, char_length(r.choices[size_t(c)])));
    it.s.pred_norm = argmax(norm);
    done(which[j], it.s, it.lp);
  }
}

nlohmann::ordered_json TaskMetrics::json() const {
  return {{"n", n}, {"acc", acc}, {"acc_stderr", acc_stderr}, {"acc_norm", acc_norm}, {"acc_norm_stderr", acc_norm_stderr}};
}

TaskMetrics task_metrics(const std::vector<ItemScore>& items, const std::vector<Request>& reqs) {
  (void)reqs;
  std::vector<double> a, an;
  for (auto& s : items) {
    a.push_back(s.pred == s.gold ? 1.0 : 0.0);
    an.push_back(s.pred_norm == s.gold ? 1.0 : 0.0);
  }
  TaskMetrics m;
  m.n = int(items.size());
  for (double x : a) m.acc += x;
  for (double x : an) m.acc_norm += x;
  if (m.n) m.acc /= m.n, m.acc_norm /= m.n;
  m.acc_stderr = mean_stderr(a);
  m.acc_norm_stderr = mean_stderr(an);
  return m;
}

nlohmann::ordered_json Fidelity::json() const {
  return {{"items", items},
          {"scored_tokens", tokens},
          {"agreement", agreement},
          {"mean_abs_ll_diff", mean_abs_ll_diff},
          {"mean_kl", mean_kl}};
}

RefDist compact_dist(const std::vector<float>& lp) {
  RefDist d;
  if (int64_t(lp.size()) <= kRefFullVocab) {
    d.lp = lp;
    return d;
  }
  std::vector<int32_t> idx(lp.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i);
  std::partial_sort(idx.begin(), idx.begin() + kRefTopK, idx.end(),
                    [&](int32_t a, int32_t b) { return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b); });
  idx.resize(size_t(kRefTopK));
  d.ids = idx;
  for (int32_t i : idx) d.lp.push_back(lp[size_t(i)]);
  return d;
}

double kl_divergence(const RefDist& p, const std::vector<float>& q) {
  double kl = 0;
  if (p.ids.empty()) {
    HG_CHECK(p.lp.size() == q.size());
    for (size_t v = 0; v < p.lp.size(); ++v) kl += std::exp(double(p.lp[v])) * (double(p.lp[v]) - double(q[v]));
    return std::max(0.0, kl);
  }
  double pm = 0, qm = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double pi = std::exp(double(p.lp[i])), qi = double(q[size_t(p.ids[i])]);
    kl += pi * (double(p.lp[i]) - qi);
    pm += pi, qm += std::exp(qi);
  }
  const double pt = 1.0 - pm, qt = std::max(1.0 - qm, 1e-30);  // the lumped rest
  if (pt > 1e-12) kl += pt * (std::log(pt) - std::log(qt));
  return std::max(0.0, kl);
}

void FidelityAccumulator::add(const ItemScore& ref, const ItemScore& s, const std::vector<std::vector<RefDist>>& ref_lp,
                              const std::vector<std::vector<std::vector<float>>>& s_lp) {
  HG_CHECK(ref.ll.size() == s.ll.size() && ref_lp.size() == s_lp.size());
  ++items_;
  agree_ += ref.pred == s.pred;
  for (size_t c = 0; c < s.ll.size(); ++c) {
    abs_ll_ += std::abs(s.ll[c] - ref.ll[c]);
    ++choices_;
  }
  for (size_t c = 0; c < s_lp.size(); ++c) {
    HG_CHECK(ref_lp[c].size() == s_lp[c].size());
    for (size_t k = 0; k < s_lp[c].size(); ++k) {
      kl_ += kl_divergence(ref_lp[c][k], s_lp[c][k]);
      ++tokens_;
    }
  }
}

Fidelity FidelityAccumulator::result() const {
  Fidelity f;
  f.items = items_;
  f.tokens = tokens_;
  f.agreement = items_ ? double(agree_) / items_ : 0;
  f.mean_abs_ll_diff = choices_ ? abs_ll_ / choices_ : 0;
  f.mean_kl = tokens_ ? kl_ / double(tokens_) : 0;
  return f;
}

void save_reference(const ReferenceScores& ref, const std::string& key, const std::string& path) {
  nlohmann::ordered_json head;
  head["format"] = "hgbench-reference-1";
  head["key"] = key;
  head["seconds"] = ref.seconds;
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  for (auto& s : ref.items) items.push_back(s.json());
  head["items"] = std::move(items);
  std::string out = head.dump() + "\n";
  auto put = [&](const void* p, size_t n) {
    if (n > 0) out.append(static_cast<const char*>(p), n);
  };
  for (auto& item : ref.dists) {
    const int32_t nc = int32_t(item.size());
    put(&nc, 4);
    for (auto& choice : item) {
      const int32_t nt = int32_t(choice.size());
      put(&nt, 4);
      for (auto& d : choice) {
        const int32_t ni = int32_t(d.ids.size()), nl = int32_t(d.lp.size());
        put(&ni, 4), put(&nl, 4);
        put(d.ids.data(), d.ids.size() * 4), put(d.lp.data(), d.lp.size() * 4);
      }
    }
  }
  AtomicFile f(path);
  f.write(out);
  f.commit();
}

std::optional<ReferenceScores> load_reference(const std::string& path, const std::string& key) {
  if (!file_present(path)) return std::nullopt;
  const std::string data = read_regular_file(path, int64_t(16) << 30);
  const size_t eol = data.find('\n');
  if (eol == std::string::npos) input_error("{}: torn reference (no header line)", path);
  ReferenceScores ref;
  try {
    const nlohmann::json head = nlohmann::json::parse(data.substr(0, eol));
    if (head.at("format").get<std::string>() != "hgbench-reference-1")
      input_error("{}: format '{}' (expected hgbench-reference-1)", path, head.at("format").get<std::string>());
    if (head.at("key").get<std::string>() != key) return std::nullopt;
    ref.seconds = head.at("seconds").get<double>();
    for (auto& j : head.at("items")) ref.items.push_back(ItemScore::from_json(j));
  } catch (const nlohmann::json::exception& e) {
    input_error("{}: malformed reference header ({})", path, e.what());
  }
  size_t at = eol + 1;
  auto get = [&](void* p, size_t n) {
    if (n > data.size() - at) input_error("{}: torn reference (ends inside item {})", path, ref.dists.size());
    if (n > 0) std::memcpy(p, data.data() + at, n);
    at += n;
  };
  auto count = [&](int64_t most) {
    int32_t n = 0;
    get(&n, 4);
    if (n < 0 || n > most) input_error("{}: malformed reference (a count of {} in item {})", path, n, ref.dists.size());
    return n;
  };
  for (size_t i = 0; i < ref.items.size(); ++i) {
    auto& item = ref.dists.emplace_back(size_t(count(int64_t(ref.items[i].ll.size()))));
    for (auto& choice : item) {
      choice.resize(size_t(count(int64_t(data.size() - at) / 8)));  // each needs at least its two counts
      for (auto& d : choice) {
        const int32_t ni = count(int64_t(data.size() / 4)), nl = count(int64_t(data.size() / 4));
        d.ids.resize(size_t(ni)), d.lp.resize(size_t(nl));
        get(d.ids.data(), size_t(ni) * 4), get(d.lp.data(), size_t(nl) * 4);
      }
    }
  }
  if (at != data.size()) input_error("{}: malformed reference ({} bytes after the last item)", path, data.size() - at);
  return ref;
}

}  // namespace hg
