// How much host memory the machine has free for us.
#pragma once

#include <cstddef>

namespace spw {

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read (callers then treat memory as unknown).
size_t host_available_nbytes();

}  // namespace spw
