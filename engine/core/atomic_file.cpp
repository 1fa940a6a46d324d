#include "engine/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "engine/core/error.h"

namespace hg {

AtomicFile::AtomicFile(std::string path, bool binary) : path_(std::move(path)) {
  tmp_ = fmt::format("{}.tmp.{}", path_, ::getpid());
  f_ = std::fopen(tmp_.c_str(), binary ? "wb" : "w");
  // A destination that cannot be created (no such directory, no permission) is the caller's input.
  if (!f_) input_error("{}: cannot write ({})", path_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (f_) {
    std::fclose(f_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const std::string& text) {
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), f_);
}

void AtomicFile::commit() {
  if (!f_) throw IoError(fmt::format("{}: already committed", path_));
  int err = 0;
  if (std::fflush(f_) != 0 || std::ferror(f_)) err = errno ? errno : EIO;
  if (!err && ::fsync(::fileno(f_)) != 0) err = errno;
  if (std::fclose(f_) != 0 && !err) err = errno;
  f_ = nullptr;
  if (!err && std::rename(tmp_.c_str(), path_.c_str()) != 0) err = errno;
  if (err) {
    ::unlink(tmp_.c_str());
    throw IoError(fmt::format("{}: write failed ({}); the previous file, if any, is unchanged", path_,
                              std::strerror(err)));
  }
  // The rename itself reaches the disk with the directory.
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace hg
