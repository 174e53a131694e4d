// GPU steps of the EXL3 quantizer; see exl3_steps_cuda.h for the contract and what is bit-exact.
#include "quantize/cuda/exl3_steps_cuda.h"

#include <cmath>

#include "quantize/cuda/cuda_check.h"

namespace spw::quant {
namespace {

constexpr int kRedBlocks = 1024, kRedThreads = 256;

__device__ __forceinline__ int perm_row(int p) {
  const int t = p >> 3, j = p & 7;
  return 2 * (t & 3) + (j & 1) + 8 * ((j >> 1) & 1);
}
__device__ __forceinline__ int perm_col(int p) {
  const int t = p >> 3, j = p & 7;
  return (t >> 2) + 8 * ((j >> 2) & 1);
}

__global__ void to_f64_weighted_kernel(const float* __restrict__ x, const float* __restrict__ w, int64_t m, int64_t d,
                                       double* __restrict__ xd, double* __restrict__ xw) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * d) return;
  const double v = x[i];
  xd[i] = v;
  xw[i] = (w ? double(w[i / d]) : 1.0) * v;  // the CPU's xa = ω·x_a
}

// One warp per 128-vector v[e·stride], e = 0..127, staged in shared memory: the CPU's butterflies
// (strides 1..64, a+b / a−b), then ×r. Each output is the same expression tree as on the CPU.
__device__ __forceinline__ void had128_warp_f64(double* v, int lane, double r) {
  for (int s = 1; s < 128; s <<= 1) {
    for (int q = lane; q < 64; q += 32) {
      const int i = ((q & ~(s - 1)) << 1) | (q & (s - 1));
      const double a = v[i], b = v[i + s];
      v[i] = a + b;
      v[i + s] = a - b;
    }
    __syncwarp();
  }
  for (int i = lane; i < 128; i += 32) v[i] *= r;
  __syncwarp();
}

// Left: 8 warps, each one column of a 128-row block. Block (column group of 8, row block).
__global__ void had_left_kernel(double* __restrict__ x, int64_t cols, double r) {
  __shared__ double sv[8][129];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t j0 = int64_t(blockIdx.x) * 8, i0 = int64_t(blockIdx.y) * 128;
  for (int idx = threadIdx.x; idx < 8 * 128; idx += 256) {
    const int e = idx >> 3, c = idx & 7;
    if (j0 + c < cols) sv[c][e] = x[(i0 + e) * cols + j0 + c];
  }
  __syncthreads();
  if (j0 + warp < cols) had128_warp_f64(sv[warp], lane, r);
  __syncthreads();
  for (int idx = threadIdx.x; idx < 8 * 128; idx += 256) {
    const int e = idx >> 3, c = idx & 7;
    if (j0 + c < cols) x[(i0 + e) * cols + j0 + c] = sv[c][e];
  }
}

// Right: 8 warps, each one row's 128-column block. Block (row group of 8, column block).
__global__ void had_right_kernel(double* __restrict__ x, int64_t rows, int64_t cols, double r) {
  __shared__ double sv[8][128];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t i = int64_t(blockIdx.x) * 8 + warp, j0 = int64_t(blockIdx.y) * 128;
  if (i >= rows) return;
  double* row = x + i * cols + j0;
  for (int e = lane; e < 128; e += 32) sv[warp][e] = row[e];
  __syncwarp();
  had128_warp_f64(sv[warp], lane, r);
  for (int e = lane; e < 128; e += 32) row[e] = sv[warp][e];
}

// hi[i][j] = h[i][j]·(su[i]·su[j]).
__global__ void hess_signs_kernel(const double* __restrict__ h, int64_t k, const double* __restrict__ su,
                                  double* __restrict__ hi) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < k * k) hi[i] = h[i] * (su[i / k] * su[i % k]);
}

// Inverse of the lower-triangular 16×16 diagonal block of C at b (16 threads, one column each,
// the CPU's recurrence), then L[i][b + cc] = Σ_p C[i][b+p]·inv[p][cc] for rows i of this block
// row (upper triangle of C read as zero).
__global__ void block_l_kernel(const double* __restrict__ c, int64_t k, double* __restrict__ l) {
  __shared__ double inv[16][16];
  const int64_t b = int64_t(blockIdx.x) * 16, i = int64_t(blockIdx.y) * 16 + (threadIdx.x >> 4);
  const int cc = threadIdx.x & 15;
  if (blockIdx.y < blockIdx.x) return;  // rows above the block: L is zero there (cleared by the caller)
  if (threadIdx.x < 16) {
    const int c0 = threadIdx.x;
    for (int rr = 0; rr < 16; ++rr) {
      double s = (rr == c0) ? 1.0 : 0.0;
      for (int p = 0; p < rr; ++p) s -= c[(b + rr) * k + b + p] * inv[p][c0];
      inv[rr][c0] = s / c[(b + rr) * k + b + rr];
    }
  }
  __syncthreads();
  double s = 0;
  for (int p = 0; p < 16; ++p) {
    const double cip = (b + p <= i) ? c[i * k + b + p] : 0.0;
    s += cip * inv[p][cc];
  }
  l[i * k + b + cc] = s;
}

__global__ void ldlq_targets_kernel(const double* __restrict__ t, const double* __restrict__ l,
                                    const double* __restrict__ delta, int64_t k, int64_t n, int64_t r0,
                                    float* __restrict__ targets) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= 16 * n) return;
  const int64_t tn = idx >> 8;
  const int p = int(idx & 255), r = perm_row(p);
  const int64_t j = tn * 16 + perm_col(p);
  double s = t[(r0 + r) * n + j];
  if (l)
    for (int64_t jr = r0 + 16; jr < k; ++jr) {
      const double coef = l[jr * k + r0 + r];
      if (coef != 0) s += coef * delta[jr * n + j];
    }
  targets[idx] = float(s);
}

__global__ void ldlq_decode_kernel(const uint16_t* __restrict__ states, const float* __restrict__ lut32,
                                   const double* __restrict__ t, int64_t n, int64_t r0, double* __restrict__ q,
                                   double* __restrict__ delta) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= 16 * n) return;
  const int64_t tn = idx >> 8;
  const int p = int(idx & 255);
  const int64_t at = (r0 + perm_row(p)) * n + tn * 16 + perm_col(p);
  const double v = lut32[states[idx]];
  q[at] = v;
  delta[at] = t[at] - v;
}

// Deterministic two-stage dot product: fixed grid, fixed tree.
__global__ void dot_partial_kernel(const double* __restrict__ a, const double* __restrict__ b, int64_t count,
                                   double* __restrict__ partial) {
  __shared__ double red[kRedThreads];
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * kRedThreads + threadIdx.x; i < count; i += int64_t(kRedBlocks) * kRedThreads)
    s += a[i] * b[i];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int w = kRedThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = red[0];
}

__global__ void sum_partials_kernel(double* partial) {
  __shared__ double red[kRedBlocks];
  red[threadIdx.x] = partial[threadIdx.x];
  __syncthreads();
  for (int w = kRedBlocks / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[0] = red[0];
}

unsigned blocks_for(int64_t count, int threads) { return unsigned((count + threads - 1) / threads); }

}  // namespace

Status quant_cuda_context_create(QuantCudaContext& ctx) {
  QCUDA_TRY(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  QCUBLAS_TRY(cublasCreate(&ctx.blas));
  QCUBLAS_TRY(cublasSetStream(ctx.blas, ctx.stream));
  QCUSOLVER_TRY(cusolverDnCreate(&ctx.solver));
  QCUSOLVER_TRY(cusolverDnSetStream(ctx.solver, ctx.stream));
  return {};
}

void quant_cuda_context_destroy(QuantCudaContext& ctx) {
  if (ctx.solver) cusolverDnDestroy(ctx.solver);
  if (ctx.blas) cublasDestroy(ctx.blas);
  if (ctx.stream) cudaStreamDestroy(ctx.stream);
  ctx = QuantCudaContext{};
}

Status gemm_cuda(QuantCudaContext& ctx, const double* a, const double* b, double* c, int64_t m, int64_t kk, int64_t n) {
  // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ.
  const double one = 1.0, zero = 0.0;
  QCUBLAS_TRY(cublasDgemm(ctx.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(kk), &one, b, int(n), a, int(kk),
                          &zero, c, int(n)));
  return {};
}

Status hessian_accumulate_cuda(QuantCudaContext& ctx, const float* x, const float* weights, int64_t m, int64_t d,
                               double* h) {
  if (m <= 0) return {};
  double *xd = nullptr, *xw = nullptr;
  QCUDA_TRY(cudaMallocAsync(&xd, size_t(m * d) * sizeof(double), ctx.stream));
  QCUDA_TRY(cudaMallocAsync(&xw, size_t(m * d) * sizeof(double), ctx.stream));
  to_f64_weighted_kernel<<<blocks_for(m * d, 256), 256, 0, ctx.stream>>>(x, weights, m, d, xd, xw);
  // Row-major H[a][b] += Σ_t xw[t][a]·xd[t][b] is column-major H'(b, a) = Σ_t Xd'(b, t)·Xw'(a, t).
  const double one = 1.0;
  const Status st = cublas_status(cublasDgemm(ctx.blas, CUBLAS_OP_N, CUBLAS_OP_T, int(d), int(d), int(m), &one, xd,
                                              int(d), xw, int(d), &one, h, int(d)),
                                  "cublasDgemm (Hessian)");
  cudaFreeAsync(xd, ctx.stream);
  cudaFreeAsync(xw, ctx.stream);
  if (!st.ok()) return st;
  return cuda_status(cudaGetLastError(), "hessian_accumulate_cuda");
}

void had_left_cuda(QuantCudaContext& ctx, double* x, int64_t rows, int64_t cols) {
  const double r = 1.0 / std::sqrt(128.0);
  had_left_kernel<<<dim3(unsigned((cols + 7) / 8), unsigned(rows / 128)), 256, 0, ctx.stream>>>(x, cols, r);
}

void had_right_cuda(QuantCudaContext& ctx, double* x, int64_t rows, int64_t cols) {
  const double r = 1.0 / std::sqrt(128.0);
  had_right_kernel<<<dim3(unsigned((rows + 7) / 8), unsigned(cols / 128)), 256, 0, ctx.stream>>>(x, rows, cols, r);
}

void hessian_rotate_cuda(QuantCudaContext& ctx, const double* h, const double* su, int64_t k, double* hi) {
  hess_signs_kernel<<<blocks_for(k * k, 256), 256, 0, ctx.stream>>>(h, k, su, hi);
  had_left_cuda(ctx, hi, k, k);
  had_right_cuda(ctx, hi, k, k);
}

Status block_ldl_cuda(QuantCudaContext& ctx, const double* h, int64_t k, double* l, bool* not_pd) {
  *not_pd = false;
  double* c = nullptr;
  int* info_d = nullptr;
  double* work = nullptr;
  int lwork = 0;
  QCUDA_TRY(cudaMallocAsync(&c, size_t(k * k) * sizeof(double), ctx.stream));
  QCUDA_TRY(cudaMallocAsync(&info_d, sizeof(int), ctx.stream));
  QCUDA_TRY(cudaMemcpyAsync(c, h, size_t(k * k) * sizeof(double), cudaMemcpyDeviceToDevice, ctx.stream));
  // Row-major lower = column-major upper: potrf(UPPER) leaves C (H = C·Cᵀ) in the row-major lower
  // triangle; the row-major upper triangle keeps H's values and is never read.
  QCUSOLVER_TRY(cusolverDnDpotrf_bufferSize(ctx.solver, CUBLAS_FILL_MODE_UPPER, int(k), c, int(k), &lwork));
  QCUDA_TRY(cudaMallocAsync(&work, size_t(lwork) * sizeof(double), ctx.stream));
  QCUSOLVER_TRY(cusolverDnDpotrf(ctx.solver, CUBLAS_FILL_MODE_UPPER, int(k), c, int(k), work, lwork, info_d));
  int info = 0;
  QCUDA_TRY(cudaMemcpyAsync(&info, info_d, sizeof(int), cudaMemcpyDeviceToHost, ctx.stream));
  QCUDA_TRY(cudaStreamSynchronize(ctx.stream));
  if (info != 0) {
    *not_pd = true;
  } else {
    QCUDA_TRY(cudaMemsetAsync(l, 0, size_t(k * k) * sizeof(double), ctx.stream));
    block_l_kernel<<<dim3(unsigned(k / 16), unsigned(k / 16)), 256, 0, ctx.stream>>>(c, k, l);
  }
  cudaFreeAsync(work, ctx.stream);
  cudaFreeAsync(info_d, ctx.stream);
  cudaFreeAsync(c, ctx.stream);
  return cuda_status(cudaGetLastError(), "block_ldl_cuda");
}

void ldlq_targets_cuda(QuantCudaContext& ctx, const double* t, const double* l, const double* delta, int64_t k,
                       int64_t n, int64_t r0, float* targets) {
  ldlq_targets_kernel<<<blocks_for(16 * n, 256), 256, 0, ctx.stream>>>(t, l, delta, k, n, r0, targets);
}

void ldlq_decode_cuda(QuantCudaContext& ctx, const uint16_t* states, const float* lut32, const double* t, int64_t n,
                      int64_t r0, double* q, double* delta) {
  ldlq_decode_kernel<<<blocks_for(16 * n, 256), 256, 0, ctx.stream>>>(states, lut32, t, n, r0, q, delta);
}

Result<double> dot_cuda(QuantCudaContext& ctx, const double* a, const double* b, int64_t count) {
  double* partial = nullptr;
  QCUDA_TRY(cudaMallocAsync(&partial, kRedBlocks * sizeof(double), ctx.stream));
  dot_partial_kernel<<<kRedBlocks, kRedThreads, 0, ctx.stream>>>(a, b, count, partial);
  sum_partials_kernel<<<1, kRedBlocks, 0, ctx.stream>>>(partial);
  double out = 0;
  QCUDA_TRY(cudaMemcpyAsync(&out, partial, sizeof(double), cudaMemcpyDeviceToHost, ctx.stream));
  QCUDA_TRY(cudaFreeAsync(partial, ctx.stream));
  QCUDA_TRY(cudaStreamSynchronize(ctx.stream));
  return out;
}

Result<double> trace_form_cuda(QuantCudaContext& ctx, const double* h, const double* a, const double* b, int64_t k,
                               int64_t n, double* scratch) {
  if (!h) return dot_cuda(ctx, a, b, k * n);
  SPW_TRY(gemm_cuda(ctx, h, b, scratch, k, k, n));  // H·B
  return dot_cuda(ctx, a, scratch, k * n);
}

}  // namespace spw::quant
