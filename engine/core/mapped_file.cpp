// mmap-backed file reader.
#include "engine/core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hg {

namespace {

const char* file_kind(mode_t m) {
  return S_ISDIR(m)    ? "a directory"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
                       : "not a regular file";
}

// Opens `path` for reading without blocking (a FIFO opens at once) and checks that it is a regular
// file; returns the descriptor and fills `st`.
int open_regular(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) input_error("{}: cannot open: {}", path, std::strerror(errno));
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    const mode_t m = st->st_mode;
    ::close(fd);
    input_error("{}: {}, expected a regular file", path, file_kind(m));
  }
  return fd;
}

}  // namespace

bool file_present(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string read_regular_file(const std::string& path, int64_t max_bytes) {
  struct stat st {};
  const int fd = open_regular(path, &st);
  if (int64_t(st.st_size) > max_bytes) {
    ::close(fd);
    input_error("{}: {} bytes, above the {} bytes this file may have", path, int64_t(st.st_size), max_bytes);
  }
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // shorter than its size said (truncated meanwhile): what was there
    got += size_t(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  struct stat st {};
  const int fd = open_regular(path, &st);
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
