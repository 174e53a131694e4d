// Sparse attention with sinks over compact paged KV (contract in sparse_attn.h).
//
// One block of 128 threads per (head, query). Pass 1: each warp takes rows j = warp, warp + 4, ...,
// its lanes stride over the channels (q in shared memory) and reduce the dot product with shuffles;
// the logits stay in shared memory. The exact max over them is a block reduction. Pass 2: p_j is
// computed once into shared memory; then every thread owns channels tid, tid + 128, ... and walks
// the rows in order, accumulating p̃_j·c_j and Σ p_j exactly in the reference's order.
// Rows are dequantized on the fly in both passes (read twice; the second read mostly hits L2).
// Tests: tests/gpu/test_cuda_attn_sparse.cpp.
#include "cuda/attn/sparse_attn.h"

#include <cmath>

#include "cuda/attn/kv_device.cuh"

namespace spw::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChannelsPerThread = 1024 / kThreads;

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

// Where row j of query i lives: an f32 row of chunk_kv, a stored row of `fmt`, or nothing (sel −1).
struct RowRef {
  const float* f32 = nullptr;
  const uint8_t* packed = nullptr;
  KvRowFormat fmt;
  __device__ bool valid() const { return f32 != nullptr || packed != nullptr; }
  __device__ float channel(int c) const { return f32 ? f32[c] : kvdev::load_channel(fmt, packed, c); }
};

struct QueryRows {
  int32_t seq;
  int64_t lo, n_win, chunk_pos0;
  int32_t chunk_row0;
  const int32_t* sel;
  size_t ring_nbytes, comp_nbytes;
};

__device__ RowRef row_ref(const SparseAttnArgs& a, const QueryRows& qr, int64_t j) {
  RowRef r;
  if (j < qr.n_win) {
    const int64_t pos = qr.lo + j;
    if (pos >= qr.chunk_pos0) {
      r.f32 = a.chunk_kv + (int64_t(qr.chunk_row0) + (pos - qr.chunk_pos0)) * a.d_head;
    } else {
      r.packed = kvdev::row_ptr(a.ring, qr.ring_nbytes, qr.seq, pos % a.window);
      r.fmt = a.ring.fmt;
    }
    return r;
  }
  const int32_t g = qr.sel[j - qr.n_win];
  if (g >= 0) {
    r.packed = kvdev::row_ptr(a.comp, qr.comp_nbytes, qr.seq, g);
    r.fmt = a.comp.fmt;
  }
  return r;
}

__global__ void __launch_bounds__(kThreads) sparse_attn_kernel(SparseAttnArgs a, size_t ring_nbytes, size_t comp_nbytes) {
  extern __shared__ float smem[];
  const int h = blockIdx.x, i = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int d = a.d_head;
  float* q_s = smem;                // [d]
  float* red = smem + d;            // [kWarps]
  float* logits = red + kWarps;     // [n_rows]

  QueryRows qr;
  qr.seq = a.q_seq[i];
  const int64_t t = a.q_pos[i];
  qr.lo = t - a.window + 1 > 0 ? t - a.window + 1 : 0;
  qr.n_win = t - qr.lo + 1;
  qr.chunk_pos0 = a.chunk_pos0[i];
  qr.chunk_row0 = a.chunk_row0[i];
  qr.sel = a.sel ? a.sel + int64_t(i) * a.sel_stride : nullptr;
  qr.ring_nbytes = ring_nbytes;
  qr.comp_nbytes = comp_nbytes;
  const int64_t n_rows = qr.n_win + (a.sel ? a.sel_stride : 0);

  const float* qh = a.q + (int64_t(i) * a.n_heads + h) * d;
  for (int c = tid; c < d; c += kThreads) q_s[c] = qh[c];
  __syncthreads();

  // Pass 1: logits (−∞ for skipped rows) and their max.
  float m = -INFINITY;
  for (int64_t j = warp; j < n_rows; j += kWarps) {
    const RowRef r = row_ref(a, qr, j);
    float acc = 0.f;
    if (r.valid())
      for (int c = lane; c < d; c += 32) acc += q_s[c] * r.channel(c);
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    const float l = r.valid() ? acc * a.scale : -INFINITY;
    if (lane == 0) logits[j] = l;
    m = fmaxf(m, l);
  }
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);

  float* out = a.out + (int64_t(i) * a.n_heads + h) * d;
  if (m == -INFINITY) {  // no rows: only the sink, the output is zero
    for (int c = tid; c < d; c += kThreads) out[c] = 0.f;
    return;
  }
  for (int64_t j = tid; j < n_rows; j += kThreads) logits[j] = expf(logits[j] - m);  // p_j (0 when skipped)
  __syncthreads();

  // Pass 2: o = Σ p̃_j·c_j / (Σ p_j + exp(sink − m)), in row order.
  float acc[kMaxChannelsPerThread];
  for (int k = 0; k < kMaxChannelsPerThread; ++k) acc[k] = 0.f;
  float denom = 0.f;
  for (int64_t j = 0; j < n_rows; ++j) {
    const RowRef r = row_ref(a, qr, j);
    if (!r.valid()) continue;
    const float p = logits[j];
    denom += p;
    const float pv = a.round_p_bf16 ? kvdev::bf16_round(p) : p;
    for (int k = 0; k < kMaxChannelsPerThread; ++k) {
      const int c = tid + k * kThreads;
      if (c < d) acc[k] += pv * r.channel(c);
    }
  }
  denom += expf(a.sink[h] - m);
  for (int k = 0; k < kMaxChannelsPerThread; ++k) {
    const int c = tid + k * kThreads;
    if (c < d) out[c] = acc[k] / denom;
  }
}

}  // namespace

Status sparse_attn_cuda(const SparseAttnArgs& a, cudaStream_t stream) {
  if (a.n_q <= 0) return {};
  if (a.d_head <= 0 || a.d_head > kThreads * kMaxChannelsPerThread || a.n_heads <= 0 || a.window <= 0)
    return make_error("sparse_attn_cuda: unsupported shape d_head=", a.d_head, " n_heads=", a.n_heads,
                      " window=", a.window);
  if (kv_row_channels(a.ring.fmt) != a.d_head || !kv_format_supported(a.ring.fmt))
    return make_error("sparse_attn_cuda: ring row format does not match d_head=", a.d_head);
  if (a.sel && (kv_row_channels(a.comp.fmt) != a.d_head || !kv_format_supported(a.comp.fmt)))
    return make_error("sparse_attn_cuda: compressed row format does not match d_head=", a.d_head);
  const int64_t max_rows = int64_t(a.window) + (a.sel ? a.sel_stride : 0);
  if (max_rows > kSparseAttnMaxRows)
    return make_error("sparse_attn_cuda: window + sel_stride = ", max_rows, " rows, limit ", kSparseAttnMaxRows);
  const size_t smem = sizeof(float) * (size_t(a.d_head) + kWarps + size_t(max_rows));
  const dim3 grid(unsigned(a.n_heads), unsigned(a.n_q));
  sparse_attn_kernel<<<grid, kThreads, smem, stream>>>(a, kv_row_nbytes(a.ring.fmt),
                                                       a.sel ? kv_row_nbytes(a.comp.fmt) : 0);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch sparse_attn_kernel", e);
  return {};
}

}  // namespace spw::cuda
