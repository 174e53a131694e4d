#include "base/host_memory.h"

#include <fstream>
#include <string>

namespace spw {

size_t host_available_nbytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kib = 0;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

}  // namespace spw
