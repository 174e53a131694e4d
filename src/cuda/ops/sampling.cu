// argmax and sample (contract in sampling.h).
//   argmax: a cluster of 8 blocks per row, block argmaxes with ties to the lower id, then rank 0 combines.
//   sample: ids 0..vocab-1 and segment offsets into the workspace, a CUB segmented radix sort of
//     (logit, id) pairs in descending order, then one block per row walks its sorted candidates:
//     chunked block scans of p_i in f64 find the top-p cut and the CDF inversion.
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "cuda/launch.h"
#include "cuda/ops/device_numerics.cuh"
#include "cuda/ops/sampling.h"

namespace spw::cuda {
namespace {

constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxSplit = 8;  // blocks (one cluster) per row
constexpr int kSampleThreads = 512;

// A row's argmax over a cluster of kArgmaxSplit blocks: block r of the row's cluster takes elements
// r·blockDim + tid, advancing kArgmaxSplit·blockDim, then rank 0 takes the best of the blocks' winners
// from their shared memory (distributed shared memory). One block per row read a 129K vocabulary at one
// SM's bandwidth: 13.9 µs per decode step on the H200 (bench/results/engine_h200.md).
// better() is a total order, so the winner does not depend on how the row is split or visited.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  pdl_enter();
  namespace cg = cooperative_groups;
  __shared__ float scratch_v[32];
  __shared__ int scratch_i[32];
  __shared__ float win_v;
  __shared__ int win_i;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), row = int(blockIdx.x) / kArgmaxSplit;
  const float* l = logits + int64_t(row) * vocab;
  float bv = -INFINITY;
  int bi = INT32_MAX;
  // Eight independent loads in flight per thread (a plain strided loop is latency-bound: 47 µs for
  // a 129K vocabulary on the H200).
  constexpr int kUnroll = 8;
  const int step = int(blockDim.x) * kArgmaxSplit;
  int i = rank * int(blockDim.x) + int(threadIdx.x);
  for (; int64_t(i) + int64_t(kUnroll - 1) * step < vocab; i += kUnroll * step) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = l[i + u * step];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (dev::better(v[u], i + u * step, bv, bi)) bv = v[u], bi = i + u * step;
  }
  for (; i < vocab; i += step)
    if (dev::better(l[i], i, bv, bi)) bv = l[i], bi = i;
  dev::block_argmax(bv, bi, scratch_v, scratch_i);
  if (threadIdx.x == 0) win_v = bv, win_i = bi;
  cluster.sync();  // every block's winner is written
  if (rank == 0 && threadIdx.x == 0) {
    for (int r = 1; r < kArgmaxSplit; ++r) {
      const float v = *cluster.map_shared_rank(&win_v, r);
      const int k = *cluster.map_shared_rank(&win_i, r);
      if (dev::better(v, k, bv, bi)) bv = v, bi = k;
    }
    out[row] = bi;
  }
  cluster.sync();  // rank 0 has read the others' winners before they exit
}

__global__ void sample_init_kernel(int32_t* ids, int* offsets, int n_seqs, int vocab) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < int64_t(n_seqs) * vocab) ids[i] = int32_t(i % vocab);
  if (i <= n_seqs) offsets[i] = int(i) * vocab;
}

using BlockScan = cub::BlockScan<double, kSampleThreads>;

struct SampleShared {
  typename BlockScan::TempStorage scan;
  double sum_scratch[32];
  int index;
  double prefix;
};

// Reduces v over the block with atomicMin (is_min) or atomicMax into sh.index; every thread gets it.
__device__ int block_extreme(int v, bool is_min, SampleShared& sh) {
  if (threadIdx.x == 0) sh.index = is_min ? INT32_MAX : INT32_MIN;
  __syncthreads();
  if (is_min) atomicMin(&sh.index, v);
  else atomicMax(&sh.index, v);
  __syncthreads();
  const int r = sh.index;
  __syncthreads();
  return r;
}

// p_i of sorted candidate i: the server's exp((l_i − l_0)·(1/T)) in f64.
struct Probs {
  const float* l;
  double top, inv_t;
  __device__ double operator()(int i) const { return exp((double(l[i]) - top) * inv_t); }
};

// The first i < n whose inclusive prefix Σ_{j≤i} p_j reaches the threshold (≥, or > when strict);
// -1 if none. prefix: that prefix, or the total over n when none.
__device__ int scan_first(const Probs& p, int n, double threshold, bool strict, double& prefix, SampleShared& sh) {
  double carry = 0.0;
  for (int base = 0; base < n; base += kSampleThreads) {
    const int i = base + threadIdx.x;
    const double q = i < n ? p(i) : 0.0;
    double incl = 0.0, chunk = 0.0;
    BlockScan(sh.scan).InclusiveSum(q, incl, chunk);
    incl += carry;
    const bool hit = i < n && (strict ? incl > threshold : incl >= threshold);
    if (threadIdx.x == 0) sh.index = INT32_MAX;
    __syncthreads();
    if (hit) atomicMin(&sh.index, i);
    __syncthreads();
    const int found = sh.index;
    if (found != INT32_MAX) {
      if (i == found) sh.prefix = incl;
      __syncthreads();
      prefix = sh.prefix;
      __syncthreads();
      return found;
    }
    carry += chunk;
    __syncthreads();  // sh.index read by all, scan storage free again
  }
  prefix = carry;
  return -1;
}

__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* sorted_logits, const int32_t* sorted_ids, int vocab, const SampleParams* params,
                  const double* u, int32_t* out) {
  pdl_enter();
  __shared__ SampleShared sh;
  const int64_t row = blockIdx.x;
  const float* l = sorted_logits + row * vocab;
  const int32_t* ids = sorted_ids + row * vocab;
  const SampleParams sp = params[row];
  if (sp.temperature <= 0.f) {
    if (threadIdx.x == 0) out[row] = ids[0];
    return;
  }
  const Probs p{l, double(l[0]), 1.0 / sp.temperature};
  int n_keep = (sp.top_k > 0 && sp.top_k < vocab) ? sp.top_k : vocab;

  // Σp over the top-k, and the trailing zero-probability (masked) candidates dropped.
  double part = 0.0;
  int last_nonzero = -1;
  for (int i = threadIdx.x; i < n_keep; i += blockDim.x) {
    const double q = p(i);
    part += q;
    if (q > 0.0) last_nonzero = i;
  }
  double sum = dev::block_sum(part, sh.sum_scratch);
  n_keep = max(block_extreme(last_nonzero, false, sh) + 1, 1);

  if (sp.min_p > 0.f) {
    const double floor_p = sp.min_p * p(0);
    int first_below = n_keep;
    for (int i = 1 + threadIdx.x; i < n_keep; i += blockDim.x)
      if (p(i) < floor_p) first_below = min(first_below, i);
    n_keep = block_extreme(first_below, true, sh);
    part = 0.0;
    for (int i = threadIdx.x; i < n_keep; i += blockDim.x) part += p(i);
    sum = dev::block_sum(part, sh.sum_scratch);
  }
  if (sp.top_p < 1.f) {
    double kept = 0.0;
    const int hit = scan_first(p, n_keep, sp.top_p * sum, false, kept, sh);
    n_keep = hit >= 0 ? hit + 1 : n_keep;
    sum = kept;
  }
  double unused = 0.0;
  const int pick = scan_first(p, n_keep, u[row] * sum, true, unused, sh);
  if (threadIdx.x == 0) out[row] = ids[pick >= 0 ? pick : n_keep - 1];
}

// Workspace: sorted logits, ids in, ids out, offsets, then CUB's temporary storage; 256-byte aligned.
struct Layout {
  size_t keys = 0, ids_in = 0, ids_out = 0, offsets = 0, temp = 0, temp_nbytes = 0, total = 0;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

Result<Layout> layout(int64_t n_seqs, int64_t vocab) {
  if (n_seqs <= 0 || vocab <= 0 || n_seqs * vocab >= INT32_MAX)
    return make_error("sample: ", n_seqs, " rows of ", vocab, " logits (need 1 ≤ n_seqs·vocab < 2^31)");
  const size_t n = size_t(n_seqs * vocab);
  Layout L;
  L.keys = 0;
  L.ids_in = L.keys + align256(n * sizeof(float));
  L.ids_out = L.ids_in + align256(n * sizeof(int32_t));
  L.offsets = L.ids_out + align256(n * sizeof(int32_t));
  L.temp = L.offsets + align256((n_seqs + 1) * sizeof(int));
  const float* no_keys = nullptr;
  const int32_t* no_ids = nullptr;
  const int* no_offsets = nullptr;
  if (cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
          nullptr, L.temp_nbytes, no_keys, static_cast<float*>(nullptr), no_ids, static_cast<int32_t*>(nullptr),
          int(n), int(n_seqs), no_offsets, no_offsets);
      e != cudaSuccess)
    return make_error("sample: CUB workspace query: ", cudaGetErrorString(e));
  L.total = L.temp + align256(L.temp_nbytes);
  return L;
}

}  // namespace

Status argmax(const float* logits, int64_t n_seqs, int64_t vocab, int32_t* out, cudaStream_t stream) {
  if (vocab <= 0 || vocab > INT32_MAX) return make_error("argmax: vocabulary of ", vocab);
  if (n_seqs <= 0) return {};
  if (n_seqs > INT32_MAX / kArgmaxSplit) return make_error("argmax: ", n_seqs, " rows exceed one grid dimension");
  if (cudaError_t e = launch_clustered(argmax_kernel, dim3(unsigned(n_seqs * kArgmaxSplit)), dim3(kArgmaxThreads), 0,
                                      stream, dim3(kArgmaxSplit, 1, 1), logits, vocab, out);
      e != cudaSuccess)
    return make_error("CUDA launch argmax_kernel: ", cudaGetErrorString(e));
  return launch_status("argmax_kernel");
}

Result<size_t> sample_workspace_nbytes(int64_t n_seqs, int64_t vocab) {
  auto L = layout(n_seqs, vocab);
  if (!L.ok()) return L.error();
  return L->total;
}

Status sample(const float* logits, int64_t n_seqs, int64_t vocab, const SampleParams* params, const double* u,
              void* workspace, size_t workspace_nbytes, int32_t* out, cudaStream_t stream) {
  auto L = layout(n_seqs, vocab);
  if (!L.ok()) return L.error();
  if (workspace_nbytes < L->total)
    return make_error("sample: workspace of ", workspace_nbytes, " bytes, need ", L->total);
  char* ws = static_cast<char*>(workspace);
  float* keys = reinterpret_cast<float*>(ws + L->keys);
  int32_t* ids_in = reinterpret_cast<int32_t*>(ws + L->ids_in);
  int32_t* ids_out = reinterpret_cast<int32_t*>(ws + L->ids_out);
  int* offsets = reinterpret_cast<int*>(ws + L->offsets);
  const int n = int(n_seqs * vocab);

  launch(sample_init_kernel, grid_for(n + 1, 256), 256, 0, stream, ids_in, offsets, int(n_seqs), int(vocab));
  SPW_TRY(launch_status("sample_init_kernel"));
  size_t temp_nbytes = L->temp_nbytes;
  if (cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
          ws + L->temp, temp_nbytes, logits, keys, ids_in, ids_out, n, int(n_seqs), offsets, offsets + 1, 0,
          int(sizeof(float) * 8), stream);
      e != cudaSuccess)
    return make_error("sample: CUB segmented sort: ", cudaGetErrorString(e));
  launch(sample_kernel, unsigned(n_seqs), kSampleThreads, 0, stream, keys, ids_out, int(vocab), params, u, out);
  return launch_status("sample_kernel");
}

}  // namespace spw::cuda
