// Hands the GPU kernel switches of GpuSettings (base/settings.h) to the kernel libraries, which keep them
// process-wide: PDL (launch.h), the FP8 decode GEMV and the f32-product GEMM (dense/dense_linear.h), and
// sparse attention's paths (attn/sparse_attn.h). Called once at start-up by programs that run the GPU
// forward (`spillway bench`), before any weights are uploaded: the dense path choice decides how weights
// are stacked. Header-only, so a caller links just the libraries it already uses (spw_cuda_dense, spw_cuda_attn).
#pragma once

#include "base/settings.h"
#include "cuda/attn/sparse_attn.h"
#include "cuda/dense/dense_linear.h"
#include "cuda/launch.h"

namespace spw::cuda {

// batch_invariant: the engine will decode batch-invariantly (engine/gpu_runner.h), which GemvMma::kAuto follows.
inline void apply_kernel_settings(const GpuSettings& g, bool batch_invariant) {
  set_pdl(g.pdl);
  set_gemv_mma(g.gemv_mma == GemvMma::kOn || (g.gemv_mma == GemvMma::kAuto && batch_invariant));
  set_f32_split_gemm(g.f32_split_gemm);
  set_sparse_attn_switches({.mma = g.attn_mma, .vec4 = g.attn_vec4, .fused = g.attn_fused});
}

}  // namespace spw::cuda
