// The pick pipeline's kernels (contract in pick_logits.h).
#include <cmath>

#include "cuda/launch.h"
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/pick_logits.h"

namespace spw::cuda {
namespace {

constexpr int kMaskThreads = 256;
constexpr int kRowThreads = 1024;

__global__ void mask_kernel(float* logits, int64_t vocab, const uint64_t* bits, const int64_t* mask_row) {
  pdl_enter();
  const int64_t row = blockIdx.y, first = mask_row[row];
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first < 0 || i >= vocab) return;
  if (!((bits[first + i / 64] >> (i % 64)) & 1)) logits[row * vocab + i] = -INFINITY;
}

// (v, i) comes after (pv, pi) in (value descending, id ascending) order.
__device__ bool after(float v, int i, float pv, int pi) { return v < pv || (v == pv && i > pi); }

__global__ void __launch_bounds__(kRowThreads)
    top_kernel(const float* logits, int64_t vocab, const int32_t* top_n, RowLogprobs* out) {
  pdl_enter();
  __shared__ float scratch_v[32];
  __shared__ int scratch_i[32];
  __shared__ double scratch_d[32];
  const int64_t row = blockIdx.x;
  const int n = top_n[row];
  if (n < 0) return;
  const float* l = logits + row * vocab;
  float bv = -INFINITY;
  int bi = INT32_MAX;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (dev::better(l[i], i, bv, bi)) bv = l[i], bi = i;
  dev::block_argmax(bv, bi, scratch_v, scratch_i);
  const float max_l = bv;
  double part = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) part += exp(double(l[i]) - double(max_l));
  const double log_z = double(max_l) + log(dev::block_sum(part, scratch_d));
  RowLogprobs& o = out[row];
  if (threadIdx.x == 0) o.log_z = log_z;
  // The k-th most likely: the best candidate after the (k−1)-th.
  float pv = bv;
  int pi = bi, k = 0;
  for (; k < n && isfinite(pv); ++k) {
    if (threadIdx.x == 0) {
      o.top_ids[k] = pi;
      o.top_logprobs[k] = float(double(pv) - log_z);
    }
    float nv = -INFINITY;
    int ni = INT32_MAX;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
      if (after(l[i], i, pv, pi) && dev::better(l[i], i, nv, ni)) nv = l[i], ni = i;
    dev::block_argmax(nv, ni, scratch_v, scratch_i);
    pv = nv, pi = ni;
  }
  if (threadIdx.x == 0) o.n_top = k;
}

// One block per row; each pass's ids are unique, so the threads of a pass touch distinct logits.
// Pass 0 scales (the host sampler's l / p or l · p, IEEE-rounded alike), passes 1 and 2 add.
__global__ void shift_kernel(float* logits, int64_t vocab, const LogitShift* shifts, const int32_t* first,
                             const int32_t* repeat_end, const int32_t* split, float* saved) {
  pdl_enter();
  const int64_t row = blockIdx.x;
  float* l = logits + row * vocab;
  const int32_t bounds[4] = {first[row], repeat_end[row], split[row], first[row + 1]};
  for (int pass = 0; pass < 3; ++pass) {
    for (int j = bounds[pass] + int(threadIdx.x); j < bounds[pass + 1]; j += int(blockDim.x)) {
      const LogitShift s = shifts[j];
      if (s.id < 0 || s.id >= vocab) continue;
      const float v = l[s.id];
      saved[j] = v;
      l[s.id] = pass > 0 ? __fadd_rn(v, s.delta) : v > 0.f ? __fdiv_rn(v, s.delta) : __fmul_rn(v, s.delta);
    }
    __syncthreads();
  }
}

__global__ void chosen_kernel(const float* logits, int64_t vocab, const int32_t* chosen, const int32_t* top_n,
                              const LogitShift* shifts, const int32_t* first, const float* saved, RowLogprobs* out) {
  pdl_enter();
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (top_n[row] < 0) return;
  const int32_t c = chosen[row];
  float v = logits[row * vocab + c];
  for (int j = first[row]; j < first[row + 1]; ++j)
    if (shifts[j].id == c) {
      v = saved[j];
      break;
    }
  out[row].chosen = float(double(v) - out[row].log_z);
}

Status check(const char* what, int64_t n_rows, int64_t vocab) {
  if (vocab <= 0 || vocab >= INT32_MAX || n_rows < 0 || n_rows > 65535)
    return make_error(what, ": ", n_rows, " rows of ", vocab, " logits (need ≤ 65535 rows, 0 < vocab < 2^31)");
  return {};
}

Status launched(cudaError_t e, const char* kernel) {
  if (e != cudaSuccess) return make_error("CUDA launch ", kernel, ": ", cudaGetErrorString(e));
  return launch_status(kernel);
}

}  // namespace

Status mask_logits(float* logits, int64_t n_rows, int64_t vocab, const uint64_t* bits, const int64_t* mask_row,
                   cudaStream_t stream) {
  SPW_TRY(check("mask_logits", n_rows, vocab));
  if (n_rows == 0) return {};
  return launched(launch(mask_kernel, dim3(grid_for(vocab, kMaskThreads), unsigned(n_rows)), dim3(kMaskThreads), 0,
                         stream, logits, vocab, bits, mask_row),
                  "mask_kernel");
}

Status top_logprobs(const float* logits, int64_t n_rows, int64_t vocab, const int32_t* top_n, RowLogprobs* out,
                    cudaStream_t stream) {
  SPW_TRY(check("top_logprobs", n_rows, vocab));
  if (n_rows == 0) return {};
  return launched(launch(top_kernel, dim3(unsigned(n_rows)), dim3(kRowThreads), 0, stream, logits, vocab, top_n, out),
                  "top_kernel");
}

Status shift_logits(float* logits, int64_t n_rows, int64_t vocab, const LogitShift* shifts, const int32_t* first,
                    const int32_t* repeat_end, const int32_t* split, float* saved, cudaStream_t stream) {
  SPW_TRY(check("shift_logits", n_rows, vocab));
  if (n_rows == 0) return {};
  return launched(launch(shift_kernel, dim3(unsigned(n_rows)), dim3(256), 0, stream, logits, vocab, shifts, first,
                         repeat_end, split, saved),
                  "shift_kernel");
}

Status chosen_logprobs(const float* logits, int64_t n_rows, int64_t vocab, const int32_t* chosen,
                       const int32_t* top_n, const LogitShift* shifts, const int32_t* first, const float* saved,
                       RowLogprobs* out, cudaStream_t stream) {
  SPW_TRY(check("chosen_logprobs", n_rows, vocab));
  if (n_rows == 0) return {};
  return launched(launch(chosen_kernel, dim3(unsigned(n_rows)), dim3(1), 0, stream, logits, vocab, chosen, top_n,
                         shifts, first, saved, out),
                  "chosen_kernel");
}

}  // namespace spw::cuda
