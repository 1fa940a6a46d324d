// Strict YAML helpers: unknown keys are errors naming file:line, the key path and the nearest
// valid key; wrong types name what was expected. Shared by platform profiles and experiment specs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace hg {

// Levenshtein-nearest of `candidates` to `key` (for "did you mean" hints).
std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates,
                        size_t* distance = nullptr);
// Throws InputError for any key of the map `node` not in `allowed`.
void check_keys(const YAML::Node& node, const std::vector<std::string>& allowed, const std::string& file,
                const std::string& path);
// Reads a number at node[key]; absent → dflt (or an error when required).
double yaml_number(const YAML::Node& node, const std::string& key, double dflt, bool required, const std::string& file,
                   const std::string& path);
std::string yaml_string(const YAML::Node& node, const std::string& key, const std::string& dflt, const std::string& file,
                        const std::string& path);
// Experiment files and platform profiles are small: a larger file is refused before it is read.
inline constexpr uintmax_t kMaxYamlBytes = uintmax_t(16) << 20;
// The one document of `text`: a syntax error or a second document is an InputError naming file:line.
// Documents are counted by a bounded parser loop, not YAML::LoadAll, which never returns on some
// malformed text (a lone ',') in yaml-cpp 0.7.
YAML::Node yaml_load_one(const std::string& text, const std::string& file);
// A regular file of at most kMaxYamlBytes, parsed; errors name the file (and the line).
YAML::Node yaml_load_file(const std::string& file);

}  // namespace hg
