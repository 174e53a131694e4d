// Plain references for the dense linear-algebra ops: y = x·Wᵀ and RMSNorm.
// Contract: row-major f32, no aliasing between inputs and outputs. Multithreaded over output
// rows through the global pool so the golden suite stays fast; results do not depend on the
// thread count (each output element is one sequential dot product).
// Tests: tests/unit/test_ops_ref.cpp.
#pragma once

#include <cstddef>

namespace spw::ref {

// y[n_tokens, n_out] = x[n_tokens, n_in] · w[n_out, n_in]ᵀ, f32 accumulation (overwrites y); every element is the
// sequential dot product in k order, bit for bit (ref/matmul.cpp says how it is still fast).
void matmul_nt(const float* x, const float* w, float* y, size_t n_tokens, size_t n_in, size_t n_out);
// The same on the calling thread only (for callers already inside a global_pool() parallel loop).
void matmul_nt_serial(const float* x, const float* w, float* y, size_t n_tokens, size_t n_in, size_t n_out);

// y[i] = w[i] · x[i] · rsqrt(mean(x²) + eps) per row of width d; w may be nullptr (weightless).
// In-place (y == x) is allowed.
void rms_norm(const float* x, const float* w, float* y, size_t n_rows, size_t d, float eps);

// Round every element to bf16 (the reference stores these activations in bf16).
void round_bf16_inplace(float* x, size_t n);

float silu(float x);
float sigmoid(float x);
float softplus(float x);

}  // namespace spw::ref
