// Sparse attention with a per-head sink (the reference's `sparse_attn`), specs §3.
// For one query token: q [n_heads, d_head]; kv rows (K = V, d_head wide) selected by `indices`
// (−1 entries ignored). ℓ_j = (q_h·c_j)·scale; o_h = Σ_j p_j·c_j / (Σ_j p_j + exp(sink_h − m)),
// p_j = exp(ℓ_j − m), m = max ℓ. With round_p_bf16 the weights p_j are cast to bf16 before
// the PV product (the reference kernel does; the exact mode does not).
#pragma once

#include <cstddef>
#include <cstdint>

namespace spw::ref {

void sparse_attn_sink(const float* q, const float* const* kv_rows, size_t n_rows, const float* sink,
                      size_t n_heads, size_t d_head, float scale, bool round_p_bf16, float* out);

}  // namespace spw::ref
