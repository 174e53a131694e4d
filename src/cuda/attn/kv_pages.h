// Compact KV storage in a paged pool: the window ring, compressed entries and indexer keys
// kept on the GPU in the precisions the reference actually produces (specs/deepseek-v4.md §3, §4.3,
// §4.4, §5.2, §6), so that read(write(x)) equals the reference's fake quant of x bit for bit.
//
// Row formats (KvRowFormat): a row of d = n_quant + n_bf16 channels is stored as
//   [n_bf16 trailing channels as bf16][n_quant codes][n_quant/block scale codes][pad to 4 bytes]
// codes are fp8 e4m3 (one byte) or fp4 e2m1 (two per byte, low nibble = even channel); scales are
// ue8m0 (2^(code−127)) or e4m3. Bytes per row (kv_row_nbytes), which the memory planner uses:
//   window ring, V4.1      fp8 e4m3, ue8m0 per 32 over all 512 channels   512 + 16          = 528 B
//   window ring, V4        fp8 e4m3, ue8m0 per 64 over 448, RoPE 64 bf16  128 + 448 + 7 (+1) = 584 B
//   compressed entry, V4.1 fp4 e2m1, e4m3 scale per 16 over 512           256 + 32          = 288 B
//   compressed entry, V4   as the V4 window ring                                              = 584 B
//   index key (V4, V4.1)   fp4 e2m1, ue8m0 per 32 over 128                64 + 4            =  68 B
// and, for Numerics::exact() (no fake quant: what Transformers computes in float32), every pool in
// kv_format_exact: all channels f32, no scales (4·d bytes; codes region only, n_bf16 = 0).
//
// Paged pool: one pool per row format (a device buffer of n_pages pages of kKvPageRows rows). Each
// sequence owns a page table (int32 page ids, device memory, one row of `page_table` per sequence,
// max_pages_per_seq wide); its logical row r lives in page page_table[r / kKvPageRows], slot
// r % kKvPageRows. The window ring uses logical row = position mod window (window/kKvPageRows pages per
// sequence and layer); compressed entries and index keys use logical row = entry id. Page ids are
// handed out and returned by KvPageAllocator (host side), so all sequences share one pool.
//
// Contract of the kernels: device pointers; rows of x are f32 values (bf16-exact in the model, not
// required here); write quantizes each row exactly like formats/quant.h (fake_quant_fp8 /
// fake_quant_fp4_ue8m0 / fake_quant_fp4_e4m3 on the first n_quant channels, the bf16 tail rounded to
// bf16) and stores it; read dequantizes to f32. The rows of one write call must be distinct.
// Tests: tests/gpu/test_cuda_attn_kv.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"

namespace spw::cuda {

constexpr int kKvPageRows = 64;

enum class KvElem : int32_t { kFp8E4m3, kFp4E2m1, kF32 };
enum class KvScale : int32_t { kUe8m0, kE4m3 };

struct KvRowFormat {
  int32_t n_quant = 0;  // leading channels stored quantized (multiple of block)
  int32_t n_bf16 = 0;   // trailing channels stored as bf16 (V4: the RoPE channels)
  int32_t block = 32;   // channels per scale
  KvElem elem = KvElem::kFp8E4m3;
  KvScale scale = KvScale::kUe8m0;
};

// The model's formats, for head width d_head (RoPE channels d_rope) and index key width d_index.
KvRowFormat kv_format_window_v41(int d_head);
KvRowFormat kv_format_window_v4(int d_head, int d_rope);
KvRowFormat kv_format_compressed_v41(int d_head);
KvRowFormat kv_format_compressed_v4(int d_head, int d_rope);
KvRowFormat kv_format_index_key(int d_index);
// Unquantized rows (Numerics without fake quant): d f32 channels, stored as given.
KvRowFormat kv_format_exact(int d);

// Channels of a row, and its bytes in the pool (see the table above).
inline int kv_row_channels(const KvRowFormat& f) { return f.n_quant + f.n_bf16; }
size_t kv_row_nbytes(const KvRowFormat& f);
inline size_t kv_page_nbytes(const KvRowFormat& f) { return kv_row_nbytes(f) * kKvPageRows; }
// Whether the kernels handle this format (n_quant multiple of block, even block for fp4, no bf16 tail
// with f32, d ≤ 1024).
bool kv_format_supported(const KvRowFormat& f);

// A device view of one pool with its page tables.
struct KvPages {
  uint8_t* pool = nullptr;              // [n_pages][kKvPageRows][kv_row_nbytes(fmt)]
  const int32_t* page_table = nullptr;  // [n_seqs][max_pages_per_seq] page ids
  int32_t max_pages_per_seq = 0;
  KvRowFormat fmt;
};

// Host-side free list of page ids of one pool (the pool itself is cudaMalloc'ed by the owner).
// Pages are reference-counted so that sequences can share pages they will never write again (the full
// pages of compressed entries and index keys of a common prefix): alloc hands out pages with one
// reference, retain adds one, free drops one and returns a page to the pool at zero.
class KvPageAllocator {
 public:
  explicit KvPageAllocator(int32_t n_pages);
  // Takes n pages; error (nothing taken) if fewer are free.
  Result<std::vector<int32_t>> alloc(int32_t n);
  void retain(const std::vector<int32_t>& pages);
  void free(const std::vector<int32_t>& pages);
  int32_t n_free() const { return int32_t(free_.size()); }
  int32_t refs(int32_t page) const { return refs_[size_t(page)]; }

 private:
  std::vector<int32_t> free_;
  std::vector<int32_t> refs_;  // per page
};

// Quantize and store rows: row i of x [n_rows, d] goes to logical row rows[i] of sequence seqs[i].
Status kv_write_rows_cuda(const KvPages& kv, const float* x, const int32_t* seqs, const int64_t* rows,
                          int32_t n_rows, cudaStream_t stream);

// Load and dequantize: out[i] = logical row rows[i] of sequence seqs[i], f32 [n_rows, d].
Status kv_read_rows_cuda(const KvPages& kv, const int32_t* seqs, const int64_t* rows, int32_t n_rows, float* out,
                         cudaStream_t stream);

}  // namespace spw::cuda
