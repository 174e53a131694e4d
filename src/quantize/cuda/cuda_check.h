// Checked CUDA / cuBLAS / cuSOLVER calls for the quantizer: every call returns an Error naming the
// call on failure (SPW_TRY-compatible). Private to src/quantize/cuda.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include "base/status.h"

namespace spw::quant {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return make_error("CUDA ", what, ": ", cudaGetErrorString(e));
}
inline Status cublas_status(cublasStatus_t e, const char* what) {
  if (e == CUBLAS_STATUS_SUCCESS) return {};
  return make_error("cuBLAS ", what, ": status ", int(e));
}
inline Status cusolver_status(cusolverStatus_t e, const char* what) {
  if (e == CUSOLVER_STATUS_SUCCESS) return {};
  return make_error("cuSOLVER ", what, ": status ", int(e));
}

}  // namespace spw::quant

#define QCUDA_TRY(call) SPW_TRY(::spw::quant::cuda_status((call), #call))
#define QCUBLAS_TRY(call) SPW_TRY(::spw::quant::cublas_status((call), #call))
#define QCUSOLVER_TRY(call) SPW_TRY(::spw::quant::cusolver_status((call), #call))
