// What the fuzz targets share: the input as a file (a memfd, so no disk and no cleanup) and the
// rule for outcomes. A parser may reject its input with InputError (and its subclasses) or
// OutOfMemoryError — the one-line errors users see; any other exception (a logic_error from a
// check, bad_alloc from an unchecked size, a library's own exception escaping) is a finding and is
// rethrown, so that libFuzzer records the input.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "engine/core/error.h"

namespace hg::fuzz {

// A file holding `data`, alive while this object is.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t n, const char* name = "fuzz") {
    fd_ = memfd_create(name, MFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
    for (size_t off = 0; off < n;) {
      const ssize_t w = ::write(fd_, data + off, n - off);
      if (w <= 0) throw std::runtime_error("memfd write failed");
      off += size_t(w);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A directory of files for formats that read several (removed on destruction).
class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/hg-fuzz.XXXXXX";
    if (!mkdtemp(t)) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  void write(const std::string& rel, const uint8_t* data, size_t n) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void TempDir::write(const std::string& rel, const uint8_t* data, size_t n) const {
  const std::filesystem::path p = std::filesystem::path(path_) / rel;
  std::filesystem::create_directories(p.parent_path());
  FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + p.string());
  if (n) std::fwrite(data, 1, n, f);
  std::fclose(f);
}

// Runs fn; the expected rejections return normally.
inline void expect_clean(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError&) {
  } catch (const OutOfMemoryError&) {
  }
}

}  // namespace hg::fuzz
