// Runtime construction and calibration.
#include "engine/runtime/runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/runtime/bandwidth.h"

namespace hg {


std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kEmulated: return "emulated";
    case DeviceKind::kCuda: return "cuda";
  }
  return "?";
}

int emulated_accel_threads() { return std::max(1, hardware_threads() / 2); }

Runtime::Runtime(const RuntimeConfig& cfg) {
  const int hw = hardware_threads();
  const bool have_cuda = cuda_device_count_or_zero() > 0;
  if (cfg.device == "auto") {
    kind_ = have_cuda ? DeviceKind::kCuda : DeviceKind::kEmulated;
  } else if (cfg.device == "emulated") {
    kind_ = DeviceKind::kEmulated;
  } else if (cfg.device == "cpu") {
    kind_ = DeviceKind::kCpu;
  } else if (cfg.device == "cuda") {
    if (!cuda_compiled()) throw UnsupportedError("device cuda: this build was not compiled with CUDA support");
    if (!have_cuda) throw UnsupportedError("device cuda: no CUDA device is visible on this machine");
    kind_ = DeviceKind::kCuda;
  } else {
    input_error("unknown device '{}' (expected auto, emulated, cuda or cpu)", cfg.device);
  }
  dry_ = cfg.dry;
  stage_clock_ = cfg.stage_clock;
  if (dry_ && !stage_clock_) input_error("dry execution needs a modeled clock (clock: modeled:<platform>)");
  if (dry_ && kind_ == DeviceKind::kCuda) input_error("dry execution runs on the emulated device, not cuda");
  std::optional<MemorySystem::DeviceAllocator> device_memory;
  TierConfig tiers = cfg.tiers;
  tiers.phantom = tiers.phantom || dry_;
  if (dry_) {
    accel_be_ = make_null_backend();
    description_ = "dry (null backends, phantom memory; times are modeled)";
  }
  if (kind_ == DeviceKind::kCuda) {
    // The GPU: its own backend (device memory), one host thread driving its stream.
    accel_be_ = make_backend("cuda");
    accel_threads_ = 1;
    cpu_threads_ = cfg.cpu_threads > 0 ? cfg.cpu_threads : std::max(1, hw - 1);
    description_ = fmt::format("cuda:0 {} ({:.0f} GiB)", accel_be_->device_name(),
                               double(accel_be_->device_memory_bytes()) / double(int64_t(1) << 30));
  } else if (kind_ == DeviceKind::kCpu) {
    accel_threads_ = cfg.accel_threads > 0 ? cfg.accel_threads : hw;
    cpu_threads_ = cfg.cpu_threads > 0 ? cfg.cpu_threads : hw;
    description_ = fmt::format("cpu (no accelerator role, {} threads)", accel_threads_);
  } else {
    accel_threads_ = cfg.accel_threads > 0 ? cfg.accel_threads : emulated_accel_threads();
    cpu_threads_ = cfg.cpu_threads > 0 ? cfg.cpu_threads : std::max(1, hw - accel_threads_);
    if (cfg.device_backend) accel_be_ = cfg.device_backend();
    description_ = fmt::format("emulated ({} backend, {} accelerator thread{}, {} CPU-worker thread{})",
                               accel_be_ ? accel_be_->name() : "cpu", accel_threads_,
                               accel_threads_ == 1 ? "" : "s", cpu_threads_, cpu_threads_ == 1 ? "" : "s");
  }
  TransferEngine::CopyFn copy_fn;
  std::function<void()> before_submit;
  if (accel_be_ && !accel_be_->host_memory()) {
    // A device with memory of its own: the gpu tier on its allocations, dram pinned (cudaHostAlloc)
    // so that copies are DMA, and copies that cross into or out of the gpu tier through its
    // upload/download (on the copy queue's thread: for CUDA, that thread's own stream). Before a
    // transfer is queued, the submitting thread's device work is waited for (Backend::synchronize).
    Backend* be = accel_be_.get();
    device_memory =
        MemorySystem::DeviceAllocator{[be](size_t n) { return be->alloc(n); }, [be](void* p) { be->free(p); },
                                      [be](size_t n) { return be->alloc_host(n); },
                                      [be](void* p) { be->free_host(p); },
                                      [be](void* p, size_t n) { be->register_host(p, n); },
                                      [be](void* p) { be->unregister_host(p); }, be->device_memory_bytes()};
    tiers.pinned_dram = true;
    copy_fn = [be](void* dst, const void* src, size_t n, Tier dt, Tier st) {
      if (dt == Tier::kGpu && st == Tier::kGpu)
        be->copy(dst, src, n), be->synchronize();
      else if (dt == Tier::kGpu)
        be->upload(dst, src, n);
      else if (st == Tier::kGpu)
        be->download(dst, src, n);
      else
        std::memcpy(dst, src, n);
    };
    before_submit = [this, be] {
      be->synchronize();
      counters_.add({.syncs = 1}), spend_microseconds(costs_.sync_us);
    };
  }
  mem_ = std::make_unique<MemorySystem>(tiers, std::move(device_memory));
  accel_ = std::make_unique<Queue>("accel", StageKind::kAccelCompute, 0, &log_, accel_threads_);
  copy_ = std::make_unique<Queue>("copy", StageKind::kTransfer, 1, &log_, 1);
  cpu_ = std::make_unique<Queue>("cpu", StageKind::kCpuCompute, 2, &log_, cpu_threads_);
  copy_out_ = std::make_unique<Queue>("copy-out", StageKind::kTransfer, 3, &log_, 1);
  if (dry_) copy_fn = [](void*, const void*, size_t, Tier, Tier) {};
  xfer_ = std::make_unique<TransferEngine>(*copy_, *copy_out_, std::move(copy_fn), std::move(before_submit));
  if (!accel_be_) accel_be_ = make_cpu_backend();
  cpu_be_ = dry_ ? make_null_backend() : make_cpu_backend();
  // Every accelerator op, copy and wait counted; fixed costs spent only where nothing else pays them.
  if (kind_ == DeviceKind::kEmulated && !dry_) costs_ = cfg.device_costs;
  accel_inner_ = accel_be_.get();
  accel_be_ = make_metered_backend(std::move(accel_be_), &counters_, costs_);
  xfer_->set_meter(&counters_, costs_.copy_us);
  accel_->set_wait_hook([this] { counters_.add({.waits = 1}), spend_microseconds(costs_.sync_us); });
  counters_.set_call_fn([](int64_t launches, int64_t copies) { add_task_calls(launches, copies); });
  counters_.set_step_fn([this] {
    const int64_t s = running_task_step();
    return s != kNoTaskStep ? s : log_.step();
  });
}

DeviceCosts device_costs_of(const PlatformProfile& p) {
  const auto& a = p.achieved;
  DeviceCosts c;
  c.launch_us = a.launch_us >= 0 ? a.launch_us : p.launch_us;
  c.copy_us = a.copy_us >= 0 ? a.copy_us : p.copy_us;
  c.sync_us = a.stage_us >= 0 ? a.stage_us : p.stage_us;
  return c;
}

void add_fixed_costs(PlatformProfile& p, const DeviceCosts& c) {
  p.launch_us += c.launch_us, p.copy_us += c.copy_us, p.stage_us += c.sync_us;
  auto& a = p.achieved;
  if (a.launch_us >= 0) a.launch_us += c.launch_us;
  if (a.copy_us >= 0) a.copy_us += c.copy_us;
  if (a.stage_us >= 0) a.stage_us += c.sync_us;
}

double Runtime::stage_seconds(StageKind kind, const StageWork& work, double measured_s) const {
  if (!stage_clock_) return measured_s;
  StageRecord r;
  r.kind = kind;
  r.work = work;
  return modeled_stage_seconds(r, *stage_clock_);
}

Runtime::~Runtime() {
  accel_->synchronize();
  copy_->synchronize();
  cpu_->synchronize();
  copy_out_->synchronize();
}

namespace {
// n floats on `tier`, written once by the pool (the first touch places the pages).
Allocation filled_floats(MemorySystem& mem, Tier tier, int64_t n) {
  Allocation a = mem.allocate(tier, n * 4);
  float* p = a.as<float>();
  parallel_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = float(i & 255);
  });
  return a;
}

// The best rate of pass(rep), in billions of units per second, over at least min_reps passes and
// `seconds` of passes (at most max_reps + 2); each pass does `units` (bytes read or copied, FLOPs).
template <class F>
double best_rate_g(int min_reps, int max_reps, double seconds, double units, F&& pass) {
  double best = 0, spent = 0;
  for (int rep = 0; rep < min_reps || spent < seconds; ++rep) {
    const double g = pass(rep);
    spent += units / g / 1e9;
    best = std::max(best, g);
    if (rep > max_reps) break;
  }
  return best;
}

// The median of `reps` timed calls of f, in seconds per call of `per` inner repetitions.
template <class F>
double median_seconds(int reps, int per, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < per; ++i) f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / per);
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[size_t(reps / 2)];
}

// Seconds of one call of `pass` (which ends by waiting for the device): after a warm-up, the
// median of an odd number (3-41) of calls filling about `seconds`.
template <class F>
double median_pass_seconds(double seconds, F&& pass) {
  pass();  // warm-up: weight upload, primitive, kernel choice
  const double one = median_seconds(1, 1, pass);
  const int reps = int(std::clamp(seconds / std::max(one, 1e-6), 3.0, 41.0)) | 1;
  return median_seconds(reps, 1, pass);
}
}  // namespace

double measure_read_gbs(MemorySystem& mem, Tier tier, int64_t bytes, double seconds) {
  const int64_t n = bytes / 4 / 64 * 64;
  Allocation a = filled_floats(mem, tier, n);
  const float* p = a.as<float>();
  return best_rate_g(3, 50, seconds, double(n) * 4, [&](int) { return read_pass_gbs(p, n); });
}

double measure_row_ns(MemorySystem& mem, Tier tier, int64_t bytes, double seconds) {
  constexpr int64_t kRowFloats = 128;  // 512 B: one F32 K/V row of head dim 128
  const int64_t rows = bytes / (kRowFloats * 4), n = std::min<int64_t>(16384, rows / 8);
  Allocation a = filled_floats(mem, tier, rows * kRowFloats);
  const float* p = a.as<float>();
  // Index sets in turn (so that a set's rows are not still cached from its last pass), each
  // sorted: the strategies select positions in token order.
  std::mt19937_64 g(7);
  std::vector<std::vector<int32_t>> sets(8, std::vector<int32_t>(static_cast<size_t>(n)));
  for (auto& s : sets) {
    for (auto& i : s) i = int32_t(g() % uint64_t(rows));
    std::sort(s.begin(), s.end());
  }
  // Each rows pass is paired with a stream pass over the same buffer right after it, and the best
  // of each is compared: both then come from the same stretch of a shared machine's bandwidth.
  // The stream passes read 64 MiB windows of the buffer in turn (more than any cache holds).
  const int64_t window = std::min<int64_t>(rows * kRowFloats, int64_t(16) << 20), windows = rows * kRowFloats / window;
  double stream_gbs = 0;
  const double best = best_rate_g(8, 200, seconds, double(n * kRowFloats * 4), [&](int rep) {
    const double g = rows_read_pass_gbs(p, kRowFloats, sets[size_t(rep) % sets.size()].data(), n);
    stream_gbs = std::max(stream_gbs, read_pass_gbs(p + (rep % windows) * window, window));
    return g;
  });
  // GB/s is bytes per ns: the row's time at the random-row rate minus its time in a stream.
  return std::max(0.0, double(kRowFloats * 4) / best - double(kRowFloats * 4) / stream_gbs);
}

namespace {
double measure_copy_gbs(MemorySystem& mem, Tier src, Tier dst, int64_t bytes, double seconds) {
  Allocation a = mem.allocate(src, bytes), b = mem.allocate(dst, bytes);
  std::memset(a.data(), 1, size_t(bytes));
  std::memset(b.data(), 0, size_t(bytes));
  return best_rate_g(3, 50, seconds, double(bytes), [&](int) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), size_t(bytes));  // one copy worker, as the runtime's copy queue
    return double(bytes) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  });
}

// The calling thread's pool size for a scope.
class PoolSize {
 public:
  explicit PoolSize(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~PoolSize() { set_num_threads(saved_); }
  PoolSize(const PoolSize&) = delete;
  PoolSize& operator=(const PoolSize&) = delete;

 private:
  int saved_;
};

double measure_cpu_flops(double seconds) {
  // oneDNN SGEMM 512×4096×4096 (the prefill shape): FLOP/s of the machine's best F32 GEMM.
  auto be = make_cpu_backend();
  const int64_t M = 512, K = 4096, N = 4096;
  std::vector<float> x(size_t(M * K), 0.5f), y(size_t(M * N));
  Weight w = make_weight(DType::kF32, {N, K});
  std::fill(static_cast<float*>(w.buf.data()), static_cast<float*>(w.buf.data()) + N * K, 0.25f);
  be->matmul(x.data(), M, w, nullptr, y.data());  // warm-up, primitive creation
  const double flops = 2.0 * double(M * K * N);
  return 1e9 * best_rate_g(2, 20, seconds, flops, [&](int) {
    const auto t0 = std::chrono::steady_clock::now();
    be->matmul(x.data(), M, w, nullptr, y.data());
    return flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  });
}

// A device backend's copy rates, each the best of several timed passes that end with a 4-byte
// download (which waits for the device): copy within device memory (bytes read + written, 1 GiB,
// reported only) and pinned host↔device copies (256 MiB).
void measure_device(Backend& be, double seconds, PlatformProfile* p, double* copy_gbs) {
  const size_t big = size_t(1) << 30, link = size_t(256) << 20;
  BackendArray<char> a(be, big), b(be, big);
  const std::unique_ptr<char, std::function<void(char*)>> pinned(static_cast<char*>(be.alloc_host(link)),
                                                                 [&be](char* q) { be.free_host(q); });
  char* host = pinned.get();
  std::memset(host, 1, link);
  be.upload(a.data(), host, link);
  float sink = 0;
  auto timed = [&](double bytes, const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.download(&sink, b.data(), 4);
    return bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };
  *copy_gbs = best_rate_g(3, 50, seconds, 2.0 * double(big), [&](int) {
    return timed(2.0 * double(big), [&] { be.copy(b.data(), a.data(), big); });
  });
  p->h2d_gbs = best_rate_g(3, 50, seconds, double(link), [&](int) {
    return timed(double(link), [&] { be.upload(b.data(), host, link); });
  });
  p->d2h_gbs = best_rate_g(3, 50, seconds, double(link), [&](int) {
    return timed(double(link), [&] { be.download(host, a.data(), link); });
  });
  p->gpu_mem_gib = double(be.device_memory_bytes()) / double(int64_t(1) << 30);
}

// Achieved rates of the accelerator's weight kernels through its own backend, the median of timed
// passes that each end with a 4-byte download (which waits for the device): a BF16 GEMM of the
// prefill shape (FLOP/s) and a BF16 GEMV, one row through a 128 MiB weight (weight bytes per second).
void measure_weight_rates(Backend& be, int64_t gemm_m, int64_t gemm_k, int64_t gemm_n, double seconds,
                          PlatformProfile* p) {
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-1, 1);
  // Random operands: a matrix unit runs measurably faster on constants or zeros.
  auto weight = [&](int64_t n, int64_t k) {
    Weight w = make_weight(DType::kBF16, {n, k});
    uint16_t* wp = static_cast<uint16_t*>(w.buf.data());
    for (int64_t i = 0; i < n * k; ++i) wp[i] = f32_to_bf16(u(g));
    return w;
  };
  auto input = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = u(g);
    BackendArray<float> d(be, x.size());
    be.upload(d.data(), x.data(), x.size() * 4);
    return d;
  };
  float sink = 0;
  auto pass_s = [&](const Weight& w, const BackendArray<float>& x, int64_t m, BackendArray<float>& y) {
    return median_pass_seconds(seconds, [&] { be.matmul(x.data(), m, w, nullptr, y.data()), be.download(&sink, y.data(), 4); });
  };
  {
    const Weight w = weight(gemm_n, gemm_k);
    const BackendArray<float> x = input(gemm_m * gemm_k);
    BackendArray<float> y(be, size_t(gemm_m * gemm_n));
    p->gpu_flops = 2.0 * double(gemm_m * gemm_k * gemm_n) / pass_s(w, x, gemm_m, y);
  }
  const int64_t K = 8192, N = 8192;
  const Weight w = weight(N, K);
  const BackendArray<float> x = input(K);
  BackendArray<float> y(be, size_t(N));
  p->gpu_mem_gbs = double(w.bytes()) / pass_s(w, x, 1, y) / 1e9;
}

// The achieved FLOP/s of `be`'s attention in a prefill shape, 32 query and 8 KV heads of D, F16 K
// and V (4·H·D FLOPs per key). A host backend: a causal chunk of 64 query rows after 1,984 cached
// positions (its rate per key does not grow with the rows; a pass of 512 rows took seconds on one
// thread, and minutes under a sanitizer). A GPU: a whole causal 8K prompt, as its kernel's rate
// falls with the key count and the prompts it runs are 8K-32K.
double attention_flops(Backend& be, int D, double seconds) {
  const bool device = !be.host_memory();
  const int H = 32, Hkv = 8, kRows = device ? 8192 : 64, kKeys = device ? 8192 : 2048;
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint16_t> kv(size_t(Hkv) * kKeys * size_t(D));
  for (auto& x : kv) x = f32_to_f16(u(g));
  std::vector<float> q(size_t(kRows) * H * size_t(D));
  for (auto& x : q) x = u(g);
  BackendArray<uint16_t> k(be, kv.size()), v(be, kv.size());
  BackendArray<float> dq(be, q.size()), out(be, q.size());
  be.upload(k.data(), kv.data(), kv.size() * 2);
  be.upload(v.data(), kv.data(), kv.size() * 2);
  be.upload(dq.data(), q.data(), q.size() * 4);
  std::vector<AttnRow> rows(kRows);
  double keys = 0;
  for (int i = 0; i < kRows; ++i) {
    rows[size_t(i)] = AttnRow{k.data(), v.data(), int64_t(kKeys) * D, kKeys - kRows + i + 1};
    keys += rows[size_t(i)].n_keys;
  }
  const AttentionArgs a = attention_args(H, Hkv, D, 1.0f / std::sqrt(float(D)), dq.data(), rows, out.data(), DType::kF16);
  float sink = 0;
  return 4.0 * H * D * keys / median_pass_seconds(seconds, [&] { be.attention(a), be.download(&sink, out.data(), 4); });
}

// GB/s of F16 K and V read by the host backend's decode attention (one query row per head, 32
// heads over 8 KV heads, 8,192 keys, D = 128: 33.5 MB a layer), on the calling pool. A pass visits
// `bytes` of layers in turn, as a decode step does, so that no layer is read from the last level cache.
double cpu_attention_gbs(int64_t bytes, double seconds) {
  constexpr int H = 32, Hkv = 8, D = 128, kKeys = 8192;
  constexpr int64_t kLayerElems = int64_t(Hkv) * kKeys * D;
  const int layers = int(std::max<int64_t>(2, bytes / (kLayerElems * 4)));
  auto host = make_cpu_backend();
  std::mt19937 g(9);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint16_t> kv(size_t(2 * kLayerElems) * size_t(layers));
  for (int64_t i = 0; i < 2 * kLayerElems; ++i) kv[size_t(i)] = f32_to_f16(u(g));
  for (int l = 1; l < layers; ++l)  // copies: the bytes, not their values, decide the rate
    std::memcpy(kv.data() + size_t(l) * size_t(2 * kLayerElems), kv.data(), size_t(2 * kLayerElems) * 2);
  std::vector<float> q(size_t(H) * D), out(q.size());
  for (auto& x : q) x = u(g);
  const double s = median_pass_seconds(seconds, [&] {
    for (int l = 0; l < layers; ++l) {
      const uint16_t* k = kv.data() + size_t(l) * size_t(2 * kLayerElems);
      const std::vector<AttnRow> rows = {AttnRow{k, k + kLayerElems, int64_t(kKeys) * D, kKeys}};
      host->attention(attention_args(H, Hkv, D, 1.0f / std::sqrt(float(D)), q.data(), rows, out.data(), DType::kF16));
    }
  });
  return double(kv.size()) * 2 * 1e-9 / s;
}

// The attention rate at the head dimensions of the evaluated models (64: Llama-3.2-1B; 128: the
// rest of ../shared/MODELS.md); gpu.attn_tflops is the 128 one.
void measure_attention_flops(Backend& be, double seconds, PlatformProfile* p) {
  for (int d : {64, 128}) p->gpu_attn_flops_by_dim[d] = attention_flops(be, d, seconds);
  p->gpu_attn_flops = p->gpu_attn_flops_by_dim[128];
}

// Elements per second of the host backend's exp_shift_sum over a 4,096-float row in cache (the
// unit of StageWork::elems), on the calling thread: score policies run there, beside the
// accelerator's kernels or, on a GPU, on the host thread that drives it after a download.
double measure_elem_eps(double seconds) {
  auto host = make_cpu_backend();
  constexpr int64_t kN = 4096;
  constexpr int kCalls = 64;
  std::vector<float> x(static_cast<size_t>(kN));
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : x) v = u(g);
  float sink = 0;
  // exp(x − 1) maps (0, 1] into itself: repeated calls stay in range.
  const double s = median_pass_seconds(seconds, [&] {
    for (int i = 0; i < kCalls; ++i) sink += host->exp_shift_sum(x.data(), kN, 1.0f);
  });
  volatile float keep = sink;
  (void)keep;
  return double(kN) * kCalls / s;
}

// Fixed costs: a stage's hand-off between queue threads (half an empty stage's submit-and-wait
// round trip), a tiny kernel's launch on `be` (2,000 back to back, then synchronize) and a 64-byte
// upload, each the median of 9 timed batches.
void measure_fixed_costs(Backend& be, PlatformProfile* p) {
  EventLog log;
  {
    Queue q("probe", StageKind::kAccelCompute, 0, &log, 1);
    p->stage_us = 1e6 / 2 * median_seconds(9, 200, [&] { q.submit("probe", {}, {}, [] {}).wait(); });
  }
  BackendArray<float> a(be, 64), b(be, 64);
  std::vector<float> h(64, 1.0f);
  be.upload(a.data(), h.data(), 256);
  be.upload(b.data(), h.data(), 256);
  constexpr int kLaunches = 2000;
  p->launch_us = 1e6 / kLaunches * median_seconds(9, 1, [&] {
                   for (int i = 0; i < kLaunches; ++i) be.add(a.data(), b.data(), 64);
                   be.synchronize();
                 });
  p->copy_us = 1e6 * median_seconds(9, 100, [&] { be.upload(a.data(), h.data(), 64); });
}
}  // namespace

PlatformProfile calibrate(const CalibrateOptions& o, std::string* notes) {
  MemorySystem mem(TierConfig{});
  PlatformProfile p;
  p.name = "this-machine";
  const bool gpu = cuda_device_count_or_zero() > 0;
  // The CPU side is measured with the threads the runtime's CPU worker gets beside the accelerator
  // (Runtime: all but one beside a GPU, the rest of the machine beside the emulated accelerator).
  const int at = gpu ? 1 : std::min(num_threads(), emulated_accel_threads());
  const int ct = std::max(1, num_threads() - at);
  {
    const PoolSize scoped(ct);
    p.dram_gbs = measure_read_gbs(mem, Tier::kDram, o.buffer_bytes, o.seconds_per_measure);
    p.far_gbs = measure_read_gbs(mem, Tier::kFar, o.buffer_bytes, o.seconds_per_measure);
    p.dram_row_ns = measure_row_ns(mem, Tier::kDram, o.buffer_bytes, o.seconds_per_measure);
    p.far_row_ns = measure_row_ns(mem, Tier::kFar, o.buffer_bytes, o.seconds_per_measure);
    p.cpu_flops = measure_cpu_flops(o.seconds_per_measure);
    p.cpu_attn_gbs = cpu_attention_gbs(o.buffer_bytes, o.seconds_per_measure);
  }
  p.dram_gib = double(mem.ledger().usage(Tier::kDram).capacity) / double(1 << 30);
  p.far_gib = double(mem.ledger().usage(Tier::kFar).capacity) / double(1 << 30);
  const double copy = measure_copy_gbs(mem, Tier::kDram, Tier::kFar, o.buffer_bytes / 2, o.seconds_per_measure);
  std::string n = fmt::format("CPU worker ({} thread{}): dram read {:.1f} GB/s, far read {:.1f} GB/s, random 512 B "
                              "rows +{:.0f} / +{:.0f} ns each over a stream (dram / far), SGEMM {:.0f} GFLOP/s, "
                              "decode attention over F16 KV {:.1f} GB/s; dram→far copy {:.1f} GB/s (one worker)",
                              ct, ct == 1 ? "" : "s", p.dram_gbs, p.far_gbs, p.dram_row_ns, p.far_row_ns,
                              p.cpu_flops / 1e9, p.cpu_attn_gbs, copy);
  if (!mem.far_note().empty()) n += "; " + mem.far_note();
  if (gpu) {
    auto be = make_backend("cuda");
    double copy_gbs = 0;
    measure_device(*be, o.seconds_per_measure, &p, &copy_gbs);
    measure_weight_rates(*be, 4096, 8192, 8192, o.seconds_per_measure, &p);
    measure_attention_flops(*be, o.seconds_per_measure, &p);
    measure_fixed_costs(*be, &p);
    {
      const PoolSize one(1);
      p.gpu_elem_eps = measure_elem_eps(o.seconds_per_measure);
    }
    n += fmt::format(
        "; GPU {}: BF16 GEMM {:.0f} TFLOP/s, F16 prefill attention {:.1f} TFLOP/s (D = 128; {:.1f} at D = 64) and BF16 GEMV {:.0f} GB/s of "
        "weights (achieved), device copy {:.0f} GB/s (read + write), host→device {:.1f} GB/s, device→host {:.1f} "
        "GB/s (pinned)",
        be->device_name(), p.gpu_flops / 1e12, p.gpu_attn_flops / 1e12, p.gpu_attn_flops_by_dim[64] / 1e12, p.gpu_mem_gbs,
        copy_gbs, p.h2d_gbs, p.d2h_gbs);
  } else {
    // No GPU: the emulated accelerator is this CPU's backend on the threads the runtime gives it,
    // and its "link" is a memcpy by the copy worker; its rates are the achieved rates of its own
    // weight kernels on those threads, so that a modeled replay of an emulated run matches the run.
    const PoolSize scoped(at);
    auto be = make_cpu_backend();
    measure_weight_rates(*be, 512, 4096, 4096, o.seconds_per_measure, &p);
    measure_attention_flops(*be, o.seconds_per_measure, &p);
    measure_fixed_costs(*be, &p);
    p.gpu_elem_eps = measure_elem_eps(o.seconds_per_measure);
    p.gpu_mem_gib = p.dram_gib;
    p.h2d_gbs = p.d2h_gbs = copy;
    n += fmt::format(
        "; no GPU: gpu = the emulated accelerator ({} thread{}: BF16 GEMM {:.0f} GFLOP/s, F16 prefill attention {:.0f} "
        "GFLOP/s (D = 128; {:.0f} at D = 64), BF16 GEMV {:.1f} GB/s of weights, achieved), link = memcpy copy bandwidth",
        at, at == 1 ? "" : "s", p.gpu_flops / 1e9, p.gpu_attn_flops / 1e9, p.gpu_attn_flops_by_dim[64] / 1e9, p.gpu_mem_gbs);
  }
  n += fmt::format("; score policies {:.2f} G exp-sum elements/s on the accelerator's host thread",
                   p.gpu_elem_eps / 1e9);
  n += fmt::format("; fixed costs: {:.1f} us per stage hand-off, {:.2f} us per kernel launch, {:.2f} us per copy",
                   p.stage_us, p.launch_us, p.copy_us);
  if (notes) *notes = n;
  p.source = "calibrated by hgbench calibrate";
  return p;
}

}  // namespace hg
