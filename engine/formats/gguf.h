// GGUF v2/v3 reader: key-values, tensor directory, and tensor loading (F32, F16, BF16, Q8_0 →
// the engine's weight type). Every offset and size is checked against the file; a bad file is an
// InputError naming it. Read-only; the file stays mapped for the reader's lifetime.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/mapped_file.h"
#include "engine/core/model_metadata.h"
#include "engine/core/tensor.h"
#include "engine/formats/formats.h"

namespace hg {

class GgufFile final : public ModelMetadata {
 public:
  // GGUF value types (gguf spec).
  enum Type : uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64 };
  // ggml tensor types this reader dequantizes.
  enum TensorType : uint32_t { kTF32 = 0, kTF16 = 1, kTQ8_0 = 8, kTBF16 = 30 };

  struct Value {
    Type type = kU8;
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    std::string s;
    Type elem = kU8;            // for arrays
    std::vector<Value> items;   // for arrays
  };
  struct TensorInfo {
    std::string name;
    std::vector<int64_t> ne;  // ggml order: ne[0] is contiguous
    uint32_t type = 0;
    uint64_t offset = 0;      // absolute, in the file
    uint64_t bytes = 0;
  };

  explicit GgufFile(const std::string& path);
  const std::string& path() const override { return file_->path(); }
  uint32_t version() const { return version_; }

  bool has(const std::string& key) const override { return kv_.count(key) != 0; }
  const Value& get(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const override;
  uint64_t get_uint_or(const std::string& key, uint64_t dflt) const override;
  double get_float_or(const std::string& key, double dflt) const override;
  bool get_bool_or(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key) const override;
  std::string get_string_or(const std::string& key, const std::string& dflt) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<double> get_number_array(const std::string& key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  // Loads a tensor into `to` (matrices) with PyTorch shape (ggml ne reversed): a view of the
  // mapping when `how` is kMap and the file holds it as `to`, else a copy.
  Weight load(const TensorInfo& t, DType to, WeightLoad how = WeightLoad::kCopy) const;
  static std::string type_name(uint32_t t);

 private:
  Weight convert(const TensorInfo& t, DType to, WeightLoad how) const;  // load() before the mapping is released
  Value read_value(ByteReader& r, Type t, int depth) const;
  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  std::map<std::string, Value> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace hg
