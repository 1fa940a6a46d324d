// `hgbench reproduction`: the generated parts of docs/reproduction.md, from result directories.
// The document marks each generated part with a pair of HTML comments,
//   <!-- generated: NAME (results DIR) --> … <!-- end generated: NAME -->
// and only the text between them is rewritten; the prose around them is kept. The parts read
// the dry experiment files' result directories (scripts/reproduce runs them) and the clock
// check's measured rows.
#pragma once
#include <string>
#include <vector>

namespace hg {

struct ReproductionReport {
  std::string text;                // the whole document, regenerated
  std::vector<std::string> parts;  // the parts regenerated, by name
  std::vector<std::string> kept;   // measured parts whose rows are absent: their text is kept
};

// Regenerates the parts of `doc` (the document's text; `doc_name` names it in errors) from the
// result directories under `results` (RESULTS/<experiment>, e.g. results/reproduction/seqlen). A
// dry part whose directory has no rows, an unknown part or an unclosed marker is an InputError
// naming the document's line or the directory; a measured part without its rows keeps its text.
ReproductionReport regenerate_reproduction(const std::string& doc, const std::string& doc_name,
                                           const std::string& results);

}  // namespace hg
