// The in-process loopback backend of comm/communicator.h: `size` ranks in one process, each driven by
// its own thread, exchanging host buffers through shared memory. What CI runs every tensor- and
// expert-parallel code path on. A collective blocks its caller until every rank has called it; sums add
// in rank order, so every rank gets the same bits.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace spw::comm {

// The ranks of one loopback group. Each communicator must be used by one thread at a time, and all of
// them must take part in every collective (or the others wait forever).
std::vector<std::unique_ptr<Communicator>> make_loopback_group(int size);

}  // namespace spw::comm
