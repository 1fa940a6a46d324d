// The instruction sets the CPU kernels are built for, chosen at run time by what this CPU has
// (cpuid, including the OS's support for the 512-bit registers), not by the build machine.
#pragma once
#include <atomic>
#include <cstdint>
#include <string_view>
#include <vector>

namespace hg {

// Ordered: each level includes the ones before it.
enum class CpuIsa {
  kPortable,    // plain C++ (the build's baseline flags, no AVX-512 intrinsics)
  kAvx512,      // AVX-512 F/BW/DQ/VL with FMA and F16C (x86-64-v4)
  kAvx512Bf16,  // kAvx512 plus AVX512_BF16 (`vdpbf16ps`, `vcvtne2ps2bf16`)
};

std::string_view cpu_isa_name(CpuIsa isa);
// Parses "portable", "avx512", "avx512_bf16"; false when unknown.
bool parse_cpu_isa(std::string_view s, CpuIsa* out);
// Whether this CPU (and its OS) can run kernels built for `isa`.
bool cpu_supports(CpuIsa isa);
// The levels this CPU can run, lowest first (always includes kPortable).
std::vector<CpuIsa> supported_cpu_isas();
// The best level this CPU supports.
CpuIsa best_cpu_isa();

// The level the CPU kernels use: HG_CPU_ISA from the environment when set (an InputError if it
// names an unknown level or one this CPU lacks), else best_cpu_isa(). Read once, at the first call.
CpuIsa active_cpu_isa();
// Switches the CPU kernels to `isa` (an InputError if this CPU lacks it); returns the previous one.
// For tests and benchmarks that compare the levels; not safe while kernels run on other threads.
CpuIsa set_active_cpu_isa(CpuIsa isa);

// Which vendor's variants the CPU kernels use where the vendors' cores differ in what was measured
// (docs/performance.md, "Tuning choices"): AMD's cores split 512-bit work into halves or run it on
// narrower units. Detected from the CPU (anything not AMD is tuned as Intel); tests set both.
enum class CpuTuning { kIntel, kAmd };
std::string_view cpu_tuning_name(CpuTuning t);
namespace detail {
extern std::atomic<int> g_cpu_tuning;  // -1 until detected
int detect_cpu_tuning();
}  // namespace detail
// Inline: the kernels ask in their inner loops.
inline CpuTuning cpu_tuning() {
  const int v = detail::g_cpu_tuning.load(std::memory_order_relaxed);
  return CpuTuning(v >= 0 ? v : detail::detect_cpu_tuning());
}
// Returns the previous tuning; not safe while kernels run on other threads.
CpuTuning set_cpu_tuning(CpuTuning t);

// The last-level cache's size in bytes (sysconf, then sysfs; 32 MiB when neither says): what a
// buffer must well exceed for a pass over it to read from memory.
int64_t last_level_cache_bytes();

}  // namespace hg
