// GGUF parsing and tensor dequantization. Layout (gguf spec): magic "GGUF", u32 version, u64
// tensor count, u64 kv count (v1 used u32 and is rejected), kvs, tensor infos, padding to
// general.alignment (default 32), tensor data.
#include "engine/formats/gguf.h"

#include <cmath>

#include "engine/core/error.h"

namespace hg {
namespace {
constexpr uint64_t kMaxString = 1ull << 30;
constexpr uint64_t kMaxArray = 1ull << 31;
constexpr uint32_t kMaxDims = 4;
}  // namespace

GgufFile::Value GgufFile::read_value(ByteReader& r, Type t, int depth) const {
  Value v;
  v.type = t;
  switch (t) {
    case kU8: v.u = r.read<uint8_t>("u8 value"); v.i = int64_t(v.u); v.f = double(v.u); break;
    case kI8: v.i = r.read<int8_t>("i8 value"); v.u = uint64_t(v.i); v.f = double(v.i); break;
    case kU16: v.u = r.read<uint16_t>("u16 value"); v.i = int64_t(v.u); v.f = double(v.u); break;
    case kI16: v.i = r.read<int16_t>("i16 value"); v.u = uint64_t(v.i); v.f = double(v.i); break;
    case kU32: v.u = r.read<uint32_t>("u32 value"); v.i = int64_t(v.u); v.f = double(v.u); break;
    case kI32: v.i = r.read<int32_t>("i32 value"); v.u = uint64_t(v.i); v.f = double(v.i); break;
    case kU64: v.u = r.read<uint64_t>("u64 value"); v.i = int64_t(v.u); v.f = double(v.u); break;
    case kI64: v.i = r.read<int64_t>("i64 value"); v.u = uint64_t(v.i); v.f = double(v.i); break;
    case kF32: v.f = r.read<float>("f32 value"); break;
    case kF64: v.f = r.read<double>("f64 value"); break;
    case kBool: v.u = r.read<uint8_t>("bool value") != 0; v.i = int64_t(v.u); break;
    case kString: {
      const uint64_t n = r.read<uint64_t>("string length");
      if (n > kMaxString) input_error("{}: string length {} at offset {} is implausible", path(), n, r.offset());
      v.s = r.read_bytes(n, "string bytes");
      break;
    }
    case kArray: {
      if (depth > 2) input_error("{}: arrays nested too deeply at offset {}", path(), r.offset());
      const uint32_t et = r.read<uint32_t>("array element type");
      if (et > kF64) input_error("{}: unknown array element type {} at offset {}", path(), et, r.offset());
      const uint64_t n = r.read<uint64_t>("array length");
      if (n > kMaxArray || n > file_->size()) input_error("{}: array length {} is implausible", path(), n);
      v.elem = Type(et);
      v.items.reserve(size_t(n));
      for (uint64_t k = 0; k < n; ++k) v.items.push_back(read_value(r, Type(et), depth + 1));
      break;
    }
    default: input_error("{}: unknown value type {} at offset {}", path(), uint32_t(t), r.offset());
  }
  return v;
}

GgufFile::GgufFile(const std::string& path) : file_(std::make_shared<const MappedFile>(path)) {
  ByteReader r(*file_);
  const uint32_t magic = r.read<uint32_t>("magic");
  if (magic != 0x46554747u) input_error("{}: not a GGUF file (bad magic)", path);
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    input_error("{}: GGUF version {} is not supported (expected 2 or 3)", path, version_);
  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("key-value count");
  if (n_tensors > file_->size() || n_kv > file_->size())
    input_error("{}: implausible counts ({} tensors, {} key-values)", path, n_tensors, n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t klen = r.read<uint64_t>("key length");
    if (klen > 65536) input_error("{}: key length {} of key-value {} is implausible", path, klen, k);
    std::string key = r.read_bytes(klen, "key");
    const uint32_t t = r.read<uint32_t>("value type");
    if (t > kF64) input_error("{}: key '{}' has unknown value type {}", path, key, t);
    kv_[key] = read_value(r, Type(t), 0);
  }
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo ti;
    const uint64_t nlen = r.read<uint64_t>("tensor name length");
    if (nlen > 65536) input_error("{}: tensor name length {} is implausible", path, nlen);
    ti.name = r.read_bytes(nlen, "tensor name");
    const uint32_t nd = r.read<uint32_t>("tensor dims");
    if (nd == 0 || nd > kMaxDims) input_error("{}: tensor '{}' has {} dims", path, ti.name, nd);
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = r.read<uint64_t>("tensor dim");
      if (ne == 0 || ne > (1ull << 40)) input_error("{}: tensor '{}' has dim {}", path, ti.name, ne);
      ti.ne.push_back(int64_t(ne));
    }
    ti.type = r.read<uint32_t>("tensor type");
    ti.offset = r.read<uint64_t>("tensor offset");
    by_name_[ti.name] = tensors_.size();
    tensors_.push_back(std::move(ti));
  }
  const uint64_t align = get_uint_or("general.alignment", 32);
  if (align == 0 || (align & (align - 1))) input_error("{}: general.alignment {} is not a power of two", path, align);
  const uint64_t data_start = (r.offset() + align - 1) / align * align;
  for (auto& ti : tensors_) {
    uint64_t n = 1;
    for (auto d : ti.ne) {
      if (n > (1ull << 40) / uint64_t(d)) input_error("{}: tensor '{}' is implausibly large", path, ti.name);
      n *= uint64_t(d);
    }
    switch (ti.type) {
      case kTF32: ti.bytes = n * 4; break;
      case kTF16: case kTBF16: ti.bytes = n * 2; break;
      case kTQ8_0:
        if (ti.ne[0] % 32) input_error("{}: Q8_0 tensor '{}' row length {} is not a multiple of 32", path, ti.name, ti.ne[0]);
        ti.bytes = n / 32 * 34;
        break;
      default:
        input_error("{}: tensor '{}' has type {} (supported: F32, F16, BF16, Q8_0)", path, ti.name,
                    type_name(ti.type));
    }
    if (ti.offset % align) input_error("{}: tensor '{}' offset {} is not aligned to {}", path, ti.name, ti.offset, align);
    ti.offset += data_start;
    file_->require(ti.offset, ti.bytes, ("data of tensor " + ti.name).c_str());
  }
}

std::string GgufFile::type_name(uint32_t t) {
  switch (t) {
    case kTF32: return "F32";
    case kTF16: return "F16";
    case kTBF16: return "BF16";
    case kTQ8_0: return "Q8_0";
    default: return "ggml type " + std::to_string(t);
  }
}

const GgufFile::Value& GgufFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) input_error("{}: missing key '{}'", path(), key);
  return it->second;
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  const Value& v = get(key);
  if (v.type == kF32 || v.type == kF64 || v.type == kString || v.type == kArray || v.type == kBool || v.i < 0)
    input_error("{}: key '{}' must be a non-negative integer", path(), key);
  return v.u;
}
uint64_t GgufFile::get_uint_or(const std::string& key, uint64_t dflt) const {
  return has(key) ? get_uint(key) : dflt;
}
double GgufFile::get_float_or(const std::string& key, double dflt) const {
  if (!has(key)) return dflt;
  const Value& v = get(key);
  if (v.type == kString || v.type == kArray) input_error("{}: key '{}' must be a number", path(), key);
  return (v.type == kF32 || v.type == kF64) ? v.f : double(v.i);
}
bool GgufFile::get_bool_or(const std::string& key, bool dflt) const {
  if (!has(key)) return dflt;
  const Value& v = get(key);
  if (v.type == kString || v.type == kArray) input_error("{}: key '{}' must be a bool", path(), key);
  return v.u != 0;
}
std::string GgufFile::get_string(const std::string& key) const {
  const Value& v = get(key);
  if (v.type != kString) input_error("{}: key '{}' must be a string", path(), key);
  return v.s;
}
std::string GgufFile::get_string_or(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}
std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const Value& v = get(key);
  if (v.type != kArray || v.elem != kString) input_error("{}: key '{}' must be an array of strings", path(), key);
  std::vector<std::string> out;
  out.reserve(v.items.size());
  for (auto& it : v.items) out.push_back(it.s);
  return out;
}
std::vector<double> GgufFile::get_number_array(const std::string& key) const {
  const Value& v = get(key);
  if (v.type != kArray || v.elem == kString || v.elem == kArray)
    input_error("{}: key '{}' must be an array of numbers", path(), key);
  std::vector<double> out;
  out.reserve(v.items.size());
  for (auto& it : v.items) out.push_back((it.type == kF32 || it.type == kF64) ? it.f : double(it.i));
  return out;
}

const GgufFile::TensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Weight GgufFile::load(const TensorInfo& t, DType to, WeightLoad how) const {
  Weight w = convert(t, to, how);
  if (!w.mapped()) file_->release(t.offset, t.bytes);
  return w;
}

Weight GgufFile::convert(const TensorInfo& t, DType to, WeightLoad how) const {
  std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
  const uint8_t* src = file_->data() + t.offset;
  switch (t.type) {
    case kTF32: return load_tensor(file_, t.offset, DType::kF32, to, shape, how);
    case kTF16: return load_tensor(file_, t.offset, DType::kF16, to, shape, how);
    case kTBF16: return load_tensor(file_, t.offset, DType::kBF16, to, shape, how);
    case kTQ8_0: {
      // Block of 32: f16 scale d, then 32 int8 q; value = d * q.
      int64_t n = 1;
      for (auto d : t.ne) n *= d;
      std::vector<float> tmp(static_cast<size_t>(n));
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + b * 34;
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        const float d = f16_to_f32(dh);
        const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
        for (int k = 0; k < 32; ++k) tmp[size_t(b * 32 + k)] = d * float(q[k]);
      }
      return convert_weight(DType::kF32, tmp.data(), to, shape);
    }
  }
  input_error("{}: tensor '{}' type {} unsupported", path(), t.name, type_name(t.type));
}

}  // namespace hg
