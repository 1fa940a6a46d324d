// Host memory estimates before allocation (host_estimate.h).
#include "engine/decoder/host_estimate.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "engine/core/error.h"

namespace hg {
namespace {

// Per token of one sequence: a dry run's bookkeeping per layer and KV head (a position and a score
// or slot index), per layer (page and ring entries), and per token (ids, attended counts). Measured
// with `hgbench` dry runs of every strategy at 16K and 64K tokens, batch 1 and 8: at most 5.2, 11 and
// 64 bytes (docs/errors.md, "Memory"); these are those rounded up.
constexpr double kDryPerLayerHead = 8, kDryPerLayer = 16, kDryPerToken = 64;

// A saturating product of non-negative factors (a sweep may ask for 2^31 tokens × 10^9 sequences).
double times(std::initializer_list<double> f) {
  double p = 1;
  for (double x : f) p *= std::max(0.0, x);
  return p;
}

int64_t read_int(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return -1;
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

HostEstimate generation_host_estimate(const HParams& hp, int64_t prompt, int64_t decode, int64_t batch,
                                      int64_t prefill_rows, bool dry) {
  const double tokens = times({double(prompt) + double(decode), double(batch)});
  const double L = hp.n_layers, Hkv = hp.n_kv_heads, D = hp.head_dim;
  double bytes = tokens * (L * Hkv * kDryPerLayerHead + L * kDryPerLayer + kDryPerToken);
  std::string basis =
      fmt::format("{} + {} tokens × batch {} × {} layers", prompt, decode, batch, hp.n_layers);
  if (!dry) {
    // The whole KV at 16 bits, twice; the prefill's F32 activations per row (the residual stream
    // and its normed copy, Q, K, V and the attention output, the FFN's gate, up and product).
    bytes += times({tokens, 2 * 2 * 2, L, Hkv, D});
    const double rows =
        std::min(double(std::max<int64_t>(1, prefill_rows)), times({double(prompt), double(batch)}));
    const double per_row = 4.0 * (4.0 * hp.d_model + 2.0 * hp.n_heads * D + 2.0 * Hkv * D + 3.0 * hp.d_ff);
    bytes += rows * per_row;
    basis += ", KV and prefill activations";
  } else {
    basis += ", dry bookkeeping";
  }
  constexpr double kMax = 9.0e18;  // beyond int64: any machine's answer is the same
  return {int64_t(std::min(bytes, kMax)), basis};
}

int64_t host_memory_available() {
  int64_t avail = -1;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key) {
    if (key == "MemAvailable:" && in >> kb >> unit) {
      avail = kb * 1024;
      break;
    }
    in.ignore(1 << 20, '\n');
  }
  // A cgroup v2 limit on this process (containers, Slurm jobs) below what the machine has.
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    const int64_t max = read_int(dir + "/memory.max"), cur = read_int(dir + "/memory.current");
    if (max > 0 && cur >= 0) avail = avail < 0 ? max - cur : std::min(avail, max - cur);
  }
  return avail;
}

void require_host_memory(const HostEstimate& e, const std::string& what) {
  const int64_t avail = host_memory_available();
  if (avail < 0 || e.bytes <= avail) return;
  throw OutOfMemoryError(fmt::format("{}: needs an estimated {} of host memory ({}), {} available", what,
                                     format_bytes(e.bytes), e.basis, format_bytes(avail)));
}

std::string format_bytes(int64_t bytes) {
  const double b = double(bytes);
  for (auto [unit, scale] : {std::pair{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"kB", 1e3}})
    if (b >= scale) return fmt::format("{:.1f} {}", b / scale, unit);
  return fmt::format("{} bytes", bytes);
}

int64_t parse_bytes(const std::string& s, const std::string& what) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (...) {
    input_error("{} '{}' is not a size (e.g. 2GiB, 512MiB, 1e9)", what, s);
  }
  const std::string unit = s.substr(end);
  double mul = 1;
  if (unit == "" || unit == "B") mul = 1;
  else if (unit == "KiB") mul = 1024.0;
  else if (unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else input_error("{} '{}': unknown unit '{}' (expected B, KiB, MiB, GiB, KB, MB, GB)", what, s, unit);
  if (!(v > 0)) input_error("{} '{}' must be positive", what, s);
  return int64_t(v * mul);
}

}  // namespace hg
