// A read-only memory map of a whole file, with bounds-checked reads that raise InputError
// naming the file ("truncated") instead of reading past the end.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/core/error.h"

namespace hg {

// The whole of `path` as bytes. It must be a regular file (links followed) of at most max_bytes:
// a FIFO, a device, a directory or a link loop is an InputError naming the path and what it is,
// never an open that blocks or a read without end. Model, tokenizer, dataset and result files are
// read through it (MappedFile checks the same).
// Whether anything is at `path`, links not followed (a dangling link or a loop is something: reading
// it then says what is wrong). Never throws.
bool file_present(const std::string& path);
inline constexpr int64_t kMaxReadFileBytes = int64_t(1) << 30;
std::string read_regular_file(const std::string& path, int64_t max_bytes = kMaxReadFileBytes);

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Throws InputError("<path>: truncated …") unless [off, off+n) is inside the file.
  void require(uint64_t off, uint64_t n, const char* what) const;
  // Drops this process's pages of [off, off+n) (and of the pages they share with neighbours)
  // once a loader has copied the bytes out: the process then holds the weights once, not once in
  // its copy and again in the mapping. A later read faults the page back in from the page cache.
  void release(uint64_t off, uint64_t n) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Sequential little-endian reader over a MappedFile.
class ByteReader {
 public:
  ByteReader(const MappedFile& f, uint64_t off = 0) : f_(f), off_(off) {}
  template <typename T>
  T read(const char* what) {
    f_.require(off_, sizeof(T), what);
    T v;
    std::memcpy(&v, f_.data() + off_, sizeof(T));
    off_ += sizeof(T);
    return v;
  }
  std::string read_bytes(uint64_t n, const char* what) {
    f_.require(off_, n, what);
    std::string s(reinterpret_cast<const char*>(f_.data() + off_), size_t(n));
    off_ += n;
    return s;
  }
  uint64_t offset() const { return off_; }
  void seek(uint64_t off) { off_ = off; }

 private:
  const MappedFile& f_;
  uint64_t off_;
};

}  // namespace hg
