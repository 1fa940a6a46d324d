// Strict YAML helpers.
#include "engine/core/yaml_util.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include <yaml-cpp/eventhandler.h>

#include "engine/core/error.h"

namespace hg {

std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates, size_t* distance) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (auto& c : candidates) {
    std::vector<size_t> prev(c.size() + 1), cur(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= key.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= c.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (key[i - 1] == c[j - 1] ? 0 : 1)});
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_d) {
      best_d = prev[c.size()];
      best = c;
    }
  }
  if (distance) *distance = best_d;
  return best;
}

namespace {
// "LINE" of a node, or "(--set)" for one an override made (it has no line).
std::string line_of(const YAML::Node& n) {
  return n.Mark().is_null() || n.Mark().line < 0 ? std::string("(--set)") : std::to_string(n.Mark().line + 1);
}
std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }
}  // namespace

void check_keys(const YAML::Node& node, const std::vector<std::string>& allowed, const std::string& file,
                const std::string& path) {
  if (!node.IsMap()) input_error("{}:{}: {} must be a mapping", file, line_of(node), path.empty() ? "the document" : path);
  std::map<std::string, std::string> seen;  // key → its line
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar())
      input_error("{}:{}: a key in {} must be a plain name, not a list or mapping", file, line_of(it->first),
                  path.empty() ? "the document" : path);
    const std::string k = it->first.Scalar();
    if (auto [at, fresh] = seen.emplace(k, line_of(it->first)); !fresh)
      input_error("{}:{}: duplicate key '{}' (first at line {}); give each key once", file, line_of(it->first),
                  join(path, k), at->second);
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      input_error("{}:{}: unknown key '{}' (did you mean '{}'?)", file, line_of(it->first), join(path, k),
                  join(path, nearest_key(k, allowed)));
  }
}

double yaml_number(const YAML::Node& node, const std::string& key, double dflt, bool required, const std::string& file,
                   const std::string& path) {
  const YAML::Node v = node[key];
  if (!v) {
    if (required) input_error("{}:{}: missing key '{}'", file, line_of(node), join(path, key));
    return dflt;
  }
  try {
    return v.as<double>();
  } catch (const YAML::Exception&) {
    input_error("{}:{}: '{}' must be a number", file, line_of(v), join(path, key));
  }
}

std::string yaml_string(const YAML::Node& node, const std::string& key, const std::string& dflt, const std::string& file,
                        const std::string& path) {
  const YAML::Node v = node[key];
  if (!v) return dflt;
  if (!v.IsScalar()) input_error("{}:{}: '{}' must be a string", file, line_of(v), join(path, key));
  return v.as<std::string>();
}

namespace {
// Records where each document starts and nothing else.
struct DocumentStarts final : YAML::EventHandler {
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& m) override { starts.push_back(m); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};
}  // namespace

YAML::Node yaml_load_one(const std::string& text, const std::string& file) {
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentStarts h;
    while (h.starts.size() < 2 && parser.HandleNextDocument(h)) {
    }
    // A document that starts where the one before it did consumed nothing: the parser is stuck on a token.
    if (h.starts.size() > 1 && h.starts[1].pos == h.starts[0].pos)
      input_error("{}:{}: YAML syntax error: no document can start here (a ',' outside [ ] or {{ }}?)", file,
                  h.starts[1].line + 1);
    if (h.starts.size() > 1)
      input_error("{}:{}: a second YAML document; the file holds one", file, std::max(1, h.starts[1].line + 1));
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    input_error("{}:{}: YAML syntax error: {}", file, e.mark.line + 1, e.msg);
  }
}

YAML::Node yaml_load_file(const std::string& file) {
  std::error_code ec;
  if (std::filesystem::exists(file, ec) && !std::filesystem::is_regular_file(file, ec))
    input_error("{}: not a regular file (a YAML file was expected)", file);
  if (std::filesystem::exists(file, ec) && std::filesystem::file_size(file, ec) > kMaxYamlBytes)
    input_error("{}: larger than {} MiB; not an hgbench YAML file", file, kMaxYamlBytes >> 20);
  try {
    return YAML::LoadFile(file);
  } catch (const YAML::BadFile&) {
    input_error("{}: cannot open", file);
  } catch (const YAML::ParserException& e) {
    input_error("{}:{}: YAML syntax error: {}", file, e.mark.line + 1, e.msg);
  }
}

}  // namespace hg
