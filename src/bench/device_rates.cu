#include "bench/device_rates.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace spw::bench {
namespace {

Status cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return make_error("CUDA error in ", what, ": ", cudaGetErrorString(e));
}
Status cublas_ok(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return make_error("cuBLAS error in ", what, ": ", cublasGetStatusString(s));
}
#define BENCH_CUDA(call) SPW_TRY(cuda_ok((call), #call))
#define BENCH_CUBLAS(call) SPW_TRY(cublas_ok((call), #call))

// Frees what it holds on every return path.
struct DeviceScratch {
  void* p[3] = {nullptr, nullptr, nullptr};
  cudaEvent_t ev[2] = {nullptr, nullptr};
  cublasHandle_t blas = nullptr;
  ~DeviceScratch() {
    for (void* q : p) if (q) cudaFree(q);
    for (cudaEvent_t e : ev) if (e) cudaEventDestroy(e);
    if (blas) cublasDestroy(blas);
  }
};

// x[i] = bf16 of a hash of i, uniform in [-1, 1).
__global__ void fill_bf16_kernel(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    x[i] = __float2bfloat16(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Best time in seconds of `iters` runs of `op` (after one warm-up), by CUDA events.
template <class Op>
Result<double> best_seconds(DeviceScratch& s, int iters, Op op) {
  if (!s.ev[0]) BENCH_CUDA(cudaEventCreate(&s.ev[0]));
  if (!s.ev[1]) BENCH_CUDA(cudaEventCreate(&s.ev[1]));
  SPW_TRY(op());
  BENCH_CUDA(cudaDeviceSynchronize());
  double best = 1e30;
  for (int i = 0; i < std::max(1, iters); ++i) {
    BENCH_CUDA(cudaEventRecord(s.ev[0]));
    SPW_TRY(op());
    BENCH_CUDA(cudaEventRecord(s.ev[1]));
    BENCH_CUDA(cudaEventSynchronize(s.ev[1]));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, s.ev[0], s.ev[1]));
    best = std::min(best, double(ms) * 1e-3);
  }
  return best;
}

}  // namespace

Result<double> measure_copy_bandwidth(size_t nbytes, int iters) {
  DeviceScratch s;
  BENCH_CUDA(cudaMalloc(&s.p[0], nbytes));
  BENCH_CUDA(cudaMalloc(&s.p[1], nbytes));
  BENCH_CUDA(cudaMemset(s.p[0], 1, nbytes));
  auto t = best_seconds(s, iters, [&]() -> Status {
    BENCH_CUDA(cudaMemcpyAsync(s.p[1], s.p[0], nbytes, cudaMemcpyDeviceToDevice));
    return {};
  });
  if (!t.ok()) return t.error();
  return 2.0 * double(nbytes) / *t;
}

namespace {

// Every thread reads 16-byte words of x (strided over the grid) and keeps their xor, written once so that the reads
// cannot be left out.
__global__ void read_kernel(const uint4* x, size_t n, uint4* out) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = x[i];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if (acc.x == 0x12345678u && acc.y == 0x9abcdef0u) out[0] = acc;
}

struct PinnedScratch {
  void* host = nullptr;
  ~PinnedScratch() {
    if (host) cudaFreeHost(host);
  }
};

}  // namespace

Result<MappedReadRates> measure_mapped_read_bandwidth(size_t nbytes, int iters) {
  DeviceScratch s;
  PinnedScratch h;
  BENCH_CUDA(cudaHostAlloc(&h.host, nbytes, cudaHostAllocMapped));
  std::fill_n(static_cast<unsigned char*>(h.host), nbytes, 1);
  void* mapped = nullptr;
  BENCH_CUDA(cudaHostGetDevicePointer(&mapped, h.host, 0));
  BENCH_CUDA(cudaMalloc(&s.p[0], nbytes));
  BENCH_CUDA(cudaMalloc(&s.p[1], 64));
  int sms = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  MappedReadRates r;
  auto kernel = best_seconds(s, iters, [&]() -> Status {
    read_kernel<<<4 * sms, 512>>>(static_cast<const uint4*>(mapped), nbytes / 16, static_cast<uint4*>(s.p[1]));
    BENCH_CUDA(cudaGetLastError());
    return {};
  });
  if (!kernel.ok()) return kernel.error();
  r.kernel = double(nbytes) / *kernel;
  auto copy = best_seconds(s, iters, [&]() -> Status {
    BENCH_CUDA(cudaMemcpyAsync(s.p[0], h.host, nbytes, cudaMemcpyHostToDevice));
    return {};
  });
  if (!copy.ok()) return copy.error();
  r.copy = double(nbytes) / *copy;
  return r;
}

Result<double> measure_bf16_gemm_rate(int dim, int iters) {
  DeviceScratch s;
  const size_t n = size_t(dim) * dim;
  for (int i = 0; i < 3; ++i) BENCH_CUDA(cudaMalloc(&s.p[i], n * sizeof(__nv_bfloat16)));
  for (int i = 0; i < 2; ++i) {
    fill_bf16_kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(s.p[i]), n, 0x1234u + i);
    BENCH_CUDA(cudaGetLastError());
  }
  BENCH_CUBLAS(cublasCreate(&s.blas));
  const float alpha = 1.f, beta = 0.f;
  auto t = best_seconds(s, iters, [&]() -> Status {
    BENCH_CUBLAS(cublasGemmEx(s.blas, CUBLAS_OP_T, CUBLAS_OP_N, dim, dim, dim, &alpha, s.p[0], CUDA_R_16BF, dim,
                              s.p[1], CUDA_R_16BF, dim, &beta, s.p[2], CUDA_R_16BF, dim, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    return {};
  });
  if (!t.ok()) return t.error();
  return 2.0 * double(dim) * dim * dim / *t;
}

}  // namespace spw::bench
