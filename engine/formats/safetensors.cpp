// safetensors parsing.
#include "engine/formats/safetensors.h"

#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace hg {

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(std::make_shared<const MappedFile>(path)) {
  ByteReader r(*file_);
  const uint64_t n = r.read<uint64_t>("header length");
  if (n > 100u * 1024 * 1024) input_error("{}: header length {} is implausible", path, n);
  const std::string header = r.read_bytes(n, "JSON header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    input_error("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) input_error("{}: header must be a JSON object", path);
  const uint64_t base = 8 + n;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") continue;
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      input_error("{}: tensor '{}' lacks dtype/shape/data_offsets", path, name);
    Entry e{};
    const std::string dt = v["dtype"].is_string() ? v["dtype"].get<std::string>() : "";
    if (dt == "F32") e.dtype = DType::kF32;
    else if (dt == "F16") e.dtype = DType::kF16;
    else if (dt == "BF16") e.dtype = DType::kBF16;
    else input_error("{}: tensor '{}' has dtype '{}' (supported: F32, F16, BF16)", path, name, dt);
    if (!v["shape"].is_array()) input_error("{}: tensor '{}' shape must be a list of integers", path, name);
    uint64_t numel = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) input_error("{}: tensor '{}' has a bad shape", path, name);
      e.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(numel, uint64_t(d.get<int64_t>()), &numel))
        input_error("{}: tensor '{}' shape {} overflows a 64-bit element count", path, name, v["shape"].dump());
    }
    uint64_t need = 0;
    if (numel > (uint64_t(1) << 62) || __builtin_mul_overflow(numel, uint64_t(dtype_size(e.dtype)), &need))
      input_error("{}: tensor '{}' shape {} is too large", path, name, v["shape"].dump());
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      input_error("{}: tensor '{}' data_offsets must be [begin, end]", path, name);
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (en < b || en - b != need)
      input_error("{}: tensor '{}' spans {} bytes but shape {} of {} needs {}", path, name, en - b,
                  shape_str(e.shape), dt, need);
    spans.push_back({b, en, name});
    e.offset = base + b;
    e.bytes = en - b;
    file_->require(e.offset, e.bytes, ("data of tensor " + name).c_str());
    entries_[name] = std::move(e);
  }
  // As the format's own reader requires: the tensors tile the data buffer, in some order, from its
  // first byte to the file's end, with no overlap and no gap.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  uint64_t at = 0;
  for (const Span& sp : spans) {
    if (sp.begin < at) input_error("{}: tensor '{}' overlaps the tensor before it (data_offsets from {})", path, sp.name, sp.begin);
    if (sp.begin > at) input_error("{}: a gap of {} bytes before tensor '{}' (data_offsets from {})", path, sp.begin - at, sp.name, sp.begin);
    at = sp.end;
  }
  if (base + at != file_->size())
    input_error("{}: the tensors cover {} bytes of data but the file holds {} after the header", path, at,
                file_->size() - base);
}

const SafetensorsFile::Entry* SafetensorsFile::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

Weight SafetensorsFile::load(const Entry& e, DType to, WeightLoad how) const {
  return load_tensor(file_, e.offset, e.dtype, to, e.shape, how);
}

}  // namespace hg
