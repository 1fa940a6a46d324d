// `hgbench export`: a Llama-architecture model as GGUF v3 that llama.cpp loads.
#include <filesystem>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "engine/cli/cli.h"
#include "engine/formats/formats.h"
#include "engine/formats/gguf_writer.h"

namespace hg::cli {

int cmd_export(const std::vector<std::string>& args) {
  CLI::App app{"Writes a Llama-architecture model as GGUF v3, for running the same bytes in hgbench and in "
               "llama.cpp (e.g. `llama-bench -m FILE.gguf`). Matrices keep the model's weight type (or --weights); "
               "q/k rows are permuted to llama.cpp's interleaved RoPE and Llama-3 scaling becomes rope_freqs.weight. "
               "The vocabulary is generated (<unk>, <s>, </s>, 256 byte pieces, placeholders), so text is "
               "meaningless: this is for speed comparisons with random (`synthetic:`) weights.",
               "export"};
  std::string model_spec, out, weights;
  app.add_option("-m,--model", model_spec, "the model to write (e.g. synthetic:llama-3.2-1b?dtype=f16)")->required();
  app.add_option("-o,--out", out, "the GGUF file to write")->required();
  app.add_option("--weights", weights, "weight type f32, f16 or bf16 (default: the model's)");
  if (int rc = parse_cli(app, "export", args); rc >= 0) return rc;
  const Model model = load_model(model_spec, load_options(weights, "export"));
  write_gguf(model, out);
  fmt::print("wrote {} ({} weights, {} layers, {:.1f} MB)\n", out, dtype_name(model.weight_dtype), model.hp.n_layers,
             double(std::filesystem::file_size(out)) / 1e6);
  return 0;
}

}  // namespace hg::cli
