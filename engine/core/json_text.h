// JSON text of a document whose strings may come from outside (file names, YAML scalars, dataset
// fields): bytes that are not UTF-8 become U+FFFD instead of an exception mid-write.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace hg {

template <class Json>
std::string json_text(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace hg
