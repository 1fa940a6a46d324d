// Phantom ranges: a PROT_NONE reservation, then the shared memfd window mapped over it repeatedly.
#include "engine/core/phantom.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

namespace hg {
namespace {

constexpr size_t kWindow = size_t(64) << 20;

int window_fd() {
  static std::once_flag once;
  static int fd = -1;
  std::call_once(once, [] {
    fd = memfd_create("hgbench-phantom", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, off_t(kWindow)) != 0) {
      close(fd);
      fd = -1;
    }
  });
  return fd;
}

size_t rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kWindow - 1) / kWindow * kWindow; }

}  // namespace

size_t phantom_window_bytes() { return kWindow; }

void* phantom_alloc(size_t bytes) {
  const int fd = window_fd();
  if (fd < 0) return nullptr;
  const size_t n = rounded(bytes);
  void* base = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  for (size_t off = 0; off < n; off += kWindow) {
    void* p = mmap(static_cast<char*>(base) + off, kWindow, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      munmap(base, n);
      return nullptr;
    }
  }
  return base;
}

void phantom_free(void* p, size_t bytes) {
  if (p) munmap(p, rounded(bytes));
}

}  // namespace hg
