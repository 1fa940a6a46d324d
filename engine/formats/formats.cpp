// Format registry and model-spec dispatch.
#include "engine/formats/formats.h"

#include <sys/mman.h>

#include <chrono>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg {

namespace {
// Whether a path names something; false for a name the OS refuses (too long, not a path).
bool path_exists(const std::string& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}
}  // namespace


ModelSpec parse_model_spec(const std::string& spec) {
  ModelSpec s;
  std::string rest = spec;
  const size_t colon = rest.find(':');
  if (colon != std::string::npos && colon > 1) {  // "gguf:path" (but not "C:\…")
    const std::string head = rest.substr(0, colon);
    if (head.find('/') == std::string::npos && head.find('.') == std::string::npos) {
      s.format = head;
      rest = rest.substr(colon + 1);
    }
  }
  const size_t q = rest.find('?');
  s.path = rest.substr(0, q);
  if (q != std::string::npos) {
    std::string opts = rest.substr(q + 1);
    size_t pos = 0;
    while (pos <= opts.size()) {
      const size_t amp = opts.find('&', pos);
      const std::string kv = opts.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
      if (!kv.empty()) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) input_error("model spec '{}': option '{}' must be key=value", spec, kv);
        s.options[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      if (amp == std::string::npos) break;
      pos = amp + 1;
    }
  }
  return s;
}

WeightLoad weight_load_option(const ModelSpec& spec) {
  const auto it = spec.options.find("load");
  if (it == spec.options.end()) return WeightLoad::kCopy;
  if (it->second == "map") return WeightLoad::kMap;
  if (it->second == "copy") return WeightLoad::kCopy;
  input_error("model '{}': option load={}: expected map or copy", spec.path, it->second);
}

Weight load_tensor(const std::shared_ptr<const MappedFile>& f, uint64_t off, DType from, DType to,
                   std::vector<int64_t> shape, WeightLoad how) {
  const uint8_t* src = f->data() + off;
  if (how == WeightLoad::kMap && from == to && reinterpret_cast<uintptr_t>(src) % dtype_size(to) == 0)
    return view_weight(to, std::move(shape), src, f);
  return convert_weight(from, src, to, std::move(shape), [&](size_t o, size_t n) { f->release(off + o, n); });
}

void check_spec_options(const ModelSpec& s, const std::vector<std::string>& allowed) {
  for (auto& [k, v] : s.options) {
    bool ok = false;
    for (auto& a : allowed) ok |= a == k;
    if (!ok) {
      std::string list;
      for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      input_error("model spec {}: unknown option '{}' (expected one of: {})", s.path, k, list.empty() ? "none" : list);
    }
  }
}

const ModelFormat* FormatRegistry::by_name(std::string_view name) const {
  for (auto& f : formats_)
    if (f.name == name) return &f;
  return nullptr;
}

const FormatRegistry& model_formats() {
  static const FormatRegistry reg = [] {
    FormatRegistry r;
    r.add(gguf_format());
    r.add(hf_format());
    r.add(llama2c_format());
    r.add(synthetic_format());
    return r;
  }();
  return reg;
}

DType default_weight_dtype(DType src, const LoadOptions& opts) {
  if (opts.weight_dtype) return *opts.weight_dtype;
  return src;  // F16 and BF16 files stay half precision (read at half the bytes); F32 stays F32
}

void check_model_spec(const std::string& spec_str) {
  const ModelSpec spec = parse_model_spec(spec_str);
  const FormatRegistry& reg = model_formats();
  if (spec.format == "synthetic") {
    for (auto& p : synthetic_presets())
      if (p.name == spec.path) return;
    std::string names;
    for (auto& p : synthetic_presets()) names += (names.empty() ? "" : ", ") + p.name;
    input_error("model '{}': no synthetic preset '{}' (expected one of: {})", spec_str, spec.path, names);
  }
  if (!spec.format.empty()) {
    if (!reg.by_name(spec.format)) input_error("model '{}': unknown format '{}'", spec_str, spec.format);
    if (!path_exists(spec.path)) input_error("model '{}': {}: no such file or directory", spec_str, spec.path);
    return;
  }
  if (!path_exists(spec.path)) input_error("model '{}': no such file or directory", spec_str);
  for (auto& f : reg.all())
    if (f.probe && f.probe(spec.path)) return;
  input_error("model '{}': not a recognised model (expected a GGUF file, a Hugging Face directory with config.json, "
              "or a llama2.c .bin)", spec_str);
}

Model load_model(const std::string& spec_str, const LoadOptions& opts) {
  ModelSpec spec = parse_model_spec(spec_str);
  const FormatRegistry& reg = model_formats();
  const ModelFormat* fmt = nullptr;
  if (!spec.format.empty()) {
    fmt = reg.by_name(spec.format);
    if (!fmt) {
      std::string names;
      for (auto& f : reg.all()) names += (names.empty() ? "" : ", ") + f.name;
      input_error("model '{}': unknown format '{}' (expected one of: {})", spec_str, spec.format, names);
    }
  } else {
    if (!path_exists(spec.path)) input_error("{}: no such file or directory", spec.path);
    for (auto& f : reg.all())
      if (f.probe && f.probe(spec.path)) {
        fmt = &f;
        break;
      }
    if (!fmt)
      input_error("{}: not a recognised model (expected a GGUF file, a Hugging Face directory with config.json, "
                  "or a llama2.c .bin)", spec.path);
  }
  const auto t0 = std::chrono::steady_clock::now();
  Model m = fmt->load(spec, opts);
  if (m.tokenizer) check_tokenizer(*m.tokenizer, spec.path);
  // Mapped weights are locked in memory (and faulted in): a decode step then never waits for the
  // disk, and a KV cache that fills the machine cannot push them out.
  m.for_each_weight([&](const Weight& w) {
    if (!w.mapped()) return;
    m.mapped_weight_bytes += int64_t(w.bytes());
    if (::mlock(w.buf.data(), w.bytes()) != 0) m.unlocked_weight_bytes += int64_t(w.bytes());
  });
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.format = fmt->name;
  if (m.source.empty()) m.source = spec_str;
  validate_model(m, m.source);
  return m;
}

}  // namespace hg
