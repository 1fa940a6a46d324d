// Platform profiles and the measured / modeled clocks.
#include "engine/runtime/clock.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/core/atomic_file.h"
#include "engine/core/error.h"
#include "engine/core/yaml_util.h"

namespace hg {

namespace {
// Scales a profile's rates: the GPU's memory, its FLOPs (attention's too) and the CPU side's
// memory tiers (DRAM and far) by their factors.
void scale_rates(PlatformProfile& p, double gpu_mem, double gpu_flops, double cpu_mem) {
  p.gpu_mem_gbs *= gpu_mem;
  p.gpu_flops *= gpu_flops;
  p.gpu_attn_flops *= gpu_flops;
  for (auto& [d, r] : p.gpu_attn_flops_by_dim) r *= gpu_flops;
  p.dram_gbs *= cpu_mem;
  p.far_gbs *= cpu_mem;
}

// "name?cpu=F&gpu=F": a profile's variant with its CPU-side (DRAM, far tier, CPU FLOPs, CPU attention)
// or GPU-side (HBM, FLOPs) rates scaled, for sweeps over the CPU-to-GPU rate ratio.
struct Variant {
  std::string base;
  double cpu = 1, gpu = 1;
};
Variant parse_variant(const std::string& spec) {
  Variant v;
  const size_t q = spec.find('?');
  v.base = spec.substr(0, q);
  if (q == std::string::npos) return v;
  std::string rest = spec.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string kv = rest.substr(0, amp);
    rest = amp == std::string::npos ? "" : rest.substr(amp + 1);
    const size_t eq = kv.find('=');
    const std::string k = kv.substr(0, eq), val = eq == std::string::npos ? "" : kv.substr(eq + 1);
    double f = 0;
    auto [ptr, ec] = std::from_chars(val.data(), val.data() + val.size(), f);
    if ((k != "cpu" && k != "gpu") || ec != std::errc() || ptr != val.data() + val.size() ||
        !(f > 0 && f <= 1000))
      input_error(
          "platform '{}': '{}' is no variant (expected cpu=F or gpu=F, F a positive factor, joined by &)",
          spec, kv);
    (k == "cpu" ? v.cpu : v.gpu) = f;
  }
  return v;
}
}  // namespace

std::string platform_file(const std::string& name_or_path, const std::string& platforms_dir) {
  std::error_code ec;  // a name the OS refuses (too long) is no file
  if (std::filesystem::exists(name_or_path, ec)) return name_or_path;
  const std::string base = name_or_path.substr(0, name_or_path.find('?'));
  return std::filesystem::exists(base, ec) ? base : platforms_dir + "/" + base + ".yaml";
}

PlatformProfile load_platform(const std::string& name_or_path, const std::string& platforms_dir) {
  std::error_code ec0;
  if (name_or_path.find('?') != std::string::npos && !std::filesystem::exists(name_or_path, ec0)) {
    const Variant v = parse_variant(name_or_path);
    PlatformProfile p = load_platform(v.base, platforms_dir);
    p.name = name_or_path;
    scale_rates(p, v.gpu, v.gpu, v.cpu);
    p.gpu_elem_eps *= v.gpu;
    p.cpu_flops *= v.cpu;
    p.cpu_attn_gbs *= v.cpu;
    if (v.cpu != 1 || v.gpu != 1)
      p.source += fmt::format(" (a variant: CPU rates ×{}, GPU rates ×{})", v.cpu, v.gpu);
    return p;
  }
  const std::string file = platform_file(name_or_path, platforms_dir);
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    input_error("platform '{}': no such profile (looked for {} and {})", name_or_path, name_or_path, file);
  const YAML::Node y = yaml_load_file(file);
  check_keys(y, {"name", "source", "gpu", "cpu", "far", "link", "fixed", "achieved"}, file, "");
  PlatformProfile p;
  p.name = yaml_string(y, "name", std::filesystem::path(file).stem().string(), file, "");
  p.source = yaml_string(y, "source", "", file, "");
  if (y["gpu"]) {
    check_keys(y["gpu"], {"flops_tflops", "attn_tflops", "attn_tflops_by_head_dim", "mem_gbs", "mem_gib", "elem_gops"},
               file, "gpu");
    p.gpu_flops = yaml_number(y["gpu"], "flops_tflops", 0, true, file, "gpu") * 1e12;
    p.gpu_attn_flops = yaml_number(y["gpu"], "attn_tflops", 0, false, file, "gpu") * 1e12;
    p.gpu_mem_gbs = yaml_number(y["gpu"], "mem_gbs", 0, true, file, "gpu");
    p.gpu_mem_gib = yaml_number(y["gpu"], "mem_gib", 0, false, file, "gpu");
    p.gpu_elem_eps = yaml_number(y["gpu"], "elem_gops", 0, false, file, "gpu") * 1e9;
    if (const YAML::Node by = y["gpu"]["attn_tflops_by_head_dim"]) {
      const std::string where = "gpu.attn_tflops_by_head_dim";
      if (!by.IsMap()) input_error("{}:{}: {}: expected a map of head dimension to TFLOP/s", file, by.Mark().line + 1, where);
      for (const auto& kv : by) {
        int d = 0;
        double r = 0;
        try {
          d = kv.first.as<int>();
          r = kv.second.as<double>();
        } catch (const YAML::Exception&) {
          input_error("{}:{}: {}: expected head dimension: TFLOP/s (integer: number)", file, kv.first.Mark().line + 1, where);
        }
        if (d <= 0 || d > 4096 || !(r > 0))
          input_error("{}:{}: {}: head dimension must be in 1..4096 and its rate positive", file, kv.first.Mark().line + 1,
                      where);
        p.gpu_attn_flops_by_dim[d] = r * 1e12;
      }
    }
  }
  if (!y["cpu"]) input_error("{}: missing key 'cpu'", file);
  check_keys(y["cpu"], {"flops_gflops", "dram_gbs", "dram_gib", "dram_row_ns", "attn_gbs"}, file, "cpu");
  p.cpu_flops = yaml_number(y["cpu"], "flops_gflops", 0, true, file, "cpu") * 1e9;
  p.dram_gbs = yaml_number(y["cpu"], "dram_gbs", 0, true, file, "cpu");
  p.dram_gib = yaml_number(y["cpu"], "dram_gib", 0, false, file, "cpu");
  p.dram_row_ns = yaml_number(y["cpu"], "dram_row_ns", 0, false, file, "cpu");
  p.cpu_attn_gbs = yaml_number(y["cpu"], "attn_gbs", 0, false, file, "cpu");
  p.far_gbs = p.dram_gbs;
  p.far_row_ns = p.dram_row_ns;
  if (y["far"]) {
    check_keys(y["far"], {"gbs", "latency_ns", "gib", "row_ns"}, file, "far");
    p.far_gbs = yaml_number(y["far"], "gbs", 0, true, file, "far");
    p.far_latency_ns = yaml_number(y["far"], "latency_ns", 0, false, file, "far");
    p.far_gib = yaml_number(y["far"], "gib", 0, false, file, "far");
    p.far_row_ns = yaml_number(y["far"], "row_ns", 0, false, file, "far");
  }
  if (y["link"]) {
    check_keys(y["link"], {"h2d_gbs", "d2h_gbs"}, file, "link");
    p.h2d_gbs = yaml_number(y["link"], "h2d_gbs", 0, true, file, "link");
    p.d2h_gbs = yaml_number(y["link"], "d2h_gbs", p.h2d_gbs, false, file, "link");
  }
  if (y["fixed"]) {
    check_keys(y["fixed"], {"stage_us", "launch_us", "copy_us"}, file, "fixed");
    p.stage_us = yaml_number(y["fixed"], "stage_us", 0, false, file, "fixed");
    p.launch_us = yaml_number(y["fixed"], "launch_us", 0, false, file, "fixed");
    p.copy_us = yaml_number(y["fixed"], "copy_us", 0, false, file, "fixed");
  }
  if (const YAML::Node a = y["achieved"]) {
    check_keys(a,
               {"source", "gpu_mem", "gpu_flops", "cpu_dram", "cpu_attn", "stage_us", "launch_us", "copy_us"},
               file, "achieved");
    auto& f = p.achieved;
    f.source = yaml_string(a, "source", "", file, "achieved");
    for (auto [v, key] : {std::pair{&f.gpu_mem, "gpu_mem"},
                          {&f.gpu_flops, "gpu_flops"},
                          {&f.cpu_dram, "cpu_dram"},
                          {&f.cpu_attn, "cpu_attn"}}) {
      *v = yaml_number(a, key, 1, false, file, "achieved");
      if (!(*v > 0 && *v <= 1))
        input_error("{}:{}: achieved.{} must be an achieved ÷ peak factor in (0, 1], got {}", file,
                    a[key] ? a[key].Mark().line + 1 : a.Mark().line + 1, key, *v);
    }
    for (auto [v, key] :
         {std::pair{&f.stage_us, "stage_us"}, {&f.launch_us, "launch_us"}, {&f.copy_us, "copy_us"}}) {
      *v = yaml_number(a, key, -1, false, file, "achieved");
      if (a[key] && !(*v >= 0))
        input_error("{}:{}: achieved.{} must be zero or positive microseconds", file, a[key].Mark().line + 1,
                    key);
    }
  }
  for (auto [v, what] : {std::pair{p.cpu_flops, "cpu.flops_gflops"}, {p.dram_gbs, "cpu.dram_gbs"}, {p.far_gbs, "far.gbs"}})
    if (!(v > 0)) input_error("{}: {} must be positive", file, what);
  for (auto [v, what] : {std::pair{p.dram_row_ns, "cpu.dram_row_ns"}, {p.far_row_ns, "far.row_ns"},
                         {p.cpu_attn_gbs, "cpu.attn_gbs"},
                         {p.gpu_elem_eps, "gpu.elem_gops"},
                         {p.stage_us, "fixed.stage_us"}, {p.launch_us, "fixed.launch_us"}, {p.copy_us, "fixed.copy_us"}})
    if (!(v >= 0)) input_error("{}: {} must be zero or positive", file, what);
  return p;
}

void save_platform(const PlatformProfile& p, const std::string& path, const std::string& comment) {
  std::ostringstream out;
  out << "# " << comment << "\n";
  out << "name: " << p.name << "\nsource: \"" << p.source << "\"\n";
  if (p.gpu_flops > 0)
    out << "gpu:\n  flops_tflops: " << p.gpu_flops / 1e12 << "\n  attn_tflops: " << p.gpu_attn_flops / 1e12
        << "\n  mem_gbs: " << p.gpu_mem_gbs
        << "\n  mem_gib: " << p.gpu_mem_gib << "\n";
  if (p.gpu_flops > 0 && !p.gpu_attn_flops_by_dim.empty()) {
    out << "  attn_tflops_by_head_dim:\n";
    for (auto [d, r] : p.gpu_attn_flops_by_dim) out << "    " << d << ": " << r / 1e12 << "\n";
  }
  if (p.gpu_flops > 0 && p.gpu_elem_eps > 0) out << "  elem_gops: " << p.gpu_elem_eps / 1e9 << "\n";
  out << "cpu:\n  flops_gflops: " << p.cpu_flops / 1e9 << "\n  dram_gbs: " << p.dram_gbs << "\n  dram_gib: " << p.dram_gib
      << "\n  dram_row_ns: " << p.dram_row_ns << "\n";
  if (p.cpu_attn_gbs > 0) out << "  attn_gbs: " << p.cpu_attn_gbs << "\n";
  out << "far:\n  gbs: " << p.far_gbs << "\n  latency_ns: " << p.far_latency_ns << "\n  gib: " << p.far_gib
      << "\n  row_ns: " << p.far_row_ns << "\n";
  if (p.h2d_gbs > 0) out << "link:\n  h2d_gbs: " << p.h2d_gbs << "\n  d2h_gbs: " << p.d2h_gbs << "\n";
  out << "fixed:\n  stage_us: " << p.stage_us << "\n  launch_us: " << p.launch_us << "\n  copy_us: " << p.copy_us << "\n";
  const auto& a = p.achieved;
  if (a.gpu_mem != 1 || a.gpu_flops != 1 || a.cpu_dram != 1 || a.cpu_attn != 1 || a.stage_us >= 0 ||
      a.launch_us >= 0 || a.copy_us >= 0) {
    out << "achieved:\n  source: \"" << a.source << "\"\n  gpu_mem: " << a.gpu_mem
        << "\n  gpu_flops: " << a.gpu_flops << "\n  cpu_dram: " << a.cpu_dram
        << "\n  cpu_attn: " << a.cpu_attn << "\n";
    for (auto [v, key] :
         {std::pair{a.stage_us, "stage_us"}, {a.launch_us, "launch_us"}, {a.copy_us, "copy_us"}})
      if (v >= 0) out << "  " << key << ": " << v << "\n";
  }
  write_file_atomic(path, out.str());
}

PlatformProfile peak_profile(const PlatformProfile& p) {
  PlatformProfile q = p;
  q.stage_us = q.launch_us = q.copy_us = 0;
  return q;
}

PlatformProfile achieved_profile(const PlatformProfile& p) {
  PlatformProfile q = p;
  const auto& a = p.achieved;
  scale_rates(q, a.gpu_mem, a.gpu_flops, a.cpu_dram);
  // The CPU's attention reads KV at its own achieved share of the DRAM peak (a calibrated
  // profile measured that rate already: cpu.attn_gbs).
  if (a.cpu_attn != 1) q.cpu_attn_gbs = (p.cpu_attn_gbs > 0 ? p.cpu_attn_gbs : p.dram_gbs) * a.cpu_attn;
  if (a.stage_us >= 0) q.stage_us = a.stage_us;
  if (a.launch_us >= 0) q.launch_us = a.launch_us;
  if (a.copy_us >= 0) q.copy_us = a.copy_us;
  return q;
}

namespace {
double tier_gbs(Tier t, const PlatformProfile& p) {
  switch (t) {
    case Tier::kGpu: return p.gpu_mem_gbs;
    case Tier::kDram: return p.dram_gbs;
    case Tier::kFar: return p.far_gbs;
  }
  return 0;
}
double secs(double bytes, double gbs) { return bytes <= 0 ? 0.0 : (gbs > 0 ? bytes / (gbs * 1e9) : INFINITY); }
// Seconds of the row costs of the gathered rows in w (host tiers; GPU rows are not charged).
double row_secs(const StageWork& w, const PlatformProfile& p) {
  return 1e-9 * (double(w.rows[size_t(Tier::kDram)]) * p.dram_row_ns +
                 double(w.rows[size_t(Tier::kFar)]) * p.far_row_ns);
}
}  // namespace

double attention_rate(const PlatformProfile& p, int d) {
  const double base = p.gpu_attn_flops > 0 ? p.gpu_attn_flops : p.gpu_flops;
  if (d <= 0 || p.gpu_attn_flops_by_dim.empty()) return base;
  double best = base;
  int gap = INT32_MAX;
  for (auto [dim, r] : p.gpu_attn_flops_by_dim)
    if (std::abs(dim - d) < gap) gap = std::abs(dim - d), best = r;
  return best;
}

namespace {
// A stage's work at the profile's rates (roofline), without fixed costs.
double work_seconds(const StageRecord& r, const PlatformProfile& p) {
  const auto& w = r.work;
  const double lat = p.far_latency_ns * 1e-9;
  switch (r.kind) {
    case StageKind::kAccelCompute: {
      const double attn_rate = attention_rate(p, w.attn_head_dim);
      const double c = w.flops <= 0 ? 0.0
                       : p.gpu_flops > 0 ? (w.flops - w.attn_flops) / p.gpu_flops + w.attn_flops / attn_rate
                                         : INFINITY;
      // Policy code runs after the kernels it reads (their taps), on the same thread.
      const double e = w.elems > 0 && p.gpu_elem_eps > 0 ? w.elems / p.gpu_elem_eps : 0.0;
      return std::max(c, secs(double(w.bytes[size_t(Tier::kGpu)]), p.gpu_mem_gbs)) + e;
    }
    case StageKind::kCpuCompute: {
      const double c = w.flops / p.cpu_flops;
      // The CPU kernels' achieved rate caps each tier's read rate (converting 16-bit KV, FMAs).
      const auto rate = [&](double gbs) { return p.cpu_attn_gbs > 0 ? std::min(gbs, p.cpu_attn_gbs) : gbs; };
      const double m = secs(double(w.bytes[size_t(Tier::kDram)]), rate(p.dram_gbs)) +
                       secs(double(w.bytes[size_t(Tier::kFar)]), rate(p.far_gbs)) + row_secs(w, p);
      return std::max(c, m) + (w.bytes[size_t(Tier::kFar)] > 0 ? lat : 0.0);
    }
    case StageKind::kTransfer: {
      double bw;
      if (w.dst == Tier::kGpu && w.src == Tier::kGpu) bw = p.gpu_mem_gbs / 2;  // read + write HBM
      else if (w.dst == Tier::kGpu) bw = std::min(p.h2d_gbs, tier_gbs(w.src, p));
      else if (w.src == Tier::kGpu) bw = std::min(p.d2h_gbs, tier_gbs(w.dst, p));
      else bw = std::min(tier_gbs(w.src, p), tier_gbs(w.dst, p));
      const bool far = w.src == Tier::kFar || w.dst == Tier::kFar;
      return secs(double(w.transfer_bytes), bw) + row_secs(w, p) + (far && w.transfer_bytes > 0 ? lat : 0.0);
    }
  }
  return 0;
}
}  // namespace

double modeled_stage_seconds(const StageRecord& r, const PlatformProfile& p) {
  const auto& w = r.work;
  double fixed = p.stage_us;
  fixed += p.launch_us * double(w.launches);
  fixed += p.copy_us * double(r.kind == StageKind::kTransfer ? std::max<int64_t>(1, w.copy_calls) : w.copy_calls);
  return work_seconds(r, p) + 1e-6 * fixed;
}

namespace {
StepTiming summarize(const std::vector<StageRecord>& recs) {
  StepTiming t;
  if (recs.empty()) return t;
  double lo = INFINITY, hi = -INFINITY;
  // Durations summed in ascending order, so that the sums do not depend on the records' order (the
  // threads' interleaving) down to the last digit.
  std::array<std::vector<double>, 3> by_kind;
  for (auto& r : recs) {
    lo = std::min(lo, r.start_s);
    hi = std::max(hi, r.end_s);
    const size_t k = r.kind == StageKind::kAccelCompute ? 0 : r.kind == StageKind::kCpuCompute ? 1 : 2;
    by_kind[k].push_back(r.end_s - r.start_s);
  }
  std::vector<double> all;
  for (auto& v : by_kind) all.insert(all.end(), v.begin(), v.end());
  const auto sum_sorted = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    double s = 0;
    for (double d : v) s += d;
    return s;
  };
  t.accel_s = sum_sorted(by_kind[0]), t.cpu_s = sum_sorted(by_kind[1]), t.transfer_s = sum_sorted(by_kind[2]);
  t.sum_stages_s = sum_sorted(all);
  t.critical_path_s = hi - lo;
  t.overlap_cpu_accel_s = overlap_seconds(recs, StageKind::kCpuCompute, StageKind::kAccelCompute);
  return t;
}
}  // namespace

StepTiming measured_timing(const std::vector<StageRecord>& recs) { return summarize(recs); }

StepTiming modeled_timing(const std::vector<StageRecord>& recs, const PlatformProfile& p) {
  std::vector<StageRecord> r = recs;
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  std::map<int, double> queue_free;
  std::map<int64_t, double> end_of;
  struct Span {
    double measured_start, measured_end, modeled_start, modeled_end, progress0, progress1;
  };
  std::map<int64_t, Span> span;  // for stages submitted from inside another (StageRecord::within)
  for (auto& s : r) {
    double start = queue_free.count(s.queue) ? queue_free[s.queue] : 0.0;
    for (int64_t d : s.deps)
      if (end_of.count(d)) start = std::max(start, end_of[d]);
    if (auto it = span.find(s.within); it != span.end()) {
      // Submitted part-way through an accelerator segment: no earlier than the same share of it.
      // Share by reported progress when the segment has it, else by measured time. A segment whose
      // progress did not move (it only waited and submitted) places it at its start, not by the
      // wall clock: its modeled length is its fixed costs alone.
      const Span& w = it->second;
      const bool by_progress = s.submit_progress >= 0 && w.progress0 >= 0 && w.progress1 >= w.progress0;
      const double len = by_progress ? w.progress1 - w.progress0 : w.measured_end - w.measured_start;
      const double at = by_progress ? s.submit_progress - w.progress0 : s.submit_s - w.measured_start;
      const double f = len > 0 ? std::clamp(at / len, 0.0, 1.0) : 0.0;
      start = std::max(start, w.modeled_start + f * (w.modeled_end - w.modeled_start));
    }
    const double m0 = s.start_s, m1 = s.end_s;
    s.start_s = start;
    s.end_s = start + modeled_stage_seconds(s, p);
    queue_free[s.queue] = s.end_s;
    end_of[s.id] = s.end_s;
    if (s.kind == StageKind::kAccelCompute)
      span[s.id] = Span{m0, m1, s.start_s, s.end_s, s.progress0, s.progress1};
  }
  return summarize(r);
}

}  // namespace hg
