// `hgbench models` and `hgbench strategies`: what a run can name.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "baselines/registry.h"
#include "engine/cli/cli.h"
#include "engine/formats/formats.h"

namespace hg::cli {

int cmd_strategies(const std::vector<std::string>& args) {
  CLI::App app{"Lists the KV strategies with their parameters (type, default, unit).", "strategies"};
  if (int rc = parse_cli(app, "strategies", args); rc >= 0) return rc;
  for (auto& s : strategies()) {
    fmt::print("{:<16} {}\n", s.name, s.doc);
    for (auto& p : s.params) {
      std::string type = param_type_name(p.type);
      if (p.type == ParamSpec::Type::kEnum) {
        type = "";
        for (auto& c : p.choices) type += (type.empty() ? "" : "|") + c;
      }
      fmt::print("    {:<20} {:<22} default {:<8} {}{}\n", p.name, type, p.dflt, p.doc,
                 p.unit.empty() ? "" : " [" + p.unit + "]");
    }
  }
  return 0;
}

int cmd_models(const std::vector<std::string>& args) {
  CLI::App app{"Lists model formats and the synthetic presets (random weights, real shapes).", "models"};
  if (int rc = parse_cli(app, "models", args); rc >= 0) return rc;
  fmt::print("formats:\n");
  for (auto& f : model_formats().all()) fmt::print("  {:<10} {}\n", f.name, f.doc);
  fmt::print("synthetic presets (synthetic:<name>):\n");
  for (auto& p : synthetic_presets())
    fmt::print("  {:<14} {:<6} L={:<3} d={:<5} H={:<3} H_kv={:<3} D={:<4} ff={:<6} V={}\n", p.name, p.arch,
               p.hp.n_layers, p.hp.d_model, p.hp.n_heads, p.hp.n_kv_heads, p.hp.head_dim, p.hp.d_ff, p.hp.n_vocab);
  return 0;
}

}  // namespace hg::cli
