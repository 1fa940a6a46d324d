// Model formats: one loader per format, registered by name in register_formats(); each produces
// the same Model. A model spec is a path (format probed), "<format>:<path>", or
// "synthetic:<preset>[?layers=N&dtype=bf16&seed=S]". Options after '?' are format-specific.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/mapped_file.h"
#include "engine/core/model.h"

namespace hg {

struct LoadOptions {
  std::optional<DType> weight_dtype;  // engine type for matrices; default depends on the source
  // Shapes only (dry runs): synthetic presets place their weights in phantom memory, unfilled.
  // Other formats load as usual (their weights are mapped or read).
  bool phantom_weights = false;
};

// How a loader holds the weights whose type in the file is the engine's: `copy` (the default)
// copies into the process's own 2 MiB-page buffers, rows written by the threads that read them
// (first touch: on a multi-node machine each thread's rows on its node), and the file's pages are
// dropped as they are copied; `map` uses the file's mapping itself (no copy: loads at the speed of
// mapping; load_model locks the pages in memory where the process may, so that they are not
// dropped and re-read under memory pressure), but decode reads page-cache pages a few percent
// slower (docs/performance.md, "Loading and resident memory"). Weights converted to another type
// are always copies. The model spec's option load=map|copy chooses.
enum class WeightLoad { kMap, kCopy };
struct ModelSpec;
WeightLoad weight_load_option(const ModelSpec& spec);
// A tensor of `shape` stored as `from` in the file from byte `off` (bounds checked by the caller),
// held as `to` the way `how` says: a view of the mapping (kMap, `from` is `to`, the bytes aligned to
// the type), or else a copy whose file pages are released as they are copied.
Weight load_tensor(const std::shared_ptr<const MappedFile>& f, uint64_t off, DType from, DType to,
                   std::vector<int64_t> shape, WeightLoad how);

// "path?key=value&key2=value2" → path and options; keys are checked by the loader.
struct ModelSpec {
  std::string format;  // empty when probing
  std::string path;
  std::map<std::string, std::string> options;
};
ModelSpec parse_model_spec(const std::string& spec);
// Throws InputError naming the first option not in `allowed`.
void check_spec_options(const ModelSpec& s, const std::vector<std::string>& allowed);

struct ModelFormat {
  std::string name;
  std::string doc;
  bool (*probe)(const std::string& path) = nullptr;  // true when the path looks like this format
  Model (*load)(const ModelSpec& spec, const LoadOptions& opts) = nullptr;
};

class FormatRegistry {
 public:
  void add(ModelFormat f) { formats_.push_back(std::move(f)); }
  const ModelFormat* by_name(std::string_view name) const;
  const std::vector<ModelFormat>& all() const { return formats_; }

 private:
  std::vector<ModelFormat> formats_;
};

const FormatRegistry& model_formats();
// Loads any supported model; throws InputError with the file and problem on bad input.
Model load_model(const std::string& spec, const LoadOptions& opts = {});
// Checks, without loading weights, that `spec` names a model that can load: a known format and,
// for synthetic ones, a known preset; a path that exists and that a format recognises. InputError
// (one line naming the model) otherwise.
void check_model_spec(const std::string& spec);

ModelFormat gguf_format();
ModelFormat hf_format();
// The tokenizer of an HF-style directory without its model (tokenizer.model, tokenizer.json or
// vocab.json + merges.txt, with tokenizer_config.json's add_bos_token when present).
std::unique_ptr<Tokenizer> load_hf_tokenizer_dir(const std::string& dir);
ModelFormat llama2c_format();
ModelFormat synthetic_format();

// Synthetic presets: name → shapes (the paper's models and small test models).
struct SyntheticPreset {
  std::string name;
  std::string arch;
  HParams hp;
  // Set for a preset whose weights are written, not drawn: fills a model of hp's shapes whose
  // weights are F32 and zero (norm weights one).
  std::function<void(Model&)> write;
};
const std::vector<SyntheticPreset>& synthetic_presets();

// Picks the engine dtype for matrices stored as `src` (F32, F16 and BF16 stay as they are) unless
// the caller asked for one.
DType default_weight_dtype(DType src, const LoadOptions& opts);

}  // namespace hg
