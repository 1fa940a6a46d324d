// Errors: exceptions that say what and where. Library code never aborts or exits; the CLI maps
// InputError to exit status 2 (bad file, field or argument) and other errors to 1.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace hg {

// Something the user gave us is wrong: a file, a config field, a YAML key, an argument.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A capacity was exceeded (a memory tier, a context length); callers may record it as a result.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writing an output failed (a full disk, a file-size limit); the message names the path and says
// what was kept. The CLI exits 1 for it.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The request is well-formed but this build or machine cannot do it (e.g. CUDA asked for and
// not present). An InputError, so the CLI exits 2 for it too.
class UnsupportedError : public InputError {
 public:
  using InputError::InputError;
};

template <typename... Args>
[[noreturn]] void input_error(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

#define HG_CHECK(cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw std::logic_error(fmt::format("{}:{}: check failed: {}", __FILE__, __LINE__, #cond)); \
  } while (0)

}  // namespace hg
