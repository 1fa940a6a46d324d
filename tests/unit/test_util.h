// Shared test helpers: the ../shared data directory (tests skip cleanly without it), seeded
// inputs in [-1, 1], element-wise comparison with atol + rtol·|ref| (NaN fails), temp files.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/core/error.h"

namespace hg::test {

// The message of the InputError f throws; "" when it throws none.
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

inline std::string shared_dir() {
  if (const char* e = std::getenv("HG_SHARED_DIR")) return e;
  return HG_SHARED_DIR;
}
inline std::string shared_path(const std::string& rel) { return shared_dir() + "/" + rel; }

#define HG_REQUIRE_SHARED(rel)                                                              \
  do {                                                                                      \
    if (!std::filesystem::exists(::hg::test::shared_path(rel)))                             \
      GTEST_SKIP() << "../shared is absent (" << ::hg::test::shared_path(rel) << "); skipped"; \
  } while (0)

inline std::vector<float> random_vec(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

// Tolerances are data: one row per (op, type).
struct Tol {
  double atol, rtol;
};

inline ::testing::AssertionResult all_close(const float* got, const float* ref, size_t n, Tol tol) {
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i];
    if (std::isnan(g) || std::isnan(r) || std::abs(g - r) > tol.atol + tol.rtol * std::abs(r))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g << ", ref " << r << " (atol "
                                           << tol.atol << ", rtol " << tol.rtol << ")";
  }
  return ::testing::AssertionSuccess();
}

// A path in this test process's own temporary directory, which is removed when the process exits
// (ctest runs each test in a process of its own: without the removal every run left one behind).
inline std::string temp_path(const std::string& name) {
  struct Dir {
    pid_t owner = ::getpid();
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("hg_test_" + std::to_string(owner));
    ~Dir() {
      std::error_code ec;
      if (::getpid() == owner) std::filesystem::remove_all(path, ec);  // not from a forked child
    }
  };
  static const Dir dir;
  std::filesystem::create_directories(dir.path);
  return (dir.path / name).string();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace hg::test
