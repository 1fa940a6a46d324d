#include "engine/core/cpu_features.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "engine/core/error.h"

namespace hg {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable: return "portable";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
  }
  return "?";
}

bool parse_cpu_isa(std::string_view s, CpuIsa* out) {
  for (CpuIsa i : {CpuIsa::kPortable, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16})
    if (s == cpu_isa_name(i)) {
      *out = i;
      return true;
    }
  return false;
}

bool cpu_supports(CpuIsa isa) {
#if defined(__x86_64__)
  // libgcc's cpuid probe also checks XCR0, so an OS that does not save the 512-bit state reports
  // no AVX-512.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
  switch (isa) {
    case CpuIsa::kPortable: return true;
    case CpuIsa::kAvx512: return avx512;
    case CpuIsa::kAvx512Bf16: return avx512 && __builtin_cpu_supports("avx512bf16");
  }
  return false;
#else
  return isa == CpuIsa::kPortable;
#endif
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa i : {CpuIsa::kPortable, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16})
    if (cpu_supports(i)) out.push_back(i);
  return out;
}

CpuIsa best_cpu_isa() { return supported_cpu_isas().back(); }

namespace {
CpuIsa from_environment() {
  const char* env = std::getenv("HG_CPU_ISA");
  if (!env || !*env) return best_cpu_isa();
  CpuIsa isa;
  if (!parse_cpu_isa(env, &isa))
    input_error("HG_CPU_ISA={}: expected portable, avx512 or avx512_bf16", env);
  if (!cpu_supports(isa)) input_error("HG_CPU_ISA={}: this CPU does not support it (best: {})", env, cpu_isa_name(best_cpu_isa()));
  return isa;
}
// -1: not chosen yet.
std::atomic<int> g_active{-1};
}  // namespace

CpuIsa active_cpu_isa() {
  int v = g_active.load(std::memory_order_acquire);
  if (v < 0) {
    v = int(from_environment());
    g_active.store(v, std::memory_order_release);
  }
  return CpuIsa(v);
}

CpuIsa set_active_cpu_isa(CpuIsa isa) {
  if (!cpu_supports(isa)) input_error("CPU kernels: this CPU does not support {}", cpu_isa_name(isa));
  const CpuIsa prev = active_cpu_isa();
  g_active.store(int(isa), std::memory_order_release);
  return prev;
}

std::string_view cpu_tuning_name(CpuTuning t) { return t == CpuTuning::kAmd ? "AMD" : "Intel"; }

namespace detail {
std::atomic<int> g_cpu_tuning{-1};

int detect_cpu_tuning() {
#if defined(__x86_64__)
  const int v = __builtin_cpu_is("amd") ? int(CpuTuning::kAmd) : int(CpuTuning::kIntel);
#else
  const int v = int(CpuTuning::kIntel);
#endif
  int expected = -1;
  g_cpu_tuning.compare_exchange_strong(expected, v, std::memory_order_relaxed);  // a set tuning wins
  return g_cpu_tuning.load(std::memory_order_relaxed);
}
}  // namespace detail

CpuTuning set_cpu_tuning(CpuTuning t) {
  const CpuTuning prev = cpu_tuning();
  detail::g_cpu_tuning.store(int(t), std::memory_order_relaxed);
  return prev;
}

int64_t last_level_cache_bytes() {
  static const int64_t bytes = [] {
    for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE})
      if (const long v = sysconf(name); v > 0) return int64_t(v);
    for (int index = 4; index >= 2; --index) {  // sysfs "491520K"
      std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
      int64_t v = 0;
      char unit = 0;
      if (f >> v && v > 0) {
        f >> unit;
        return v << (unit == 'K' ? 10 : unit == 'M' ? 20 : 0);
      }
    }
    return int64_t(32) << 20;
  }();
  return bytes;
}

}  // namespace hg
