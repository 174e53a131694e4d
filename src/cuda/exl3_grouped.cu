// Grouped EXL3 GEMMs over the experts of one MoE layer (contract: exl3_grouped.h). The block body is
// the one-tensor kBulk path's (exl3_bulk.cuh); this file adds the item lookup, the grouped input
// rotation and the launch plan.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/exl3_bulk.cuh"
#include "cuda/exl3_device.cuh"
#include "cuda/exl3_grouped.h"

namespace spw {
namespace {

using namespace exl3dev;

// k-blocks (of 128) per slice: a 64-row block keeps 2 per SM with 512 k (ring + 66 KB of x), a 96-row
// block with 384 k (ring + 75 KB), the smaller row classes take 1024 k per block and fewer slices to meet.
constexpr int kSliceBlocks64 = 4, kSliceBlocks96 = 3, kSliceBlocksSmall = 8;
// Token groups of each row class (≤ 8, ≤ 16, ≤ 64, ≤ 96 rows).
constexpr int kClassGroups[kExl3GroupClasses] = {1, 2, 8, 12};
constexpr unsigned kMaxGridZ = 65535;

int64_t proj_k(const Exl3CudaMoeLayer& l, int proj) { return proj == 2 ? l.f : l.d; }
int64_t proj_n(const Exl3CudaMoeLayer& l, int proj) { return proj == 2 ? l.d : l.f; }

// Block (column group, k slice, item): the item's rows of its expert's projection.
template <int K, int CB, int G>
__global__ void __launch_bounds__(kBulkThreads) exl3_grouped_kernel(const Exl3CudaExpert* __restrict__ experts, int proj,
                                                                    const Exl3GroupItem* __restrict__ items,
                                                                    const __half* __restrict__ xr, float* y,
                                                                    const int32_t* __restrict__ y_rows,
                                                                    uint32_t* counters, int k, int n, int kpb,
                                                                    bool round_out,
                                                                    const int32_t* __restrict__ pair_experts) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Exl3GroupItem it;
  if (pair_experts) {  // one item per (token, slot) pair: its one row, in pair order
    it.expert = pair_experts[blockIdx.z], it.row0 = blockIdx.z, it.m = 1;
    if (it.expert < 0) return;  // a slot held elsewhere: every block of the item leaves, its row stays zero
  } else {
    it = items[blockIdx.z];
  }
  const Exl3CudaExpert& e = experts[it.expert];
  BulkBlock b;
  b.trellis = e.trellis[proj], b.svh = e.svh[proj], b.bias = e.bias[proj];
  b.x = xr + static_cast<size_t>(it.row0) * k;
  b.y = y, b.acc = y, b.clean_acc = false;  // partial sums meet in y itself, zeroed by the call
  b.row_map = y_rows, b.row0 = it.row0;
  b.counter = counters + static_cast<size_t>(blockIdx.z) * gridDim.x + blockIdx.x;
  b.k = k, b.n = n, b.m = it.m, b.kpb = kpb, b.group = blockIdx.x, b.split = blockIdx.y, b.n_splits = gridDim.y;
  b.round_out = round_out;
  bulk_gemm_block<K, CB, G, true>(b, smem_raw);
}

// One warp per (row, 128-block): xr[r] = fp16(had128(x[src(r)] ∘ suh of row r's expert)); rows of no
// expert (< 0) are left as they are (nothing reads them).
__global__ void __launch_bounds__(kThreads) exl3_rotate_grouped_kernel(const Exl3CudaExpert* __restrict__ experts,
                                                                       int proj, const float* __restrict__ x,
                                                                       const int32_t* __restrict__ x_rows, int x_div,
                                                                       const int32_t* __restrict__ row_expert,
                                                                       __half* __restrict__ xr, int k, int64_t rows) {
  int64_t r;
  int blk;
  if (!rotation_job<kThreads>(rows, k, r, blk)) return;
  const int32_t e = row_expert[r];
  if (e < 0) return;
  const int64_t src = x_rows ? x_rows[r] : r / x_div;
  const uint16_t* suh = experts[e].suh[proj];
  rotate_block(x + src * k + blk * 128, suh + blk * 128, xr + r * k + blk * 128, threadIdx.x & 31);
}

using GroupedKernel = void (*)(const Exl3CudaExpert*, int, const Exl3GroupItem*, const __half*, float*,
                               const int32_t*, uint32_t*, int, int, int, bool, const int32_t*);

template <int K, int CB>
GroupedKernel pick_g(int G) {
  return G == 12  ? exl3_grouped_kernel<K, CB, 12>
         : G == 8 ? exl3_grouped_kernel<K, CB, 8>
         : G == 2 ? exl3_grouped_kernel<K, CB, 2>
                  : exl3_grouped_kernel<K, CB, 1>;
}
template <int K>
GroupedKernel pick_cb(int cb, int G) {
  return cb == 0 ? pick_g<K, 0>(G) : cb == 1 ? pick_g<K, 1>(G) : pick_g<K, 2>(G);
}
GroupedKernel pick(int K, int cb, int G) {
  switch (K) {
    case 2: return pick_cb<2>(cb, G);
    case 3: return pick_cb<3>(cb, G);
    case 4: return pick_cb<4>(cb, G);
    case 5: return pick_cb<5>(cb, G);
    case 6: return pick_cb<6>(cb, G);
  }
  return nullptr;
}

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

Status check_layer(const Exl3CudaMoeLayer& layer, int proj, const char* who) {
  if (!exl3_cuda_moe_supports(layer))
    return make_error(who, ": unsupported layer (K=", layer.bits.k_x2 / 2.0, " d=", layer.d, " f=", layer.f,
                      "); supported: integer K 2..6, d and f multiples of 128");
  if (proj < 0 || proj > 2) return make_error(who, ": projection ", proj, " (0 = w1, 1 = w3, 2 = w2)");
  return {};
}

}  // namespace

Exl3GroupPlan exl3_group_plan(const std::vector<int32_t>& first, int fixed_class) {
  Exl3GroupPlan plan;
  std::vector<Exl3GroupItem> by_class[kExl3GroupClasses];
  const bool fixed = fixed_class >= 0 && fixed_class < kExl3GroupClasses;
  const int32_t max_rows = fixed ? kExl3ClassRows[fixed_class] : kExl3MaxItemRows;
  for (size_t e = 0; e + 1 < first.size(); ++e) {
    const int32_t m = first[e + 1] - first[e];
    if (m <= 0) continue;
    const int32_t pieces = (m + max_rows - 1) / max_rows, base = m / pieces, extra = m % pieces;
    int32_t row = first[e];
    for (int32_t p = 0; p < pieces; ++p) {
      Exl3GroupItem it;
      it.expert = static_cast<int32_t>(e), it.row0 = row, it.m = base + (p < extra ? 1 : 0);
      row += it.m;
      by_class[fixed ? fixed_class : it.m <= 8 ? 0 : it.m <= 16 ? 1 : it.m <= 64 ? 2 : 3].push_back(it);
    }
  }
  for (int c = 0; c < kExl3GroupClasses; ++c) {
    plan.n[c] = static_cast<int>(by_class[c].size());
    plan.items.insert(plan.items.end(), by_class[c].begin(), by_class[c].end());
  }
  return plan;
}

Status exl3_rotate_grouped_cuda(const Exl3CudaMoeLayer& layer, int proj, const float* x, const int32_t* x_rows,
                                int x_div, const int32_t* row_expert, int64_t rows, void* xr, void* stream) {
  SPW_TRY(check_layer(layer, proj, "exl3_rotate_grouped_cuda"));
  if (x_div < 1) return make_error("exl3_rotate_grouped_cuda: x_div=", x_div);
  if (rows < 1) return {};
  const int64_t k = proj_k(layer, proj);
  const int64_t jobs = rows * (k / 128), per_block = kThreads / 32;
  exl3_rotate_grouped_kernel<<<static_cast<unsigned>((jobs + per_block - 1) / per_block), kThreads, 0,
                               static_cast<cudaStream_t>(stream)>>>(layer.experts, proj, x, x_rows, x_div, row_expert,
                                                                    static_cast<__half*>(xr), static_cast<int>(k), rows);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_rotate_grouped_kernel", e);
  return {};
}

namespace {

// One launch per 65535 items of row class G (1, 2 or 8 token groups) over the projection's column groups and
// k slices; items (or pair_experts) and counters start at this class's first item.
Status launch_class(const Exl3CudaMoeLayer& layer, int proj, int G, int64_t n_items, const Exl3GroupItem* items,
                    const int32_t* pair_experts, const void* xr, float* y, const int32_t* y_rows, uint32_t* counters,
                    bool round_out, cudaStream_t s) {
  const int64_t k = proj_k(layer, proj), n = proj_n(layer, proj), n_groups = n / 128, k_blocks = k / 128;
  const int64_t max_per = G == 12 ? kSliceBlocks96 : G == 8 ? kSliceBlocks64 : kSliceBlocksSmall;
  int64_t splits = (k_blocks + max_per - 1) / max_per;
  const int64_t per = (k_blocks + splits - 1) / splits;
  splits = (k_blocks + per - 1) / per;
  const int kpb = static_cast<int>(per * 128);
  GroupedKernel fn = pick(layer.bits.ka(), static_cast<int>(layer.codebook), G);
  const size_t smem = static_cast<size_t>(bulk_ring_bytes(layer.bits.ka())) + sizeof(__half) * 8 * G * (kpb + 8);
  if (cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem));
      e != cudaSuccess)
    return cuda_error("set shared memory", e);
  for (int64_t done = 0; done < n_items; done += kMaxGridZ) {
    const int64_t z = std::min<int64_t>(kMaxGridZ, n_items - done);
    fn<<<dim3(static_cast<unsigned>(n_groups), static_cast<unsigned>(splits), static_cast<unsigned>(z)), kBulkThreads,
         smem, s>>>(layer.experts, proj, items ? items + done : nullptr, static_cast<const __half*>(xr), y, y_rows,
                    counters + done * n_groups, static_cast<int>(k), static_cast<int>(n), kpb, round_out,
                    pair_experts ? pair_experts + done : nullptr);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch exl3_grouped_kernel", e);
  }
  return {};
}

}  // namespace

Status exl3_grouped_gemm_cuda(const Exl3CudaMoeLayer& layer, int proj, const Exl3GroupPlan& plan,
                              const Exl3GroupItem* items, const void* xr, float* y, const int32_t* y_rows,
                              int64_t y_rows_total, uint32_t* counters, bool round_out_bf16, void* stream) {
  SPW_TRY(check_layer(layer, proj, "exl3_grouped_gemm_cuda"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t n = proj_n(layer, proj), n_groups = n / 128;
  const int64_t n_items = static_cast<int64_t>(plan.items.size());
  if (cudaError_t e = cudaMemsetAsync(y, 0, sizeof(float) * y_rows_total * n, s); e != cudaSuccess)
    return cuda_error("memset grouped output", e);
  if (n_items == 0) return {};
  if (cudaError_t e = cudaMemsetAsync(counters, 0, sizeof(uint32_t) * n_items * n_groups, s); e != cudaSuccess)
    return cuda_error("memset grouped counters", e);
  int64_t first_item = 0;
  for (int c = 0; c < kExl3GroupClasses; ++c) {
    if (plan.n[c] > 0)
      SPW_TRY(launch_class(layer, proj, kClassGroups[c], plan.n[c], items + first_item, nullptr, xr, y,
                           y_rows, counters + first_item * n_groups, round_out_bf16, s));
    first_item += plan.n[c];
  }
  return {};
}

Status exl3_grouped_pairs_gemm_cuda(const Exl3CudaMoeLayer& layer, int proj, const int32_t* pair_experts,
                                    int64_t n_pairs, const void* xr, float* y, uint32_t* counters, bool round_out_bf16,
                                    void* stream) {
  SPW_TRY(check_layer(layer, proj, "exl3_grouped_pairs_gemm_cuda"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t n = proj_n(layer, proj), n_groups = n / 128;
  if (n_pairs < 1) return {};
  if (cudaError_t e = cudaMemsetAsync(y, 0, sizeof(float) * n_pairs * n, s); e != cudaSuccess)
    return cuda_error("memset grouped output", e);
  if (cudaError_t e = cudaMemsetAsync(counters, 0, sizeof(uint32_t) * n_pairs * n_groups, s); e != cudaSuccess)
    return cuda_error("memset grouped counters", e);
  return launch_class(layer, proj, 1, n_pairs, nullptr, pair_experts, xr, y, nullptr, counters, round_out_bf16, s);
}

}  // namespace spw
