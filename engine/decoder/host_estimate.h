// Host memory a generation needs beyond its weights, estimated from the shapes before anything is
// allocated, and the check against what the machine has: a point too large is an out-of-memory
// error naming both numbers, never the kernel's OOM killer.
#pragma once
#include <cstdint>
#include <string>

#include "engine/core/model.h"

namespace hg {

struct HostEstimate {
  int64_t bytes = 0;
  std::string basis;  // what it counts (tokens, layers, rows), for messages
};

// `batch` sequences of `prompt` + `decode` tokens, the prefill in forwards of at most `prefill_rows`
// rows. dry: the bookkeeping of a dry run only (positions, scores and token metadata per layer and
// KV head; no KV, no activations). Otherwise also the whole KV twice at 16 bits (the emulated
// accelerator's memory is the host's: a resident copy and an offloaded one) and the prefill's F32
// activations. An upper bound for the strategies here (docs/errors.md, "Memory").
HostEstimate generation_host_estimate(const HParams& hp, int64_t prompt, int64_t decode, int64_t batch,
                                      int64_t prefill_rows, bool dry);

// Bytes this process may still allocate: /proc/meminfo's MemAvailable, lowered by a cgroup v2
// limit when one is set (memory.max − memory.current); -1 when neither can be read.
int64_t host_memory_available();

// Throws OutOfMemoryError "<what>: needs an estimated X of host memory (basis), Y available" when
// the estimate exceeds what is available; does nothing when availability is unknown.
void require_host_memory(const HostEstimate& e, const std::string& what);

// "1.5 GB", "45.3 TB": bytes in decimal units for messages.
std::string format_bytes(int64_t bytes);
// A size as written: a number with an optional unit (B, KiB, MiB, GiB, KB, MB, GB); InputError
// naming `what` and the text when it is not one, or not positive.
int64_t parse_bytes(const std::string& s, const std::string& what);

}  // namespace hg
