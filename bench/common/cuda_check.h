// CK(call): a CUDA runtime call whose failure ends a benchmark with the file, line, call and CUDA's message.
// Shared by the GPU benchmarks (bench_exl3, bench_exl3_ceiling, bench_dense); fail_call also serves their
// checks of other status types (bench_dense: spw::Status, cuBLAS).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace spw::bench {

[[noreturn]] inline void fail_call(const char* file, int line, const char* call, const char* message) {
  std::fprintf(stderr, "%s:%d %s: %s\n", file, line, call, message);
  std::exit(1);
}

}  // namespace spw::bench

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) spw::bench::fail_call(__FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
  } while (0)
