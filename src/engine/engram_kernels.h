// V4.1 Engram on the GPU (model/engram.cpp): the row gather from the hashed tables and the gate
// that adds the value into each residual copy. The hashing (a few integer ops per token and row)
// stays on the host, where the tokens and each sequence's n-gram history are known.
//
// engram_gather_cuda: out[i, ch] = e4m3(table[row_ids[i], ch]) · ue8m0(scale[row_ids[i], ch/32])
//   (formats/quant.h dequant_fp8_rows), i < n_rows, ch < head_dim; table [*, head_dim] and scale
//   [*, head_dim/32] may be mapped pinned host memory (the tables stay in host RAM: only the rows a
//   step reads cross PCIe).
// engram_gate_cuda: per token t and residual copy j (one block each):
//   x = streams[t, j], k = kv[t, j], v = kv[t, hc]; sums sx = Σ x², sk = Σ k², dot = Σ x·qk_j·k in f64
//   (block reductions; the reference sums left to right); rx = 1/√(f32(sx/d) + eps), rk likewise; g = f32(dot)·rx·rk/√d;
//   gate = σ(sign(g)·√max(|g|, 1e-6)); x ← x + gate·v, rounded to bf16 when round_bf16.
//   qk [hc, d] = q_weight·k_weight (f32 products, precomputed on the host as the reference forms them).
//   Bit-exact with the reference except σ's exp (f64 rounded once vs glibc's expf: rare 1-ulp cases)
//   and f64 sums whose order change moves the f32 value across a rounding boundary (rare).
// Contract: device pointers (tables: device-visible); kv [n_tokens, (hc+1)·d], streams [n_tokens, hc, d]
// updated in place. Tested through the forward (tests/gpu/test_engine_golden.cpp, V4.1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"

namespace spw::engine {

Status engram_gather_cuda(const uint8_t* table, const uint8_t* scale, const int64_t* row_ids, int64_t n_rows,
                          int head_dim, float* out, cudaStream_t stream);

Status engram_gate_cuda(float* streams, const float* kv, const float* qk, int64_t n_tokens, int hc, int64_t d,
                        float norm_eps, bool round_bf16, cudaStream_t stream);

}  // namespace spw::engine
