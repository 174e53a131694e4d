#include "engine/moe_dispatch.h"

#include "cuda/dense/dense_device.cuh"
#include "engine/device_weights.h"
#include "cuda/launch.h"

namespace spw::engine {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// Rows per warp and k-rounds: a warp takes kRows consecutive output rows of one pair and walks k in rounds of
// kRound chunks per lane, issuing every weight load of a round (kRows · kRound chunks) before using any, so each
// lane keeps several loads in flight. The first version (one row per warp, one chunk in flight per lane) took
// 105 µs per call for the 27 MB of a V4 decode token's six MXFP4 experts (a kernel trace): ~6 % of HBM.
// Each row's sum is still lane l's chunks l, l + 32, ... in k order, then the xor tree: the same result.
constexpr int kRows = 2, kRound = 4;

template <DenseFormat F>
__global__ void __launch_bounds__(kThreads)
    grouped_gemv_kernel(const ExpertPtrs* table, int which, DeviceLinear shape, const float* x, int x_div,
                        const int32_t* experts, int64_t n_pairs, float* y, bool round_out) {
  cuda::pdl_enter();
  const int64_t job = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int n_out = shape.n_out, n_in = shape.n_in;
  const int row_groups = (n_out + kRows - 1) / kRows;
  if (job >= n_pairs * row_groups) return;
  const int64_t p = job / row_groups;
  const int o0 = int(job % row_groups) * kRows;
  const int e = experts[p];
  if (e < 0) return;
  const void* w = table[e].w[which];
  const uint8_t* scale = table[e].scale[which];
  const float* xr = x + (p / x_div) * n_in;
  densedev::RowSource<F> src[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) src[r] = densedev::row_source<F>(w, scale, o0 + r, n_in, shape.weight_block);
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.f;
  for (int k0 = lane * 16; k0 < n_in; k0 += kRound * 32 * 16) {
    densedev::Chunk<F> c[kRound][kRows];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int k = k0 + u * 32 * 16;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        c[u][r] = densedev::Chunk<F>{};
        if (k < n_in && o0 + r < n_out) c[u][r] = densedev::load_chunk<F>(src[r], k);
      }
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int k = k0 + u * 32 * 16;
      if (k >= n_in) break;  // later chunks of the round are past the end too
      float xv[16];
      const float4* x4 = reinterpret_cast<const float4*>(xr + k);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 t = __ldg(x4 + q);
        xv[4 * q] = t.x, xv[4 * q + 1] = t.y, xv[4 * q + 2] = t.z, xv[4 * q + 3] = t.w;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float v[16];
        densedev::dequant_chunk<F>(c[u][r], v);
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[r] = __fmaf_rn(xv[j], v[j], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float a = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, off));
    if (lane == 0 && o0 + r < n_out) y[p * n_out + o0 + r] = round_out ? densedev::round_bf16_dev(a) : a;
  }
}

// acc[t][ch] = Σ over the token's slots in ascending expert id (ties by slot; −1 slots skipped) of ys[t][slot][ch],
// added with __fadd_rn from 0 in that order (the per-expert scatter-add order). A block per token: the slots'
// order is found once (a thread per slot counts the slots before it), then every thread adds its channels, four
// at a time, with all the slots' loads in flight before the first addition. The earlier kernel (a thread per
// channel finding each next slot between dependent loads) took 774 µs per 4096-token V4.1 chunk on the H200, and
// stopped at the first −1 slot (no engine caller passes one yet).
constexpr int kCombineMaxSlots = 16;  // moe_combine_cuda checks top_k
constexpr int kCombineThreads = 256;

__global__ void __launch_bounds__(kCombineThreads) moe_combine_kernel(const float* ys, const int32_t* experts, int top_k,
                                                                      int64_t d, float* acc) {
  cuda::pdl_enter();
  __shared__ int order[kCombineMaxSlots];
  __shared__ int n_used;
  const int64_t t = blockIdx.x;
  const int32_t* ex = experts + t * top_k;
  if (threadIdx.x == 0) n_used = 0;
  __syncthreads();
  if (int(threadIdx.x) < top_k) {
    const int j = threadIdx.x, e = ex[j];
    if (e >= 0) {
      int rank = 0;
      for (int i = 0; i < top_k; ++i) rank += ex[i] >= 0 && (ex[i] < e || (ex[i] == e && i < j));
      order[rank] = j;
      atomicAdd(&n_used, 1);
    }
  }
  __syncthreads();
  const int n = n_used;
  const float* row[kCombineMaxSlots];
#pragma unroll
  for (int k = 0; k < kCombineMaxSlots; ++k) row[k] = k < n ? ys + (t * top_k + order[k]) * d : nullptr;
  float* out = acc + t * d;
  auto add_slots = [&](const float* v) {
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kCombineMaxSlots; ++k)
      if (k < n) sum = __fadd_rn(sum, v[k]);
    return sum;
  };
  if (d % 4 == 0) {
    for (int64_t c = 4 * int64_t(threadIdx.x); c < d; c += 4 * kCombineThreads) {
      float4 v[kCombineMaxSlots];
#pragma unroll
      for (int k = 0; k < kCombineMaxSlots; ++k)
        v[k] = k < n ? *reinterpret_cast<const float4*>(row[k] + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      float x[kCombineMaxSlots], y[kCombineMaxSlots], z[kCombineMaxSlots], w[kCombineMaxSlots];
#pragma unroll
      for (int k = 0; k < kCombineMaxSlots; ++k) x[k] = v[k].x, y[k] = v[k].y, z[k] = v[k].z, w[k] = v[k].w;
      *reinterpret_cast<float4*>(out + c) = make_float4(add_slots(x), add_slots(y), add_slots(z), add_slots(w));
    }
  } else {
    for (int64_t c = threadIdx.x; c < d; c += kCombineThreads) {
      float v[kCombineMaxSlots];
#pragma unroll
      for (int k = 0; k < kCombineMaxSlots; ++k) v[k] = k < n ? row[k][c] : 0.f;
      out[c] = add_slots(v);
    }
  }
}

Status launched(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return make_error(what, ": ", cudaGetErrorString(e));
}

}  // namespace

Status expert_table_build(const std::vector<DeviceExpert>& experts, ExpertTable& t) {
  t.ptrs.reset();
  if (experts.empty() || experts[0].is_exl3()) return {};
  const DeviceLinear* first[3] = {&experts[0].w1, &experts[0].w2, &experts[0].w3};
  std::vector<ExpertPtrs> host(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const DeviceLinear* l[3] = {&experts[e].w1, &experts[e].w2, &experts[e].w3};
    for (int q = 0; q < 3; ++q) {
      const DeviceLinear& a = *l[q];
      const DeviceLinear& b = *first[q];
      if (experts[e].is_exl3() || a.format != b.format || a.n_out != b.n_out || a.n_in != b.n_in ||
          a.weight_block != b.weight_block || a.act_block != b.act_block || a.f32_product != b.f32_product ||
          a.n_in % 32 != 0)
        return {};
      host[e].w[q] = a.w;
      host[e].scale[q] = a.scale;
    }
  }
  // Gate and up read the same quantized input; down reads their width.
  if (first[0]->act_block != first[2]->act_block || first[0]->n_out != first[2]->n_out ||
      first[0]->n_in != first[2]->n_in || first[1]->n_in != first[0]->n_out)
    return {};
  for (int q = 0; q < 3; ++q) t.shape[q] = *first[q];
  return upload(host, t.ptrs);
}

Status exl3_moe_table_build(const std::vector<DeviceExpert>& experts, float swiglu_limit, Exl3MoeTable& t) {
  t.experts.reset();
  if (experts.empty() || !experts[0].is_exl3()) return {};
  const Exl3CudaTensor& r = experts[0].exl3[0];
  std::vector<Exl3CudaExpert> host(experts.size());
  constexpr int kFrom[3] = {0, 2, 1};  // the fused kernel's order: w1 (gate), w3 (up), w2 (down)
  for (size_t e = 0; e < experts.size(); ++e) {
    if (!experts[e].is_exl3()) return {};
    for (int q = 0; q < 3; ++q) {
      const Exl3CudaTensor& x = experts[e].exl3[kFrom[q]];
      const Exl3CudaTensor& x0 = experts[0].exl3[kFrom[q]];
      if (x.bits.k_x2 != r.bits.k_x2 || x.codebook != r.codebook || x.k != x0.k || x.n != x0.n) return {};
      host[e].trellis[q] = x.trellis, host[e].suh[q] = x.suh, host[e].svh[q] = x.svh, host[e].bias[q] = x.bias;
    }
  }
  Exl3CudaMoeLayer l;
  l.n_experts = int(experts.size());
  l.d = experts[0].exl3[1].n, l.f = experts[0].exl3[0].n;
  l.bits = r.bits, l.codebook = r.codebook, l.swiglu_limit = swiglu_limit, l.reference_rounding = true;
  if (experts[0].exl3[0].k != l.d || experts[0].exl3[1].k != l.f) return {};
  SPW_TRY(upload(host, t.experts));
  l.experts = t.experts.get();
  if (!exl3_cuda_moe_supports(l)) {
    t.experts.reset();
    return {};
  }
  t.layer = l;
  return {};
}

Status grouped_expert_gemv_cuda(const ExpertTable& t, int which, const float* x, int x_div, const int32_t* experts,
                                int64_t n_pairs, float* y, bool round_out, cudaStream_t stream) {
  if (!t.ready()) return make_error("grouped_expert_gemv_cuda: no expert table (experts not uniform dense linears)");
  const DeviceLinear& s = t.shape[which];
  const int64_t warps = n_pairs * ((s.n_out + kRows - 1) / kRows);
  if (warps == 0) return {};
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  const bool rb = round_out && !s.f32_product;
  switch (s.format) {
    case DenseFormat::kFp8:
      cuda::launch(grouped_gemv_kernel<DenseFormat::kFp8>, blocks, kThreads, 0, stream, t.ptrs.get(), which, s, x, x_div,
                                                                              experts, n_pairs, y, rb);
      break;
    case DenseFormat::kFp4:
      cuda::launch(grouped_gemv_kernel<DenseFormat::kFp4>, blocks, kThreads, 0, stream, t.ptrs.get(), which, s, x, x_div,
                                                                              experts, n_pairs, y, rb);
      break;
    case DenseFormat::kBf16:
      cuda::launch(grouped_gemv_kernel<DenseFormat::kBf16>, blocks, kThreads, 0, stream, t.ptrs.get(), which, s, x, x_div,
                                                                               experts, n_pairs, y, rb);
      break;
    case DenseFormat::kF32:
      cuda::launch(grouped_gemv_kernel<DenseFormat::kF32>, blocks, kThreads, 0, stream, t.ptrs.get(), which, s, x, x_div,
                                                                              experts, n_pairs, y, rb);
      break;
  }
  return launched("grouped_expert_gemv_cuda");
}

Status moe_combine_cuda(const float* ys, const int32_t* experts, int64_t n_tokens, int top_k, int64_t d, float* acc,
                        cudaStream_t stream) {
  if (n_tokens * d == 0) return {};
  if (top_k > kCombineMaxSlots) return make_error("moe_combine_cuda: top_k ", top_k, " above ", kCombineMaxSlots);
  if (n_tokens > INT32_MAX) return make_error("moe_combine_cuda: ", n_tokens, " tokens exceed the grid");
  cuda::launch(moe_combine_kernel, unsigned(n_tokens), kCombineThreads, 0, stream, ys, experts, top_k, d, acc);
  return launched("moe_combine_cuda");
}

}  // namespace spw::engine
