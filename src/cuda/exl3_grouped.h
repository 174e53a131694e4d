// Grouped EXL3 GEMMs over many experts of one MoE layer: one launch per projection and row class
// instead of one per expert (the prefill chunks and the batched decode steps of more than 16 rows).
//
// What it computes: the rows of x are sorted by expert (a counting sort on the host). For every item
// (expert e, rows row0 .. row0 + m − 1, m ≤ 64) and the layer's projection `proj` of e
// (Exl3CudaExpert order: 0 = w1, 1 = w3, 2 = w2):
//   y[row(r)] = x[row0 + r]·W_e + bias_e,  row(r) = y_rows ? y_rows[row0 + r] : row0 + r,
// exactly what exl3_gemm_cuda computes for that expert's rows (the same tile decode, tensor-core
// step and output transform: exl3_bulk.cuh), so the per-expert path is its reference.
// How: exl3_rotate_grouped_cuda rotates every row once by its expert's suh into fp16 (gathering rows
// of x through x_rows); the grouped kernel's blocks are (column group, k slice, item), items of ≤ 8,
// ≤ 16, ≤ 64 and ≤ 96 rows in four launches (1, 2, 8 or 12 token groups per decoded tile). Partial sums of the
// k slices meet in y itself in slice order (exl3_bulk.cuh), which the call zeroes first; the last slice of
// an item's column group applies the output Hadamard, svh and bias in place.
// Contract: device pointers unless said otherwise; layer as exl3_moe_decode_cuda's table (one integer K
// 2..6 and codebook, d and f multiples of 128). xr [rows][k] fp16 from exl3_rotate_grouped_cuda;
// y [y_rows_total][n] fp32 (overwritten: zeroed, then every mapped row written); counters ≥
// items · n/128 uint32 (any content: zeroed by the call). Rows of different items must map to
// distinct y rows.
// Accuracy: as exl3_gemm_cuda (x rounded to fp16 once after its rotation, fp32 products and sums).
// Deterministic; a row's result depends on its item's row class (the slices' length), not on other rows'
// values. The pairs launch has one class, so a pair's result never depends on the other pairs.
// Tests: tests/gpu/test_exl3_grouped.cpp. Used by: engine/gpu_moe.cpp (host dispatch of EXL3 experts).
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "cuda/exl3_moe.h"

namespace spw {

// One expert's run of sorted rows (at most kExl3MaxItemRows).
struct Exl3GroupItem {
  int32_t expert = 0, row0 = 0, m = 0, pad = 0;
};

// Row classes of items (≤ 8, ≤ 16, ≤ 64, ≤ 96 rows) and the most rows of an item: an expert with up to
// 96 rows of a chunk decodes its matrices once (a 4096-token V4.1 chunk gives each expert 64 on average).
constexpr int kExl3GroupClasses = 4, kExl3MaxItemRows = 96;

// The items of a layer's sorted rows, by row class: items[0 .. n[0]) have ≤ 8 rows, the next n[1] ≤ 16,
// then n[2] ≤ 64, the last n[3] ≤ 96. An expert's rows are cut into equal pieces of at most 96 (100
// rows: 50 + 50).
struct Exl3GroupPlan {
  std::vector<Exl3GroupItem> items;
  int n[kExl3GroupClasses] = {};
};
// first: E + 1 offsets (host), expert e's sorted rows are first[e] .. first[e + 1].
// fixed_class c ≥ 0 puts every item in class c, cutting each expert's rows into equal pieces of at most that
// class's rows: every row then gets class c's bits, whatever the other rows of the call (batch invariance:
// class 0 gives a row the bits exl3_grouped_pairs_gemm_cuda gives its pair).
Exl3GroupPlan exl3_group_plan(const std::vector<int32_t>& first, int fixed_class = -1);
// The most rows of an item of each class.
constexpr int kExl3ClassRows[kExl3GroupClasses] = {8, 16, 64, kExl3MaxItemRows};

// xr[r] = fp16(had128(x[src(r)] ∘ suh_e)) per 128-block, src(r) = x_rows ? x_rows[r] : r / x_div,
// e = row_expert[r] (rows with e < 0 are skipped). x [*][k] fp32 with k the projection's input width (d for
// w1/w3, f for w2). x_div = top_k turns (token, slot) pairs into their token's row.
Status exl3_rotate_grouped_cuda(const Exl3CudaMoeLayer& layer, int proj, const float* x, const int32_t* x_rows,
                                int x_div, const int32_t* row_expert, int64_t rows, void* xr, void* stream);

// items: the plan's items uploaded in the same order (device); plan gives the class counts (host).
Status exl3_grouped_gemm_cuda(const Exl3CudaMoeLayer& layer, int proj, const Exl3GroupPlan& plan,
                              const Exl3GroupItem* items, const void* xr, float* y, const int32_t* y_rows,
                              int64_t y_rows_total, uint32_t* counters, bool round_out_bf16, void* stream);

// Decode steps (device dispatch: nothing from the host, CUDA-graph capturable): one item per (token, slot)
// pair p of one row, xr row p → y row p, expert pair_experts[p] (the router's [T][top_k] ids; < 0: the
// slot is skipped and its row stays zero). y [n_pairs][n] overwritten; counters ≥ n_pairs · n/128.
Status exl3_grouped_pairs_gemm_cuda(const Exl3CudaMoeLayer& layer, int proj, const int32_t* pair_experts,
                                    int64_t n_pairs, const void* xr, float* y, uint32_t* counters, bool round_out_bf16,
                                    void* stream);

}  // namespace spw
