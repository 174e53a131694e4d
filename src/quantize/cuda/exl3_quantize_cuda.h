// EXL3 quantization of one linear weight on the GPU: the CPU quantizer's algorithm
// (quantize/exl3_quantize.h, spec exl3.md §4) step for step, every step on the device.
//
// Contract: the same inputs, outputs and errors as exl3_quantize_tensor (w [k][n] fp32 host,
// h [k][k] fp64 host or empty, k, n multiples of 128), including the candidate search over
// regularisation strengths and signs (one full quantization per candidate). Deterministic for a given GPU
// model.
// Relation to the CPU result:
//   * with ldlq = false and refit = false the trellis and scales are bit-identical (the rotation,
//     the global-scale search and the Viterbi round exactly like the CPU);
//   * with LDLQ the block LDL comes from cuSOLVER's Cholesky, which differs from the CPU's in the
//     last bits; the error feedback then makes individual tiles differ, and the result is compared
//     by proxy error (tests/gpu/test_quantize_cuda.cpp states the tolerance).
// One Exl3CudaQuantizer per thread (it owns a stream, cuBLAS/cuSOLVER handles and the trellis
// workspace); several may share a GPU. Memory: about 10·k·n·8 + 6·k²·8 bytes plus the trellis
// back-pointers (n/16 tiles × 2^(24−K) bytes), ~2.5 GB at 5120×2304, K=3.
// Tests: tests/gpu/test_quantize_cuda*.cpp. Benchmark: bench/quantize/bench_quantize.cpp.
#pragma once

#include <memory>
#include <vector>

#include "base/status.h"
#include "quantize/cuda/exl3_steps_cuda.h"
#include "quantize/cuda/trellis_cuda.h"
#include "quantize/exl3_quantize.h"

namespace spw::quant {

class Exl3CudaQuantizer {
 public:
  static Result<std::unique_ptr<Exl3CudaQuantizer>> create();
  ~Exl3CudaQuantizer();
  Exl3CudaQuantizer(const Exl3CudaQuantizer&) = delete;
  Exl3CudaQuantizer& operator=(const Exl3CudaQuantizer&) = delete;

  Result<QuantizedTensor> quantize(const float* w, int64_t k, int64_t n, const std::vector<double>& h,
                                   const QuantizeParams& params);

 private:
  Exl3CudaQuantizer() = default;
  // One candidate (prm.sigma_reg, prm.seed), inputs already validated.
  Result<QuantizedTensor> quantize_one(const float* w, int64_t k, int64_t n, const std::vector<double>& h,
                                       const QuantizeParams& params);
  Status ensure_trellis(int bits, Exl3Codebook cb, int tiles);
  QuantCudaContext ctx_;
  TrellisCudaWorkspace trellis_;
};

// One-shot convenience (creates and destroys a quantizer).
Result<QuantizedTensor> exl3_quantize_tensor_cuda(const float* w, int64_t k, int64_t n, const std::vector<double>& h,
                                                  const QuantizeParams& params);

}  // namespace spw::quant
