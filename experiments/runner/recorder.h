// The Recorder: one result directory per run — config.yaml (the effective experiment),
// rows.jsonl (one row per point × strategy × repeat, each appended and flushed whole when it
// finishes), summary.csv and table.txt (times normalised to the baseline, with a geometric mean).
// Resume reads the rows back (a torn last line from a kill is cut off) and skips what is there;
// merge joins shard directories into one result set.
#pragma once
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "experiments/runner/result_row.h"
#include "experiments/runner/spec.h"

namespace hg {

class ResultDir {
 public:
  // A new directory (an existing non-empty one needs resume or force: force empties it), or with
  // resume an existing one whose rows are kept.
  ResultDir(const std::string& dir, const ExperimentSpec& spec, bool resume, bool force, const std::string& shard);
  ~ResultDir();
  ResultDir(const ResultDir&) = delete;
  ResultDir& operator=(const ResultDir&) = delete;
  // Repeats of (point, label) already recorded.
  std::vector<int> done(const std::string& point_id, const std::string& label) const;
  // Appends one row (checked as ResultRow::parse checks it) as one write of one line, then syncs it to disk.
  void append(const nlohmann::ordered_json& row);
  const std::string& path() const { return dir_; }
  size_t resumed_rows() const { return resumed_; }
  // A held result-directory lock (its descriptor), released when it goes.
  struct Lock {
    int fd = -1;
    ~Lock();
  };

 private:
  std::string dir_;
  int fd_ = -1;
  Lock lock_;  // the directory's, held while this object lives (closed too when the constructor throws)
  std::set<std::tuple<std::string, std::string, int>> done_;
  size_t resumed_ = 0;
};

// The input files `rows` recorded (provenance.inputs), path → "bytes fingerprint". Rows that
// disagree about one path are an InputError naming it and `where`: results of two versions of one input.
std::map<std::string, std::string> recorded_inputs(const std::vector<ResultRow>& rows,
                                                   const std::string& where);

// Every complete row of DIR/rows.jsonl, checked (a torn last line is skipped; `torn` says whether there was one).
std::vector<ResultRow> read_rows(const std::string& dir, bool* torn = nullptr);

// Writes DIR/summary.csv and DIR/table.txt from `rows`; returns the table (times normalised to
// `baseline` per point, geometric mean last). `labels` orders the strategies.
std::string write_summary(const std::string& dir, const std::vector<ResultRow>& rows,
                          const std::string& baseline, const std::vector<std::string>& labels);

// A modeled row's figure `key` (end_to_end_s, decode_tokens_per_s) at one end ("peak", "achieved")
// of its profile's band (figures.modeled.band); NaN for measured rows and rows from before the band.
double band_figure(const ResultRow& r, const char* end, const char* key);
double band_time(const ResultRow& r, const char* end);
// "lo–hi" of two ratios to two decimals, the lower first (one value when they agree to the digits shown).
std::string band_text(double a, double b);

struct MergeOptions {
  // When > 0: the set is shards 0..N-1 of N (each directory says which shard it holds); every
  // row each shard owes must be there, else nothing is written and `missing` names the shards.
  int shards = 0;
  bool force = false;  // replace a non-empty `out`
};
struct MergeReport {
  size_t rows = 0;
  std::vector<std::string> missing;  // one line per shard that is absent or incomplete
  std::vector<int> missing_shards;
  std::string table;
  size_t duplicates = 0;  // rows found in more than one directory (the first kept)
};
// Joins shard directories (each with config.yaml and rows.jsonl of the same experiment) into
// `out`. Errors name the directory that does not fit. With opts.shards, directories that do not
// exist are shards not yet run.
MergeReport merge_results(const std::vector<std::string>& dirs, const std::string& out, const MergeOptions& opts = {});

}  // namespace hg
