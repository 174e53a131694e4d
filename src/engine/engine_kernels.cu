#include "engine/engine_kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include "cuda/launch.h"

namespace spw::engine {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

Status launched(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return make_error(what, ": ", cudaGetErrorString(e));
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t n_rows, int64_t d, float* out) {
  cuda::pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * d) return;
  const int64_t j = i / d, ch = i % d;
  out[i] = x[int64_t(rows[j]) * d + ch];
}

__global__ void scatter_add_rows_kernel(float* acc, const float* y, const int32_t* rows, int64_t n_rows, int64_t d) {
  cuda::pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * d) return;
  const int64_t j = i / d, ch = i % d;
  float* a = acc + int64_t(rows[j]) * d + ch;
  *a = __fadd_rn(*a, y[i]);
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, bool round_out, float* out) {
  cuda::pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = __fadd_rn(a[i], b[i]);
  out[i] = round_out ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  cuda::pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fmul_rn(x[i], s);
}

// A warp per row, in place: stage h pairs (j, j + h) for every j with bit h clear, a + b and a − b, as the
// reference's loops do. The pairs of a stage are disjoint, so the lanes split them and __syncwarp (which also
// orders the lanes' global memory accesses) separates the stages: the same operations as one thread walking the
// row (which took 123 µs per V4 indexer call for 64 rows of 128, a kernel trace).
__global__ void hadamard_rows_kernel(float* x, int64_t n_rows, int n, float scale) {
  cuda::pdl_enter();
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= n_rows) return;  // the whole warp
  float* v = x + r * n;
  for (int h = 1; h < n; h *= 2) {
    for (int p = lane; p < n / 2; p += 32) {
      const int j = (p / h) * 2 * h + p % h;
      const float a = v[j], b = v[j + h];
      v[j] = __fadd_rn(a, b);
      v[j + h] = __fsub_rn(a, b);
    }
    __syncwarp();
  }
  for (int i = lane; i < n; i += 32) v[i] = __fmul_rn(v[i], scale);
}

__global__ void iota_select_kernel(const int64_t* visible, int64_t n_rows, int64_t stride, int32_t* sel) {
  cuda::pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * stride) return;
  const int64_t r = i / stride, g = i % stride;
  sel[i] = g < visible[r] ? int32_t(g) : -1;
}

}  // namespace

Status hadamard_rows_cuda(float* x, int64_t n_rows, int n, cudaStream_t stream) {
  if (n_rows == 0) return {};
  if (n <= 0 || (n & (n - 1)) != 0) return make_error("hadamard_rows_cuda: n = ", n, " is not a power of two");
  const float scale = 1.0f / std::sqrt(float(n));
  cuda::launch(hadamard_rows_kernel, blocks_for(n_rows * 32), kThreads, 0, stream, x, n_rows, n, scale);
  return launched("hadamard_rows_cuda");
}

Status iota_select_cuda(const int64_t* visible, int64_t n_rows, int64_t stride, int32_t* sel, cudaStream_t stream) {
  if (n_rows * stride == 0) return {};
  cuda::launch(iota_select_kernel, blocks_for(n_rows * stride), kThreads, 0, stream, visible, n_rows, stride, sel);
  return launched("iota_select_cuda");
}

Status gather_rows_cuda(const float* x, const int32_t* rows, int64_t n_rows, int64_t d, float* out,
                        cudaStream_t stream) {
  if (n_rows * d == 0) return {};
  cuda::launch(gather_rows_kernel, blocks_for(n_rows * d), kThreads, 0, stream, x, rows, n_rows, d, out);
  return launched("gather_rows_cuda");
}

Status scatter_add_rows_cuda(float* acc, const float* y, const int32_t* rows, int64_t n_rows, int64_t d,
                             cudaStream_t stream) {
  if (n_rows * d == 0) return {};
  cuda::launch(scatter_add_rows_kernel, blocks_for(n_rows * d), kThreads, 0, stream, acc, y, rows, n_rows, d);
  return launched("scatter_add_rows_cuda");
}

Status add_cuda(const float* a, const float* b, int64_t n, float* out, cudaStream_t stream, bool round_out) {
  if (n == 0) return {};
  cuda::launch(add_kernel, blocks_for(n), kThreads, 0, stream, a, b, n, round_out, out);
  return launched("add_cuda");
}

Status scale_cuda(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n == 0) return {};
  cuda::launch(scale_kernel, blocks_for(n), kThreads, 0, stream, x, n, s);
  return launched("scale_cuda");
}

namespace {

__global__ void count_routes_kernel(const int32_t* experts, int64_t n, int n_experts, unsigned long long* counts) {
  cuda::pdl_enter();  // launched plainly (an ordinary stream dependency), but kept to launch.h's contract
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t e = experts[i];
    if (e >= 0 && e < n_experts) atomicAdd(counts + e, 1ull);
  }
}

}  // namespace

Status count_routes_cuda(const int32_t* experts, int64_t n, int n_experts, unsigned long long* counts,
                         cudaStream_t stream) {
  if (n <= 0) return {};
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 1024));
  count_routes_kernel<<<blocks, 256, 0, stream>>>(experts, n, n_experts, counts);
  return launched("count_routes_cuda");
}

}  // namespace spw::engine
