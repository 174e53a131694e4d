// Compact paged KV rows: formats, the page allocator, write (quantize + store) and read kernels.
// Contract and byte layout in kv_pages.h; device format helpers in kv_device.cuh.
// Tests: tests/gpu/test_cuda_attn_kv.cpp.
#include "cuda/attn/kv_pages.h"

#include <algorithm>

#include "cuda/attn/kv_device.cuh"
#include "cuda/launch.h"

namespace spw::cuda {

namespace {

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }

// One block per row, a warp per 32·E-channel segment of the quantized channels (kvdev::store_segment_warp),
// (other block sizes: a thread per scale block), then all threads copy the bf16 tail and zero the padding. The first version (thread b quantized scale
// block b, a serial loop of 32 elements) took 7.4 µs per decode call on the H200 (a kernel trace).
__global__ void kv_write_rows_kernel(KvPages kv, size_t row_nbytes, const float* __restrict__ x,
                                     const int32_t* __restrict__ seqs, const int64_t* __restrict__ rows) {
  pdl_enter();
  const int i = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const KvRowFormat& f = kv.fmt;
  const int d = f.n_quant + f.n_bf16;
  const float* xr = x + int64_t(i) * d;
  uint8_t* row = const_cast<uint8_t*>(kvdev::row_ptr(kv, row_nbytes, seqs[i], rows[i]));
  const int seg = 32 * (f.block > 32 ? f.block / 32 : 1);
  if (kvdev::segment_warp_ok(f)) {
    for (int s0 = warp * seg; s0 < f.n_quant; s0 += n_warps * seg) kvdev::store_segment_warp(f, xr, s0, row, lane);
  } else {  // other block sizes: a thread per scale block
    for (int b = threadIdx.x; b < f.n_quant / f.block; b += blockDim.x) kvdev::store_block(f, xr, b, row);
  }
  for (int c = threadIdx.x; c < f.n_bf16; c += blockDim.x) {
    const uint16_t h = kvdev::f32_to_bf16_bits(xr[f.n_quant + c]);
    row[2 * c] = uint8_t(h & 0xff);
    row[2 * c + 1] = uint8_t(h >> 8);
  }
  const int used = kvdev::scale_offset(f) + kvdev::n_scales(f);
  for (int p = used + int(threadIdx.x); p < int(row_nbytes); p += blockDim.x) row[p] = 0;
}

__global__ void kv_read_rows_kernel(KvPages kv, size_t row_nbytes, const int32_t* __restrict__ seqs,
                                    const int64_t* __restrict__ rows, float* __restrict__ out) {
  pdl_enter();
  const int i = blockIdx.x;
  const int d = kv.fmt.n_quant + kv.fmt.n_bf16;
  const uint8_t* row = kvdev::row_ptr(kv, row_nbytes, seqs[i], rows[i]);
  for (int c = threadIdx.x; c < d; c += blockDim.x) out[int64_t(i) * d + c] = kvdev::load_channel(kv.fmt, row, c);
}

}  // namespace

KvRowFormat kv_format_window_v41(int d_head) { return {d_head, 0, 32, KvElem::kFp8E4m3, KvScale::kUe8m0}; }
KvRowFormat kv_format_window_v4(int d_head, int d_rope) {
  return {d_head - d_rope, d_rope, 64, KvElem::kFp8E4m3, KvScale::kUe8m0};
}
KvRowFormat kv_format_compressed_v41(int d_head) { return {d_head, 0, 16, KvElem::kFp4E2m1, KvScale::kE4m3}; }
KvRowFormat kv_format_compressed_v4(int d_head, int d_rope) { return kv_format_window_v4(d_head, d_rope); }
KvRowFormat kv_format_index_key(int d_index) { return {d_index, 0, 32, KvElem::kFp4E2m1, KvScale::kUe8m0}; }
// block only splits the copy between the write kernel's threads (no scales).
KvRowFormat kv_format_exact(int d) { return {d, 0, d % 32 == 0 ? 32 : 1, KvElem::kF32, KvScale::kUe8m0}; }

size_t kv_row_nbytes(const KvRowFormat& f) {
  const size_t used = size_t(kvdev::scale_offset(f)) + size_t(kvdev::n_scales(f));
  return (used + 3) / 4 * 4;
}

bool kv_format_supported(const KvRowFormat& f) {
  if (f.block <= 0 || f.n_quant < 0 || f.n_bf16 < 0 || f.n_quant % f.block != 0) return false;
  if (f.elem == KvElem::kFp4E2m1 && f.block % 2 != 0) return false;
  if (f.elem == KvElem::kFp8E4m3 && f.scale != KvScale::kUe8m0) return false;
  if (f.elem == KvElem::kF32 && f.n_bf16 != 0) return false;
  const int d = f.n_quant + f.n_bf16;
  return d > 0 && d <= 1024;
}

KvPageAllocator::KvPageAllocator(int32_t n_pages) : refs_(size_t(std::max(n_pages, 0)), 0) {
  free_.reserve(size_t(n_pages));
  for (int32_t p = n_pages - 1; p >= 0; --p) free_.push_back(p);  // pops hand out 0, 1, 2, ...
}

Result<std::vector<int32_t>> KvPageAllocator::alloc(int32_t n) {
  if (n < 0 || n > n_free())
    return make_error("KV pool: ", n, " pages requested, ", n_free(), " free");
  std::vector<int32_t> pages(free_.end() - n, free_.end());
  std::reverse(pages.begin(), pages.end());
  free_.resize(free_.size() - size_t(n));
  for (int32_t p : pages) refs_[size_t(p)] = 1;
  return pages;
}

void KvPageAllocator::retain(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) ++refs_[size_t(p)];
}

void KvPageAllocator::free(const std::vector<int32_t>& pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it)
    if (--refs_[size_t(*it)] == 0) free_.push_back(*it);
}

Status kv_write_rows_cuda(const KvPages& kv, const float* x, const int32_t* seqs, const int64_t* rows,
                          int32_t n_rows, cudaStream_t stream) {
  if (!kv_format_supported(kv.fmt)) return make_error("kv_write_rows_cuda: unsupported row format");
  if (n_rows <= 0) return {};
  const int seg = 32 * (kv.fmt.block > 32 ? kv.fmt.block / 32 : 1);
  const int warps = std::min(16, std::max(1, (kv.fmt.n_quant + seg - 1) / seg));
  launch(kv_write_rows_kernel, n_rows, 32 * warps, 0, stream, kv, kv_row_nbytes(kv.fmt), x, seqs, rows);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch kv_write_rows_kernel", e);
  return {};
}

Status kv_read_rows_cuda(const KvPages& kv, const int32_t* seqs, const int64_t* rows, int32_t n_rows, float* out,
                         cudaStream_t stream) {
  if (!kv_format_supported(kv.fmt)) return make_error("kv_read_rows_cuda: unsupported row format");
  if (n_rows <= 0) return {};
  launch(kv_read_rows_kernel, n_rows, 128, 0, stream, kv, kv_row_nbytes(kv.fmt), seqs, rows, out);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("launch kv_read_rows_kernel", e);
  return {};
}

}  // namespace spw::cuda
