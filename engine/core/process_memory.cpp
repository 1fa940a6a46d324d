// Resident memory from procfs.
#include "engine/core/process_memory.h"

#include <fstream>
#include <string>

namespace hg {

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key) {
    if (key == "VmRSS:" && in >> kb >> unit) m.resident_bytes = kb * 1024;
    else if (key == "VmHWM:" && in >> kb >> unit) m.peak_resident_bytes = kb * 1024;
    else in.ignore(1 << 20, '\n');
  }
  return m;
}

bool reset_peak_resident() {
  std::ofstream out("/proc/self/clear_refs");
  return bool(out << "5" << std::flush);
}

}  // namespace hg
