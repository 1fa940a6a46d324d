// A model file's key-value metadata as architectures read their hyperparameters from it (GGUF's
// "<arch>.*" keys), without depending on the file format that holds it.
#pragma once
#include <cstdint>
#include <string>

namespace hg {

class ModelMetadata {
 public:
  virtual ~ModelMetadata() = default;
  virtual const std::string& path() const = 0;  // for error messages
  virtual bool has(const std::string& key) const = 0;
  // InputError naming the file and key when missing or of another type.
  virtual uint64_t get_uint(const std::string& key) const = 0;
  virtual uint64_t get_uint_or(const std::string& key, uint64_t dflt) const = 0;
  virtual double get_float_or(const std::string& key, double dflt) const = 0;
  virtual std::string get_string(const std::string& key) const = 0;
};

}  // namespace hg
