// Multiple-choice scoring through a strategy.
#include "datasets/score.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
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

double mean_stderr(const std::vector<double>& v) {
  const size_t n = v.size();
  if (n < 2) return 0;
  double m = 0;
  for (double x : v) m += x;
  m /= double(n);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / double(n - 1)) / std::sqrt(double(n));
}

ContextMode parse_context_mode(const std::string& s, const std::string& where) {
  if (s == "prefill") return ContextMode::kPrefill;
  if (s == "stream") return ContextMode::kStream;
  input_error("{}: context '{}' (expected prefill or stream)", where, s);
}

const char* context_mode_name(ContextMode m) { return m == ContextMode::kPrefill ? "prefill" : "stream"; }

EncodedRequest encode_request(const Tokenizer& tok, const Request& r, bool add_bos, int max_length) {
  std::string ctx = r.context;
  const size_t keep = ctx.find_last_not_of(" \t\n\r\f\v");
  const std::string moved = keep == std::string::npos ? ctx : ctx.substr(keep + 1);
  ctx.resize(ctx.size() - moved.size());
  EncodedRequest e;
  e.context = tok.encode(ctx);
  const size_t n_ctx = e.context.size();
  for (auto& c : r.continuations) {
    const std::vector<int32_t> whole = tok.encode(ctx + moved + c);
    e.continuations.emplace_back(whole.begin() + int64_t(std::min(n_ctx, whole.size())), whole.end());
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

Scorer::Scorer(const Model& model, Backend& backend, KvStrategy& kv, Runtime* rt, ContextMode mode, bool add_bos)
    : model_(model), be_(backend), kv_(kv), rt_(rt && rt->device() != DeviceKind::kCpu ? rt : nullptr), mode_(mode),
      add_bos_(add_bos), dec_(model, backend, kv) {}

void Scorer::forward(std::span<const int32_t> t, std::span<const TokenRow> rows, std::span<const int32_t> want,
                     float* lg) {
  if (!rt_) {
    dec_.forward(t, rows, want, lg);
    return;
  }
  rt_->log().set_step(step_);
  rt_->accel().submit(step_ == 0 ? "prefill" : "decode", forward_work(model_, rows, &kv_, int64_t(want.size()), dec_.max_rows()), {}, [&] {
    dec_.forward(t, rows, want, lg);
  }).wait();
  ++step_;
}

ItemScore Scorer::score(const Request& r, std::vector<std::vector<std::vector<float>>>* logprobs) {
  const EncodedRequest e = encode_request(*model_.tokenizer, r, add_bos_, model_.hp.max_pos);
  const int C = int(e.continuations.size());
  const int32_t n_ctx = int32_t(e.context.size());
  const int64_t V = model_.hp.n_vocab;
  // Prefill mode prefills all but the last context token exactly; that token is a decode step, so
  // that every scored position (the first continuation token included) comes from a step the
  // strategy shapes. Stream mode: a one-token prompt, every other token a decode step.
  const int32_t prefilled = mode_ == ContextMode::kPrefill ? std::max<int32_t>(1, n_ctx - 1) : 1;
  std::vector<int32_t> capacity(static_cast<size_t>(C)), prompt_len(size_t(C), prefilled);
  for (int c = 0; c < C; ++c) {
    capacity[size_t(c)] = n_ctx + std::max<int32_t>(1, int32_t(e.continuations[size_t(c)].size()));
    // The last continuation token is scored, not fed: capacity − 1 positions are used.
    if (model_.traits.pos == PosKind::kLearned && capacity[size_t(c)] - 1 > model_.hp.max_pos)
      input_error("{} item {}: {} tokens, but the model has {} learned positions", r.task, r.index,
                  capacity[size_t(c)] - 1, model_.hp.max_pos);
  }
  ItemScore s;
  s.index = r.index;
  s.gold = r.gold;
  s.context_tokens = n_ctx;
  s.truncated = e.truncated;
  s.ll.assign(size_t(C), 0.0);
  s.tokens.assign(size_t(C), 0);
  s.greedy.assign(size_t(C), true);
  if (logprobs) logprobs->assign(size_t(C), {});
  step_ = 0;
  kv_.begin(dec_.kv_shape(), capacity, prompt_len);

  std::vector<int32_t> toks, want;
  std::vector<TokenRow> rows;
  std::vector<int> row_choice;
  std::vector<float> logits, lp;
  // Scores the logits of row i (choice row_choice[i]) against that choice's token at `k`.
  auto take = [&](size_t i, int k) {
    const int c = row_choice[i];
    const int32_t target = e.continuations[size_t(c)][size_t(k)];
    const float* x = logits.data() + int64_t(i) * V;
    log_softmax(x, V, lp);
    s.ll[size_t(c)] += double(lp[size_t(target)]);
    s.tokens[size_t(c)] += 1;
    if (std::max_element(x, x + V) - x != target) s.greedy[size_t(c)] = false;
    if (logprobs) (*logprobs)[size_t(c)].push_back(lp);
  };
  auto run = [&](bool with_logits) {
    want.clear();
    if (with_logits)
      for (size_t i = 0; i < rows.size(); ++i) want.push_back(int32_t(i));
    logits.resize(want.size() * size_t(V));
    forward(toks, rows, want, logits.data());
  };

  // The context, for every choice's sequence.
  if (mode_ == ContextMode::kPrefill) {
    toks.clear(), rows.clear(), row_choice.clear();
    for (int c = 0; c < C; ++c)
      for (int32_t p = 0; p < prefilled; ++p) toks.push_back(e.context[size_t(p)]), rows.push_back({c, p});
    want.clear();
    if (prefilled == n_ctx)  // a one-token context: its prefill gives the first scored logits
      for (int c = 0; c < C; ++c) want.push_back((c + 1) * n_ctx - 1), row_choice.push_back(c);
    logits.resize(want.size() * size_t(V));
    forward(toks, rows, want, logits.data());
    if (prefilled < n_ctx) {
      toks.clear(), rows.clear(), row_choice.clear();
      for (int c = 0; c < C; ++c) toks.push_back(e.context[size_t(n_ctx - 1)]), rows.push_back({c, n_ctx - 1}), row_choice.push_back(c);
      run(true);
    }
  } else {
    for (int32_t p = 0; p < n_ctx; ++p) {
      toks.clear(), rows.clear(), row_choice.clear();
      for (int c = 0; c < C; ++c) toks.push_back(e.context[size_t(p)]), rows.push_back({c, p}), row_choice.push_back(c);
      run(p == n_ctx - 1);
    }
  }
  for (size_t i = 0; i < row_choice.size(); ++i)
    if (!e.continuations[size_t(row_choice[i])].empty()) take(i, 0);
  // The continuations, one teacher-forced token per step; the last token is scored, not fed.
  for (int k = 0;; ++k) {
    toks.clear(), rows.clear(), row_choice.clear();
    for (int c = 0; c < C; ++c) {
      const auto& cont = e.continuations[size_t(c)];
      if (int(cont.size()) > k + 1) toks.push_back(cont[size_t(k)]), rows.push_back({c, n_ctx + k}), row_choice.push_back(c);
    }
    if (rows.empty()) break;
    run(true);
    for (size_t i = 0; i < rows.size(); ++i) take(i, k + 1);
  }
  s.pred = argmax(s.ll);
  std::vector<double> norm(static_cast<size_t>(C));
  for (int c = 0; c < C; ++c) norm[size_t(c)] = s.ll[size_t(c)] / double(std::max<size_t>(1, char_length(r.choices[size_t(c)])));
  s.pred_norm = argmax(norm);
  return s;
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

}  // namespace hg
