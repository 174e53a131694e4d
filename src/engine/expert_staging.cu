#include "engine/expert_staging.h"

namespace spw::engine {
namespace {

constexpr int kPlanThreads = 256;
constexpr int kCopyThreads = 512;
constexpr int kCopyBlocksPerSlot = 64;

// One block: the step's table (a copy of the layer's) and the slots: slot s gets the s-th distinct expert of the
// pairs with on_host set, up to kStagingSlots; its table entry points at the slot.
__global__ void plan_kernel(const Exl3CudaExpert* layer_table, int n_experts, const int32_t* ids, int64_t n_pairs,
                            const uint8_t* on_host, uint8_t* ring, size_t t0, size_t t1, size_t expert_nbytes,
                            Exl3CudaExpert* table, int32_t* slot_expert) {
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) table[e] = layer_table[e];
  __syncthreads();
  if (threadIdx.x != 0) return;
  int count = 0;
  for (int64_t p = 0; p < n_pairs && count < kStagingSlots; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= n_experts || !on_host[e]) continue;
    bool seen = false;
    for (int s = 0; s < count && !seen; ++s) seen = slot_expert[s] == e;
    if (seen) continue;
    uint8_t* slot = ring + size_t(count) * expert_nbytes;
    table[e].trellis[0] = reinterpret_cast<const uint16_t*>(slot);
    table[e].trellis[1] = reinterpret_cast<const uint16_t*>(slot + t0);
    table[e].trellis[2] = reinterpret_cast<const uint16_t*>(slot + t0 + t1);
    slot_expert[count++] = e;
  }
  slot_expert[kStagingSlots] = count;
}

// Grid (kCopyBlocksPerSlot, kStagingSlots): the blocks of slot s copy its expert's three tensors from the layer's
// (mapped) pointers, 16 bytes a load, four loads in flight per thread.
__global__ void copy_kernel(const Exl3CudaExpert* layer_table, const int32_t* slot_expert, uint8_t* ring, size_t t0,
                            size_t t1, size_t t2, size_t expert_nbytes) {
  const int s = blockIdx.y;
  if (s >= slot_expert[kStagingSlots]) return;
  const Exl3CudaExpert& src = layer_table[slot_expert[s]];
  uint8_t* slot = ring + size_t(s) * expert_nbytes;
  const size_t sizes[3] = {t0, t1, t2}, offs[3] = {0, t0, t0 + t1};
  for (int q = 0; q < 3; ++q) {
    const uint4* from = reinterpret_cast<const uint4*>(src.trellis[q]);
    uint4* to = reinterpret_cast<uint4*>(slot + offs[q]);
    const size_t n = sizes[q] / 16, stride = size_t(gridDim.x) * blockDim.x;
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
      const uint4 a = from[i], b = from[i + stride], c = from[i + 2 * stride], d = from[i + 3 * stride];
      to[i] = a, to[i + stride] = b, to[i + 2 * stride] = c, to[i + 3 * stride] = d;
    }
    for (; i < n; i += stride) to[i] = from[i];
  }
}

size_t tensor_nbytes(const Exl3CudaMoeLayer& l, int64_t k, int64_t n) {
  return size_t(k / 16) * size_t(n / 16) * size_t(l.bits.words_per_tile()) * sizeof(uint16_t);
}

}  // namespace

size_t expert_staging_nbytes(const Exl3CudaMoeLayer& l, int n_experts) {
  return size_t(kStagingSlots) * (2 * tensor_nbytes(l, l.d, l.f) + tensor_nbytes(l, l.f, l.d)) +
         size_t(n_experts) * sizeof(Exl3CudaExpert);
}

Status expert_staging_alloc(ExpertStaging& st, const Exl3CudaMoeLayer& l, int n_experts) {
  st.tensor_nbytes[0] = st.tensor_nbytes[1] = tensor_nbytes(l, l.d, l.f);  // gate, up: d → f
  st.tensor_nbytes[2] = tensor_nbytes(l, l.f, l.d);                        // down: f → d
  st.expert_nbytes = st.tensor_nbytes[0] + st.tensor_nbytes[1] + st.tensor_nbytes[2];
  if (st.tensor_nbytes[0] % 16 || st.tensor_nbytes[2] % 16)
    return make_error("expert_staging_alloc: tensor sizes ", st.tensor_nbytes[0], " / ", st.tensor_nbytes[2],
                      " are not multiples of 16 bytes");
  SPW_TRY(st.ring.alloc(size_t(kStagingSlots) * st.expert_nbytes));
  SPW_TRY(st.table.alloc(size_t(n_experts)));
  SPW_TRY(st.slot_expert.alloc(kStagingSlots + 1));
  return {};
}

Status stage_host_experts_cuda(ExpertStaging& st, const Exl3CudaMoeLayer& layer, const int32_t* ids, int64_t n_pairs,
                               const uint8_t* on_host, Exl3CudaMoeLayer& staged, cudaStream_t stream) {
  if (!st.ready()) return make_error("stage_host_experts_cuda: no staging ring");
  if (int64_t(st.table.size()) < layer.n_experts) return make_error("stage_host_experts_cuda: table too small");
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(layer.experts, layer.n_experts, ids, n_pairs, on_host, st.ring.get(),
                                              st.tensor_nbytes[0], st.tensor_nbytes[1], st.expert_nbytes,
                                              st.table.get(), st.slot_expert.get());
  copy_kernel<<<dim3(kCopyBlocksPerSlot, kStagingSlots), kCopyThreads, 0, stream>>>(
      layer.experts, st.slot_expert.get(), st.ring.get(), st.tensor_nbytes[0], st.tensor_nbytes[1],
      st.tensor_nbytes[2], st.expert_nbytes);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return make_error("stage_host_experts_cuda: ", cudaGetErrorString(e));
  staged = layer;
  staged.experts = st.table.get();
  return {};
}

}  // namespace spw::engine
