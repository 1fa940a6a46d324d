// This process's resident memory, from /proc/self/status (0 where it cannot be read).
#pragma once
#include <cstdint>

namespace hg {

struct ProcessMemory {
  int64_t resident_bytes = 0;       // VmRSS
  int64_t peak_resident_bytes = 0;  // VmHWM: the peak since the start, or since reset_peak_resident()
};
ProcessMemory process_memory();
// Restarts VmHWM from the current resident size (/proc/self/clear_refs); false when not allowed.
bool reset_peak_resident();

}  // namespace hg
