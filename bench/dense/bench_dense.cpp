// Dense-linear benchmark (cuda/dense/dense_linear.h) on the V4.1-Flash shapes (spec §2.3), one run:
//   1. HBM copy bandwidth (device-to-device cudaMemcpy, read + write bytes);
//   2. decode (LinearPath::kGemv) at n_tokens 1, 4, 16: µs per call and % of the roofline
//      weight bytes ÷ copy bandwidth, rotating through enough weight copies (≥ 512 MB) that no call
//      finds its weight in L2;
//   3. prefill (LinearPath::kGemm) at n_tokens 4096: TFLOP/s (2·n_tokens·n_in·n_out per call, the
//      activation prep and weight dequantization included) against a plain cuBLAS bf16 GEMM of the same
//      shape (bf16 in, fp32 out and compute) timed in the same run.
// Weight contents do not change the timing (no data-dependent work), so buffers are memset.
// Usage: bench_dense [iters]   Prints markdown tables.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/cuda_check.h"
#include "cuda/dense/dense_linear.h"

using namespace spw;

#define ST(x)                                                                                            \
  do {                                                                                                   \
    Status s_ = (x);                                                                                     \
    if (!s_.ok()) spw::bench::fail_call(__FILE__, __LINE__, #x, s_.error().message.c_str());             \
  } while (0)
#define CB(x)                                                                                            \
  do {                                                                                                   \
    cublasStatus_t s_ = (x);                                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) spw::bench::fail_call(__FILE__, __LINE__, #x, cublasGetStatusString(s_)); \
  } while (0)

namespace {

struct Shape {
  const char* name;
  DenseFormat format;
  int n_out, n_in;
  bool f32_product;
  int groups;  // > 1: the grouped output projection (rank n_out, per_group n_in per group)
};

// V4.1-Flash: fp8 32×32 weight blocks, activation blocks of 32.
const Shape kShapes[] = {
    {"attn.wq_a", DenseFormat::kFp8, 1280, 5120, false, 1},
    {"attn.wq_b", DenseFormat::kFp8, 32768, 1280, false, 1},
    {"attn.wkv", DenseFormat::kFp8, 512, 5120, false, 1},
    {"attn.wo_a (grouped)", DenseFormat::kBf16, 1024, 4096, false, 8},
    {"attn.wo_b", DenseFormat::kFp8, 5120, 8192, false, 1},
    {"indexer.wq_b", DenseFormat::kFp8, 4096, 1280, false, 1},
    {"shared w1/w3", DenseFormat::kFp8, 2304, 5120, false, 1},
    {"shared w2", DenseFormat::kFp8, 5120, 2304, false, 1},
    {"expert w1/w3 (mxfp4)", DenseFormat::kFp4, 2304, 5120, false, 1},
    {"expert w2 (mxfp4)", DenseFormat::kFp4, 5120, 2304, false, 1},
    {"ffn.gate (f32)", DenseFormat::kBf16, 384, 5120, true, 1},
    {"head (f32)", DenseFormat::kBf16, 129280, 5120, true, 1},
};

DeviceLinear linear_of(const Shape& s) {
  DeviceLinear d;
  d.format = s.format, d.n_out = s.n_out, d.n_in = s.n_in, d.f32_product = s.f32_product;
  d.weight_block = 32;
  d.act_block = (s.format == DenseFormat::kFp8 || s.format == DenseFormat::kFp4) ? 32 : 0;
  return d;
}

size_t scale_nbytes(const DeviceLinear& d) {
  if (d.format == DenseFormat::kFp8)
    return size_t((d.n_out + d.weight_block - 1) / d.weight_block) * ((d.n_in + d.weight_block - 1) / d.weight_block);
  if (d.format == DenseFormat::kFp4) return size_t(d.n_out) * d.n_in / 32;
  return 0;
}

// Copies of one weight (values irrelevant to the timing: 0x38 codes, 2^0 scales).
struct Copies {
  std::vector<void*> w, s;
  size_t w_nbytes = 0;
  Copies(const Shape& sh, size_t min_total) {
    const DeviceLinear d = linear_of(sh);
    const size_t total = dense_weight_nbytes(d) * sh.groups;
    const size_t sc = scale_nbytes(d);
    w_nbytes = total - sc;
    const int n = int(std::max<size_t>(1, (min_total + total - 1) / total));
    for (int i = 0; i < n; ++i) {
      void *pw = nullptr, *ps = nullptr;
      CK(cudaMalloc(&pw, w_nbytes));
      CK(cudaMemset(pw, 0x38, w_nbytes));
      if (sc) {
        CK(cudaMalloc(&ps, sc));
        CK(cudaMemset(ps, 127, sc));
      }
      w.push_back(pw), s.push_back(ps);
    }
  }
  ~Copies() {
    for (void* p : w) cudaFree(p);
    for (void* p : s) cudaFree(p);
  }
};

Status run_shape(const Shape& sh, const Copies& c, int i, const float* x, int n_tokens, float* y, LinearWorkspace& ws,
                 LinearPath path) {
  if (sh.groups > 1)
    return grouped_proj_cuda(static_cast<const uint16_t*>(c.w[i]), x, n_tokens, sh.groups, sh.n_out, sh.n_in, y, true,
                             ws, nullptr, path);
  DeviceLinear d = linear_of(sh);
  d.w = c.w[i], d.scale = static_cast<const uint8_t*>(c.s[i]);
  return linear_cuda(d, x, n_tokens, y, true, ws, nullptr, path);
}

// Mean µs per call of fn(i) over iters calls, after 3 warm-up calls.
template <class Fn>
double time_us(int iters, Fn fn) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) fn(i);
  CK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) fn(i);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return 1e3 * ms / iters;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // 1. HBM copy bandwidth.
  const size_t copy_nbytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, copy_nbytes));
  CK(cudaMalloc(&b, copy_nbytes));
  CK(cudaMemset(a, 1, copy_nbytes));
  const double copy_us = time_us(20, [&](int) { CK(cudaMemcpyAsync(b, a, copy_nbytes, cudaMemcpyDeviceToDevice)); });
  const double bw = 2.0 * copy_nbytes / (copy_us * 1e-6);
  CK(cudaFree(a));
  CK(cudaFree(b));
  std::printf("hbm copy bandwidth (read + write bytes): %.0f GB/s\n\n", bw / 1e9);

  const int max_tokens = 4096, max_in = 8192 * 4;  // the grouped projection's x is 8·4096 wide
  LinearWorkspace ws;
  ST(linear_workspace_alloc(ws, max_tokens, max_in, size_t(256) << 20));
  float *x = nullptr, *y = nullptr;
  const size_t y_elems = size_t(max_tokens) * 129280;
  CK(cudaMalloc(&x, sizeof(float) * max_tokens * max_in));
  CK(cudaMalloc(&y, sizeof(float) * y_elems));
  CK(cudaMemset(x, 0, sizeof(float) * max_tokens * max_in));  // 0x3f800000 would be nicer; zeros time the same

  // 2. Decode, on both GEMV paths (dense_linear.h: set_gemv_mma): the scalar weight-streaming kernels and the
  // tensor-core ones (FP8 with activation quant, BF16; the other formats stay scalar in both tables). 64 tokens run
  // as the batch-invariant decode does, in slices of 16.
  for (bool mma : {false, true}) {
    set_gemv_mma(mma);
    std::printf("## Decode (kGemv, %s), V4.1 shapes, roofline = weight bytes / copy bandwidth\n\n",
                mma ? "tensor cores" : "scalar");
    std::printf("| tensor | format | n_in→n_out | MB | tokens | µs | GB/s | %% of roofline |\n|---|---|---|---|---|---|---|---|\n");
    for (const Shape& sh : kShapes) {
      Copies c(sh, size_t(512) << 20);
      const double mb = dense_weight_nbytes(linear_of(sh)) * double(sh.groups);
      for (int T : {1, 4, 16, 64}) {
        const double us = time_us(iters, [&](int i) {
          ST(run_shape(sh, c, i % int(c.w.size()), x, T, y, ws, LinearPath::kGemv));
        });
        const double roof_us = mb / bw * 1e6;
        std::printf("| %s | %s | %d→%d%s | %.1f | %d | %.2f | %.0f | %.1f%% |\n", sh.name, dense_format_name(sh.format),
                    sh.n_in * sh.groups, sh.n_out * sh.groups, sh.groups > 1 ? " (8 groups)" : "", mb / 1e6, T, us,
                    mb / (us * 1e-6) / 1e9, 100.0 * roof_us / us);
      }
    }
    std::printf("\n");
  }
  set_gemv_mma(false);

  // 3. Prefill vs a plain cuBLAS bf16 GEMM of the same shape.
  const int T = 4096;
  std::printf("\n## Prefill (kGemm), %d tokens, vs cuBLAS bf16 GEMM (fp32 out) of the same shape\n\n", T);
  std::printf("| tensor | format | n_in→n_out | spillway ms | TFLOP/s | cuBLAS bf16 ms | TFLOP/s | ratio |\n|---|---|---|---|---|---|---|---|\n");
  cublasHandle_t h;
  CB(cublasCreate(&h));
  void *wb = nullptr, *xb = nullptr;
  CK(cudaMalloc(&wb, size_t(129280) * 5120 * 2));
  CK(cudaMalloc(&xb, size_t(T) * max_in * 2));
  CK(cudaMemset(wb, 0, size_t(129280) * 5120 * 2));
  CK(cudaMemset(xb, 0, size_t(T) * max_in * 2));
  for (const Shape& sh : kShapes) {
    Copies c(sh, 0);
    const int n_out = sh.n_out * sh.groups, n_in = sh.n_in;  // grouped: G GEMMs of rank×per_group
    const double flop = 2.0 * T * double(n_in) * n_out;
    const int pre_iters = std::max(3, std::min(iters, int(2e13 / flop)));
    const double us = time_us(pre_iters, [&](int) { ST(run_shape(sh, c, 0, x, T, y, ws, LinearPath::kGemm)); });
    const float alpha = 1.0f, beta = 0.0f;
    const double base_us = time_us(pre_iters, [&](int) {
      CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha, wb, CUDA_R_16BF, n_in, xb, CUDA_R_16BF, n_in,
                      &beta, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    std::printf("| %s | %s%s | %d→%d | %.3f | %.0f | %.3f | %.0f | %.2f |\n", sh.name, dense_format_name(sh.format),
                sh.f32_product ? " (fp32 GEMM)" : "", n_in * sh.groups, n_out, us / 1e3, flop / (us * 1e-6) / 1e12,
                base_us / 1e3, flop / (base_us * 1e-6) / 1e12, base_us / us);
  }
  cublasDestroy(h);
  cudaFree(wb), cudaFree(xb), cudaFree(x), cudaFree(y);
  linear_workspace_free(ws);
  return 0;
}
