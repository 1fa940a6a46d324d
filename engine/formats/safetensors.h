// safetensors reader: u64 header length, JSON header {name: {dtype, shape, data_offsets}}, data.
// Offsets and sizes are checked against the file. F32, F16 and BF16 tensors.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/mapped_file.h"
#include "engine/core/tensor.h"
#include "engine/formats/formats.h"

namespace hg {

class SafetensorsFile {
 public:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t offset;  // absolute
    uint64_t bytes;
  };
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const Entry* find(const std::string& name) const;
  const std::map<std::string, Entry>& entries() const { return entries_; }
  // A view of the mapping when `how` is kMap and the file holds the tensor as `to`, else a copy.
  Weight load(const Entry& e, DType to, WeightLoad how = WeightLoad::kCopy) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  std::map<std::string, Entry> entries_;
};

}  // namespace hg
