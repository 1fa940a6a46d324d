// `hgbench tokenize`: a text's token ids with a model's tokenizer, as llama.cpp's llama-tokenize
// prints them (a vocab-only GGUF is enough).
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/core/error.h"
#include "engine/core/model.h"
#include "engine/formats/formats.h"
#include "engine/tokenizer/tokenizer.h"

namespace hg::cli {

int cmd_tokenize(const std::vector<std::string>& args) {
  const std::string cmd = "tokenize";
  CLI::App app{"Prints the token ids of a text: one `id -> 'piece'` line per token, or --ids for a list.", cmd};
  std::string model, text;
  bool no_bos = false, ids_only = false;
  app.add_option("-m,--model", model, "GGUF (vocab-only too), HF directory (tokenizer files only too), llama2.c .bin, synthetic:<preset>")->required();
  app.add_option("-p,--text,--prompt", text, "the text")->required();
  app.add_flag("--no-bos", no_bos, "do not prepend BOS (default: as the tokenizer's add_bos says)");
  app.add_flag("--ids", ids_only, "print only the ids, as [a, b, c]");
  if (int rc = parse_cli(app, cmd, args); rc >= 0) return rc;
  std::shared_ptr<Tokenizer> tok;
  std::error_code ec;
  if (model.size() > 5 && model.substr(model.size() - 5) == ".gguf") {
    tok = load_gguf_tokenizer(model);
  } else if (std::filesystem::is_directory(model, ec) && !std::filesystem::exists(model + "/config.json", ec)) {
    tok = load_hf_tokenizer_dir(model);  // a tokenizer-only folder
  } else {
    LoadOptions lo;
    lo.phantom_weights = true;  // the tokenizer only
    tok = load_model(model, lo).tokenizer;
  }
  std::vector<int32_t> ids = tok->encode(text);
  if (!no_bos && tok->add_bos && tok->bos_id >= 0) ids.insert(ids.begin(), tok->bos_id);
  if (ids_only) {
    std::string s;
    for (auto id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
    fmt::print("[{}]\n", s);
    return 0;
  }
  int32_t prev = -1;
  for (auto id : ids) {
    fmt::print("{:>6} -> '{}'\n", id, tok->piece(id, prev));
    prev = id;
  }
  return 0;
}

}  // namespace hg::cli
