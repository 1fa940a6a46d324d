// Log-likelihood scoring of multiple-choice requests through a KV strategy, lm-eval style: each
// choice's continuation tokens are scored given the context; acc (argmax log-likelihood) and
// acc_norm (log-likelihood over the choice's length in characters), each with its standard error;
// and the fidelity of a strategy against a reference (`full`) on the same items.
#pragma once
#include <cmath>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "datasets/tasks.h"
#include "engine/core/model.h"
#include "engine/decoder/decoder.h"
#include "engine/tokenizer/chat_template.h"

namespace hg {

class Runtime;
class Tokenizer;

// prefill: all but the last context token are prefilled (exact attention for every strategy), then
// the last context token and each choice's tokens are teacher-forced as decode steps with the
// strategy active, so every scored position (a one-token answer's too) is one the strategy shapes. stream: every token, the
// context included, is a decode step after a one-token prompt, so the strategy shapes the whole
// sequence.
enum class ContextMode { kPrefill, kStream };
ContextMode parse_context_mode(const std::string& s, const std::string& where);
const char* context_mode_name(ContextMode m);

// lm-eval's _encode_pair: trailing whitespace of the context moves to the continuation; the
// continuation's tokens are those of encode(context + continuation) after len(encode(context)).
// BOS is prepended to the context when add_bos (lm-eval's HF models: only with add_bos_token).
// With max_length > 0 the context is left-truncated, as lm-eval cuts context + continuation to its
// last max_length + 1 tokens, here for the longest choice: every choice then sees the same context
// (lm-eval gives a shorter choice of a truncated item up to the length difference more).
struct EncodedRequest {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> continuations;
  int truncated = 0;  // context tokens dropped from the front
};
// With a chat template, the context is the user's turn and the continuation follows the assistant's
// header, the whitespace after it moved into the continuation (lm-eval's rule for a context's
// trailing whitespace); add_bos adds none where the template writes BOS itself.
EncodedRequest encode_request(const Tokenizer& tok, const Request& r, bool add_bos, int max_length = 0,
                              const ChatTemplate* chat = nullptr);

struct ItemScore {
  int index = 0, gold = 0;
  int pred = 0, pred_norm = 0;   // argmax of ll, of ll / length in characters
  int context_tokens = 0;
  int truncated = 0;             // context tokens dropped to fit the model's positions
  std::vector<double> ll;        // per choice: Σ log p(continuation token)
  std::vector<int> tokens;       // per choice: continuation tokens
  std::vector<bool> greedy;      // per choice: every token was the argmax
  nlohmann::ordered_json json() const;
  static ItemScore from_json(const nlohmann::json& j);  // throws nlohmann's errors on a bad record
};

// Per choice, the log-softmax over the vocabulary at each scored position: [choice][token][V].
using ChoiceLogprobs = std::vector<std::vector<std::vector<float>>>;

// Scores requests with one strategy. An item's context runs once, on the first of its choices'
// sequences; after its last token the strategy forks that sequence into the others, and each
// choice continues from its fork. Items run in batches of up to batch_seqs sequences per forward
// and kBatchTokens positions of KV cache in all (the bound a batch of 64 sequences at lm-eval's
// 2048-token max_length had), items of similar length together (a strategy's per-sequence state
// does not depend on its batch; HybridGen's adaptive K is the batch's, as the scheduler sets one K
// per step). A strategy that
// calibrates on its first prompt (needs_prompt_attention(): InfiniGen's skew) is first shown the
// longest context as an exact prefill, in either mode, as its authors calibrate once offline. A
// runtime with an accelerator runs each forward on its queue.
class Scorer {
 public:
  static constexpr int kDefaultBatchSeqs = 128;
  static constexpr int64_t kBatchTokens = 64 * 2048;
  Scorer(const Model& model, Backend& backend, KvStrategy& kv, Runtime* rt, ContextMode mode, bool add_bos,
         int batch_seqs = kDefaultBatchSeqs);
  // One item; logprobs, when given, receives its distributions.
  ItemScore score(const Request& r, ChoiceLogprobs* logprobs = nullptr);
  // Every request; done(index, score, logprobs) as each batch ends (logprobs empty unless asked for).
  // Items are scored in batches of similar length, so calls come in no particular order of index.
  using ItemDone = std::function<void(size_t, ItemScore&, ChoiceLogprobs&)>;
  void score_all(std::span<const Request> reqs, bool logprobs, const ItemDone& done);
  // Called after each batch with its number of items (the strategy's step_stats() are then its last step's).
  using BatchDone = std::function<void(int items)>;
  void on_batch(BatchDone f) { on_batch_ = std::move(f); }
  // The prompt a strategy that calibrates on one (needs_prompt_attention()) is shown, as an exact
  // prefill, before the first item; without it, the longest context of the items scored.
  void set_calibration(std::vector<int32_t> tokens) { calibration_ = std::move(tokens); }
  // Every request as one user turn of `t` (resolve_chat_template); none by default.
  void set_chat_template(ChatTemplate t) { chat_ = std::move(t); }
  // Called after each forward (a step of the strategy: its step_stats() are then that step's).
  void on_step(std::function<void()> f) { on_step_ = std::move(f); }
  // The attended fraction of the context over every decode row scored so far (keys attended, on the
  // accelerator and the CPU, over the row's tokens, itself included); NaN before any. 1.0: the
  // strategy compressed nothing these items reached.
  double attended_fraction() const { return context_keys_ > 0 ? attended_keys_ / context_keys_ : NAN; }
  // Token rows forwarded so far: prompt rows (prefilled) and decode rows (one token per step and
  // sequence), and the forwards (steps) they took. Their sum over the wall time is the scoring's rate.
  struct Work {
    int64_t prefill_rows = 0, decode_rows = 0, forwards = 0;
    int64_t rows() const { return prefill_rows + decode_rows; }
  };
  const Work& work() const { return work_; }

 private:
  void forward(std::span<const int32_t> t, std::span<const TokenRow> rows, std::span<const int32_t> want, float* lg);
  void score_batch(std::span<const Request> reqs, std::span<const EncodedRequest> enc, std::span<const size_t> which,
                   bool logprobs, const ItemDone& done);
  void calibrate(std::span<const EncodedRequest> enc);
  const Model& model_;
  Backend& be_;
  KvStrategy& kv_;
  Runtime* rt_;
  ContextMode mode_;
  bool add_bos_;
  int batch_seqs_;
  Decoder dec_;
  int64_t step_ = 0;
  bool calibrated_ = false;
  BatchDone on_batch_;
  std::function<void()> on_step_;
  std::vector<int32_t> prompt_;  // the batch's prompt length per sequence
  std::vector<int32_t> calibration_;
  ChatTemplate chat_;
  Work work_;
  double attended_keys_ = 0, context_keys_ = 0, pending_attended_ = 0, pending_context_ = 0;
  void count_attended(std::span<const TokenRow> rows, bool before);
};

struct TaskMetrics {
  int n = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
  nlohmann::ordered_json json() const;
};
// The sample standard error of the mean (0 below two values).
double mean_stderr(const std::vector<double>& v);
// lm-eval's acc / acc_norm with the sample standard error of the mean.
TaskMetrics task_metrics(const std::vector<ItemScore>& items, const std::vector<Request>& reqs);

// A strategy against a reference on the same items (1: correct, 0: not, per item, same order):
// the accuracy difference, its paired bootstrap 95 % interval (resampled items, fixed seed) and
// McNemar's exact two-sided p over the discordant items (b: only the strategy right, c: only the
// reference). An unpaired standard error cannot see a difference smaller than itself; these can.
struct PairedComparison {
  int n = 0, b = 0, c = 0;
  double diff = 0, ci_lo = 0, ci_hi = 0, mcnemar_p = 1;
  nlohmann::ordered_json json() const;
};
PairedComparison paired_compare(const std::vector<int>& strategy, const std::vector<int>& reference,
                                int resamples = 10000, uint64_t seed = 1);

// A reference's next-token distribution at one scored position, as kept for KL: the whole
// log-softmax for vocabularies of up to kRefFullVocab tokens, else its kRefTopK most likely tokens
// with the rest as one lumped outcome — KL against the lumped distribution is a lower bound of the
// full KL (log-sum inequality) and bounds what a reference costs to keep for every item.
constexpr int64_t kRefFullVocab = 1024;
constexpr int kRefTopK = 256;
struct RefDist {
  std::vector<int32_t> ids;  // empty: lp is the whole distribution
  std::vector<float> lp;
};
RefDist compact_dist(const std::vector<float>& lp);
// KL(p ‖ q) in nats; q a whole log-softmax.
double kl_divergence(const RefDist& p, const std::vector<float>& q);
// A reference scored once for every strategy: per item its scores and distributions [choice][token].
struct ReferenceScores {
  std::vector<ItemScore> items;
  std::vector<std::vector<std::vector<RefDist>>> dists;
  double seconds = 0;  // what scoring it took
};
// Kept in a result directory, so that --resume compares with the same reference instead of scoring
// it again: `path` is binary (a JSON header line with `key`, then each distribution's ids and
// log-probabilities as little-endian int32 and float32), written atomically.
void save_reference(const ReferenceScores& ref, const std::string& key, const std::string& path);
// The reference saved at `path` under `key`; nullopt when there is none or it was saved under
// another key; InputError naming the file when it is torn or malformed.
std::optional<ReferenceScores> load_reference(const std::string& path, const std::string& key);

// A strategy's scores against a reference's on the same items.
struct Fidelity {
  int items = 0;
  int64_t tokens = 0;          // scored positions
  double agreement = 0;        // fraction of items where the chosen answer (acc) matches
  double mean_abs_ll_diff = 0; // per choice, |ll − ll_ref|
  double mean_kl = 0;          // per scored token, KL(reference ‖ strategy) in nats
  nlohmann::ordered_json json() const;
};
class FidelityAccumulator {
 public:
  void add(const ItemScore& ref, const ItemScore& s, const std::vector<std::vector<RefDist>>& ref_lp,
           const std::vector<std::vector<std::vector<float>>>& s_lp);
  Fidelity result() const;

 private:
  int items_ = 0, agree_ = 0, choices_ = 0;
  int64_t tokens_ = 0;
  double abs_ll_ = 0, kl_ = 0;
};

}  // namespace hg
