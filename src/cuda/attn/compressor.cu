// Compressor gated pooling on the GPU (contract in compressor.h).
//
// Two launches per push. Emit: one thread per (entry, output channel) gathers the group's (score, kv)
// terms — from this chunk's rows where the position is ≥ pos0, else from the state as it was before
// the chunk (the current group's slots, or for overlap the previous group) — and pools them exactly
// as compressor.cpp does: the same term order, fmax for the max, then Σ e and Σ e·v with products and
// sums rounded separately (__fmul_rn/__fadd_rn, no FMA, like the CPU build). Update: one thread per
// state column rewrites each slot with the latest position that maps to it, and for overlap the
// previous group with the last group completed in the chunk; it runs after emit (stream order), so
// emit always sees the old state.
// Tests: tests/gpu/test_cuda_attn_compressor.cpp.
#include "cuda/attn/compressor.h"

#include <cmath>
#include "cuda/launch.h"

namespace spw::cuda {

namespace {

constexpr int kThreads = 128;

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

struct ItemView {
  int64_t pos0, p1;
  int32_t in_row0;
  size_t state0;  // offset of this slot's [ratio, width] block
};

__device__ ItemView item_view(const CompressorShape& sh, const CompressorChunks& ch, int b) {
  ItemView v;
  v.pos0 = ch.pos0[b];
  v.p1 = v.pos0 + ch.n_tokens[b];
  v.in_row0 = ch.in_row0[b];
  v.state0 = size_t(ch.slot[b]) * size_t(sh.ratio) * size_t(sh.width);
  return v;
}

// (score, kv) of position pos, column col, as the CPU state would hold it when the group completes.
__device__ void term(const CompressorShape& sh, const CompressorStates& st, const float* kv, const float* score,
                     const float* ape, const ItemView& it, int64_t pos, int col, float& s, float& v) {
  const int slot = int(pos % sh.ratio);
  if (pos >= it.pos0) {
    const int64_t row = int64_t(it.in_row0) + (pos - it.pos0);
    s = score[row * sh.width + col];
    if (ape) s = __fadd_rn(s, ape[size_t(slot) * sh.width + col]);
    v = kv[row * sh.width + col];
  } else if (pos / sh.ratio == it.pos0 / sh.ratio) {  // the group being filled at the chunk start
    s = st.score[it.state0 + size_t(slot) * sh.width + col];
    v = st.kv[it.state0 + size_t(slot) * sh.width + col];
  } else {  // the previous complete group (overlap only)
    s = st.prev_score[it.state0 + size_t(slot) * sh.width + col];
    v = st.prev_kv[it.state0 + size_t(slot) * sh.width + col];
  }
}

__global__ void compressor_emit_kernel(CompressorShape sh, CompressorStates st, const float* __restrict__ kv,
                                       const float* __restrict__ score, const float* __restrict__ ape,
                                       CompressorChunks chunks, float* __restrict__ entries) {
  pdl_enter();
  const int ch = blockIdx.x * kThreads + threadIdx.x, b = blockIdx.y, e = blockIdx.z;
  const int d_out = sh.overlap ? sh.width / 2 : sh.width;
  if (ch >= d_out) return;
  const ItemView it = item_view(sh, chunks, b);
  const int64_t g = it.pos0 / sh.ratio + e;
  if (g >= it.p1 / sh.ratio) return;
  const bool with_prev = sh.overlap && g >= 1;
  const int own_ch = sh.overlap ? d_out + ch : ch;
  float s, v, m = -INFINITY;
  if (with_prev)
    for (int i = 0; i < sh.ratio; ++i) {
      term(sh, st, kv, score, ape, it, (g - 1) * sh.ratio + i, ch, s, v);
      m = fmaxf(m, s);
    }
  for (int i = 0; i < sh.ratio; ++i) {
    term(sh, st, kv, score, ape, it, g * sh.ratio + i, own_ch, s, v);
    m = fmaxf(m, s);
  }
  float sum = 0.f, acc = 0.f;
  if (with_prev)
    for (int i = 0; i < sh.ratio; ++i) {
      term(sh, st, kv, score, ape, it, (g - 1) * sh.ratio + i, ch, s, v);
      const float ex = expf(s - m);
      sum = __fadd_rn(sum, ex);
      acc = __fadd_rn(acc, __fmul_rn(ex, v));
    }
  for (int i = 0; i < sh.ratio; ++i) {
    term(sh, st, kv, score, ape, it, g * sh.ratio + i, own_ch, s, v);
    const float ex = expf(s - m);
    sum = __fadd_rn(sum, ex);
    acc = __fadd_rn(acc, __fmul_rn(ex, v));
  }
  entries[(int64_t(chunks.out_row0[b]) + e) * d_out + ch] = acc / sum;
}

__global__ void compressor_update_kernel(CompressorShape sh, CompressorStates st, const float* __restrict__ kv,
                                         const float* __restrict__ score, const float* __restrict__ ape,
                                         CompressorChunks chunks) {
  pdl_enter();
  const int col = blockIdx.x * kThreads + threadIdx.x, b = blockIdx.y;
  if (col >= sh.width) return;
  const ItemView it = item_view(sh, chunks, b);
  if (it.p1 <= it.pos0) return;
  const int r = sh.ratio;
  const int64_t last_group = it.p1 / r - 1;  // last group completed by the end of the chunk
  const bool new_prev = sh.overlap && it.p1 / r > it.pos0 / r;
  for (int slot = 0; slot < r; ++slot) {
    const size_t at = it.state0 + size_t(slot) * sh.width + col;
    float s, v;
    if (new_prev) {  // prev ← the rows of the last group completed in this chunk (reads the old cur)
      term(sh, st, kv, score, ape, it, last_group * r + slot, col, s, v);
      st.prev_score[at] = s;
      st.prev_kv[at] = v;
    }
    // cur[slot] ← the latest position < p1 with position mod r = slot, if it is in this chunk.
    const int64_t last = it.p1 - 1 - ((it.p1 - 1 - slot) % r + r) % r;
    if (last >= it.pos0) {
      term(sh, st, kv, score, ape, it, last, col, s, v);
      st.score[at] = s;
      st.kv[at] = v;
    }
  }
}

__global__ void compressor_reset_kernel(CompressorShape sh, CompressorStates st, int32_t slot) {
  pdl_enter();
  const size_t n = size_t(sh.ratio) * sh.width;
  const size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const size_t at = size_t(slot) * n + i;
  st.kv[at] = 0.f;
  st.score[at] = -INFINITY;
  if (sh.overlap) {
    st.prev_kv[at] = 0.f;
    st.prev_score[at] = -INFINITY;
  }
}

Status check_shape(const CompressorShape& sh, const CompressorStates& st) {
  if (sh.ratio <= 0 || sh.width <= 0 || (sh.overlap && sh.width % 2 != 0))
    return make_error("compressor: bad shape ratio=", sh.ratio, " width=", sh.width);
  if (!st.kv || !st.score || (sh.overlap && (!st.prev_kv || !st.prev_score)))
    return make_error("compressor: state buffers missing");
  return {};
}

}  // namespace

Status compressor_state_reset_cuda(const CompressorShape& shape, const CompressorStates& st, int32_t slot,
                                   cudaStream_t stream) {
  SPW_TRY(check_shape(shape, st));
  const size_t n = size_t(shape.ratio) * shape.width;
  launch(compressor_reset_kernel, unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream, shape, st, slot);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch compressor_reset_kernel", e);
  return {};
}

Status compressor_push_cuda(const CompressorShape& shape, const CompressorStates& st, const float* kv,
                            const float* score, const float* ape, const CompressorChunks& chunks, int32_t n_items,
                            int32_t max_entries_per_item, float* entries, cudaStream_t stream) {
  SPW_TRY(check_shape(shape, st));
  if (n_items <= 0) return {};
  if (max_entries_per_item > 0) {
    const dim3 grid(unsigned((shape.d_out() + kThreads - 1) / kThreads), unsigned(n_items),
                    unsigned(max_entries_per_item));
    launch(compressor_emit_kernel, grid, kThreads, 0, stream, shape, st, kv, score, ape, chunks, entries);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch compressor_emit_kernel", e);
  }
  const dim3 grid(unsigned((shape.width + kThreads - 1) / kThreads), unsigned(n_items));
  launch(compressor_update_kernel, grid, kThreads, 0, stream, shape, st, kv, score, ape, chunks);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch compressor_update_kernel", e);
  return {};
}

}  // namespace spw::cuda
