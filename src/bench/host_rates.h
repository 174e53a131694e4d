// Host DRAM read bandwidth with all cores, the denominator of the CPU expert tier's roofline in `spillway bench`
// (and of cpu/host_moe_worker.h's acceptance: its kernels at one token per expert against this rate).
// What it measures: `threads` threads each sum 64-byte lines of their own contiguous share of an `nbytes` buffer
// (filled first, so its pages are resident), best of `iters`; bytes read / seconds. A STREAM-like read, not a copy.
#pragma once

#include <cstddef>

namespace spw::bench {

double measure_host_read_bandwidth(size_t nbytes, int threads, int iters);  // bytes/s

}  // namespace spw::bench
