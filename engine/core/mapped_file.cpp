// mmap-backed file reader.
#include "engine/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace hg {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) input_error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    input_error("{}: not a regular file", path);
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      input_error("{}: cannot map: {}", path, std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::release(uint64_t off, uint64_t n) const {
  if (!data_ || n == 0 || off >= size_) return;
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  const uint64_t b = off / page * page, e = std::min<uint64_t>(size_, off + n);
  ::madvise(const_cast<uint8_t*>(data_) + b, size_t(e - b), MADV_DONTNEED);  // advice: failure changes nothing
}

void MappedFile::require(uint64_t off, uint64_t n, const char* what) const {
  if (off > size_ || n > size_ - off)
    input_error("{}: truncated: {} needs bytes [{}, {}) but the file has {}", path_, what, off, off + n,
                size_);
}

}  // namespace hg
