// The sweep driver: an experiment spec run point by point and strategy by strategy into a result
// directory, with resume, shards, progress and ETA, Ctrl-C handling and the summary at the end.
// `hgbench FILE.yaml`, `hgbench eval` and `hgbench validate` parse their options and call it.
#pragma once
#include <string>

#include "experiments/runner/spec.h"

namespace hg {

struct SweepOptions {
  std::string output;  // result directory (default: the spec's `output`)
  std::string resume;  // continue this result directory
  std::string shard;   // "I/N": every N-th point from I
  bool force = false;  // replace a non-empty output directory
  bool list = false;   // print the expanded points and return
};

// Every model of the spec can load (headers only) and every task's data parses, before anything
// runs or is written: InputError naming the file and key otherwise.
void check_inputs(const ExperimentSpec& spec);
// A point as the progress line names it: the model, then every axis the point records that is
// set (the table of axes: sweep_axes()), then the swept strategy parameters.
std::string describe(const Point& p);
// Runs the spec; the exit status (0, 1 when a row failed, 130 when interrupted).
int run_sweep(ExperimentSpec spec, const SweepOptions& o);

}  // namespace hg
