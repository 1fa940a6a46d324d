// The `null` backend: every op, copies included, returns at once without reading or writing its
// buffers (embed still checks ids). With the `null` strategy it leaves only the engine's own work — the decoder's
// layer loop, strategy dispatch, logits handling, sampling — so `hgbench bench` can measure the
// harness's per-step overhead against a real step; dry runs use it for all math. Its outputs are
// meaningless by design.
#include "engine/backend/backend.h"
#include "engine/core/error.h"

namespace hg {
namespace {

class NullBackend final : public Backend {
 public:
  std::string_view name() const override { return "null"; }
  void matmul(const float*, int64_t, const Weight&, const float*, float*) override {}
  void rms_norm(const float*, const float*, int64_t, int64_t, float, float*) override {}
  void layer_norm(const float*, const float*, const float*, int64_t, int64_t, float, float*) override {}
  void rope(float*, int64_t, int, int, const int32_t*, const RopeTable&) override {}
  void swiglu(const float*, const float*, int64_t, float*) override {}
  void relu(float*, int64_t) override {}
  void add(float*, const float*, int64_t) override {}
  void embed(const Weight& table, const int32_t* ids, int64_t M, float*) override {
    for (int64_t m = 0; m < M; ++m)
      if (ids[m] < 0 || ids[m] >= table.rows())
        throw InputError(fmt::format("token id {} out of range [0, {})", ids[m], table.rows()));
  }
  void attention(const AttentionArgs&) override {}
  void group_logits(const float*, int, const void*, int64_t, int, float, float*, DType) override {}
  void heads_logits(const float*, int, int, const void*, int64_t, int64_t, int, float, float*, DType) override {}
  void softmax_rows(float*, int64_t, int64_t) override {}
  void group_weighted_v(const float*, int, const void*, int64_t, int, float*, DType) override {}
  void group_logit_max(const float*, int, const void*, int64_t, int, float, float*, DType) override {}
  void convert_to_f32(const void*, DType, int64_t, float*) override {}
  void merged_attention(const MergedAttention&) override {}
  float max_value(const float*, int64_t) override { return 0; }
  float exp_shift_sum(float*, int64_t n, float) override { return float(n); }
  void gather_rows(void*, const void*, int64_t, int64_t, const int32_t*, int64_t) override {}
  void copy_rows(void* const*, const void* const*, int64_t, int64_t) override {}
  void accumulate_scores(const ScoreRows&) override {}
  void pick_evictions(const EvictionPick*, int64_t, int32_t*) override {}
  void put_rows(void* const*, const void*, int64_t, int64_t) override {}
  void pool_scores(const ScorePool*, int64_t, int, bool) override {}
  void write_kv(const float*, int64_t, int, int, const int32_t*, void*, int64_t, DType) override {}
  void upload(void*, const void*, size_t) override {}
  void download(void*, const void*, size_t) override {}
  void copy(void*, const void*, size_t) override {}
  void upload_2d(void*, size_t, const void*, size_t, size_t, size_t) override {}
  void download_2d(void*, size_t, const void*, size_t, size_t, size_t) override {}
};

}  // namespace

std::unique_ptr<Backend> make_null_backend() { return std::make_unique<NullBackend>(); }

}  // namespace hg
