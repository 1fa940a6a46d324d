// Output files that are either whole or absent: written beside their final name, flushed to disk,
// then renamed over it (and the directory synced), so a kill, a full disk or a failed write never
// leaves a torn summary, table, profile or merged rows where a reader (or --resume) expects them.
#pragma once
#include <cstdio>
#include <string>

namespace hg {

class AtomicFile {
 public:
  // Opens "<path>.tmp.<pid>" for writing; InputError naming `path` when it cannot (no such
  // directory, no permission).
  explicit AtomicFile(std::string path, bool binary = true);
  // Without commit() the temporary is removed and `path` keeps what it held.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  FILE* file() { return f_; }
  void write(const std::string& text);
  // Flush, fsync, close, rename over `path`, fsync its directory. IoError (naming `path` and the
  // reason; `path` unchanged) when any step fails.
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
};

// The whole of `text` as `path`, atomically (AtomicFile).
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace hg
