// Entry points of the dense linears (contract in dense_linear.h): argument checks, the workspace,
// the path choice, and the prefill path (activation prep → weight chunks dequantized into scratch →
// cuBLAS GEMM writing y in place → optional bf16 rounding). The decode kernel is dense_gemv.cu.
// Column-major view used for cuBLAS: yᵀ [n_out, n_tokens] (ld n_out) = W [n_in, n_out]ᵀ · x̂ᵀ [n_in, n_tokens].
// Tests: tests/gpu/test_cuda_dense.cpp. Benchmark: bench/dense/bench_dense.cpp.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "cuda/dense/dense_kernels.h"
#include "cuda/dense/dense_linear.h"

namespace spw {
namespace {

Error cuda_error(const char* what, cudaError_t e) { return make_error("CUDA ", what, ": ", cudaGetErrorString(e)); }
Error cublas_error(const char* what, cublasStatus_t s) {
  return make_error("cuBLAS ", what, ": ", cublasGetStatusString(s));
}

constexpr int kGemvMaxTokens = 16;

// The process's choices (set_gemv_mma, set_f32_split_gemm), defaults as in GpuSettings.
std::atomic<bool> gemv_mma_flag{false};
std::atomic<bool> f32_split_gemm_flag{true};

// FP8 with activation quant and BF16 weights: tensor cores when the process chose them (set_gemv_mma).
bool takes_mma(const DeviceLinear& w) {
  return (w.act_block > 0 || w.format == DenseFormat::kBf16) && gemv_mma_enabled() &&
         densedev::gemv_uses_mma(w.format, w.weight_block, w.act_block, w.n_in);
}

// The bf16 planes of x the BF16 tensor-core GEMV reads (dense_gemv_mma.cu): three for f32 products.
int bf16_x_planes(const DeviceLinear& w) { return w.f32_product ? 3 : 1; }

size_t elem_nbytes(DenseFormat f) {
  switch (f) {
    case DenseFormat::kFp8: return 1;
    case DenseFormat::kFp4: return 0;  // half a byte: handled by the callers
    case DenseFormat::kBf16: return 2;
    case DenseFormat::kF32: return 4;
  }
  return 0;
}

// Rows per tensor-core GEMV launch: up to kGemvMmaMaxTokens, as many as the workspace holds row_nbytes of prepared x
// per row for (never fewer than 16). A row's sums are the same at every slice size (dense_gemv_mma.cu).
int mma_slice_rows(size_t row_nbytes, const LinearWorkspace& ws) {
  int rows = kGemvMmaMaxTokens;
  while (rows > kGemvMaxTokens && ws.act_nbytes < row_nbytes * rows) rows /= 2;
  return rows;
}

// Rows per GEMV launch of linear_cuda's kGemv: mma_slice_rows of x's codes (FP8) or planes (BF16) on the tensor-core
// kernel, else 16.
int gemv_slice_rows(const DeviceLinear& w, const LinearWorkspace& ws) {
  if (!takes_mma(w)) return kGemvMaxTokens;
  return mma_slice_rows(w.format == DenseFormat::kBf16 ? 2 * static_cast<size_t>(bf16_x_planes(w)) * w.n_in
                                                       : sizeof(float) * static_cast<size_t>(w.n_in),
                        ws);
}

LinearPath resolve(LinearPath p, int n_tokens) {
  if (p != LinearPath::kAuto) return p;
  return n_tokens <= kGemvMaxTokens ? LinearPath::kGemv : LinearPath::kGemm;
}

}  // namespace

const char* dense_format_name(DenseFormat f) {
  switch (f) {
    case DenseFormat::kFp8: return "fp8";
    case DenseFormat::kFp4: return "fp4";
    case DenseFormat::kBf16: return "bf16";
    case DenseFormat::kF32: return "f32";
  }
  return "?";
}

const char* linear_path_name(LinearPath p) {
  switch (p) {
    case LinearPath::kAuto: return "auto";
    case LinearPath::kGemv: return "gemv";
    case LinearPath::kGemm: return "gemm";
  }
  return "?";
}

size_t dense_weight_nbytes(const DeviceLinear& w) {
  const size_t n = static_cast<size_t>(w.n_out) * w.n_in;
  switch (w.format) {
    case DenseFormat::kFp8: {
      const size_t b = static_cast<size_t>(w.weight_block);
      return n + ((w.n_out + b - 1) / b) * ((w.n_in + b - 1) / b);
    }
    case DenseFormat::kFp4: return n / 2 + n / 32;
    default: return n * elem_nbytes(w.format);
  }
}

Status linear_cuda_check(const DeviceLinear& w) {
  if (w.n_out < 1 || w.n_in < 1 || !w.w) return make_error("dense linear: empty weight (", w.n_out, "x", w.n_in, ")");
  const bool quant_w = w.format == DenseFormat::kFp8 || w.format == DenseFormat::kFp4;
  const int align = (quant_w || w.act_block > 0) ? 32 : 16;
  if (w.n_in % align != 0)
    return make_error("dense linear: n_in ", w.n_in, " is not a multiple of ", align, " (", dense_format_name(w.format), ")");
  if (w.act_block < 0 || (w.act_block > 0 && (w.act_block % 32 != 0 || w.n_in % w.act_block != 0)))
    return make_error("dense linear: act_block ", w.act_block, " does not divide n_in ", w.n_in, " in multiples of 32");
  if (quant_w && !w.scale) return make_error("dense linear: ", dense_format_name(w.format), " weight without scales");
  if (w.format == DenseFormat::kFp8 && w.weight_block != 32 && w.weight_block != 128)
    return make_error("dense linear: fp8 weight_block ", w.weight_block, " (32 or 128 supported)");
  return {};
}

Status linear_workspace_alloc(LinearWorkspace& ws, int max_tokens, int max_in, size_t wbuf_nbytes) {
  ws.act_nbytes = sizeof(float) * static_cast<size_t>(max_tokens) * max_in;
  ws.wbuf_nbytes = wbuf_nbytes;
  if (cudaError_t e = cudaMalloc(&ws.act, ws.act_nbytes); e != cudaSuccess) return cuda_error("malloc linear workspace", e);
  if (cudaError_t e = cudaMalloc(&ws.wbuf, ws.wbuf_nbytes); e != cudaSuccess) return cuda_error("malloc linear workspace", e);
  cublasHandle_t h = nullptr;
  if (cublasStatus_t s = cublasCreate(&h); s != CUBLAS_STATUS_SUCCESS) return cublas_error("create", s);
  ws.cublas = h;
  return {};
}

void linear_workspace_free(LinearWorkspace& ws) {
  cudaFree(ws.act);
  cudaFree(ws.wbuf);
  if (ws.cublas) cublasDestroy(static_cast<cublasHandle_t>(ws.cublas));
  ws = {};
}

namespace {

// y = x̂·Wᵀ on the GEMV path; a stacked weight (parts > 1) writes its parts' rows to ys instead.
Status linear_gemv(const DeviceLinear& w, const float* x, int n_tokens, float* y, bool round_out, LinearWorkspace& ws,
                   cudaStream_t stream, std::span<const int> part_rows = {}, std::span<float* const> ys = {}) {
  if (w.act_block > 0 && ws.act_nbytes < sizeof(float) * static_cast<size_t>(n_tokens) * w.n_in)
    return make_error("dense linear: workspace too small for ", n_tokens, "x", w.n_in, " activations");
  // FP8 with activation quant: the tensor-core kernel on x̂'s codes and scales; BF16: on x's bf16 planes
  // (dense_gemv_mma.cu). A workspace too small for the planes keeps the scalar kernel.
  const bool bf16_mma = takes_mma(w) && w.format == DenseFormat::kBf16 &&
                        ws.act_nbytes >= 2 * static_cast<size_t>(bf16_x_planes(w)) * n_tokens * w.n_in;
  const bool mma = bf16_mma || (takes_mma(w) && w.format != DenseFormat::kBf16);
  const float* xq = x;
  uint16_t* codes = static_cast<uint16_t*>(ws.act);
  // Scales after the codes, 16-byte aligned: 2·T·n_in + 4·T·n_in/32 bytes fit the f32 x̂ the workspace holds.
  float* scales = reinterpret_cast<float*>(static_cast<char*>(ws.act) + (2 * static_cast<size_t>(n_tokens) * w.n_in + 15) / 16 * 16);
  if (bf16_mma) {
    const size_t n = static_cast<size_t>(n_tokens) * w.n_in;
    const cudaError_t e = bf16_x_planes(w) == 3 ? densedev::split3_bf16_launch(x, n, codes, stream)
                                                : densedev::act_prepare_launch(x, n_tokens, w.n_in, 0, codes, true, stream);
    if (e != cudaSuccess) return cuda_error("launch the bf16 planes of x", e);
  } else if (mma) {
    if (cudaError_t e = densedev::act_codes_launch(x, n_tokens, w.n_in, w.act_block, codes, scales, stream); e != cudaSuccess)
      return cuda_error("launch act_codes", e);
  } else if (w.act_block > 0) {
    if (cudaError_t e = densedev::act_prepare_launch(x, n_tokens, w.n_in, w.act_block, ws.act, false, stream); e != cudaSuccess)
      return cuda_error("launch act_quant", e);
    xq = static_cast<const float*>(ws.act);
  }
  densedev::GemvArgs a;
  a.format = w.format, a.w = w.w, a.scale = w.scale, a.n_out = w.n_out, a.n_in = w.n_in, a.weight_block = w.weight_block;
  a.x = xq, a.ldx = w.n_in, a.y = y, a.ldy = w.n_out, a.n_tokens = n_tokens;
  a.round_out = round_out && !w.f32_product;
  if (part_rows.size() > 1) {
    a.n_parts = static_cast<int>(part_rows.size());
    for (int p = 0, row0 = 0; p < a.n_parts; row0 += part_rows[p++])
      a.part_row0[p] = row0, a.part_y[p] = ys[p], a.part_ld[p] = part_rows[p];
    a.y = ys[0], a.ldy = part_rows[0];
  }
  if (mma) {
    a.xc = codes, a.xs = bf16_mma ? nullptr : scales, a.act_block = w.act_block;
    a.x_planes = bf16_mma ? bf16_x_planes(w) : 0;
    if (cudaError_t e = densedev::gemv_mma_launch(a, stream); e != cudaSuccess) return cuda_error("launch mma gemv", e);
    return {};
  }
  if (cudaError_t e = densedev::gemv_launch(a, stream); e != cudaSuccess) return cuda_error("launch dense gemv", e);
  return {};
}

// An f32 product of a bf16 weight on bf16 tensor cores: x = hi + mid + lo, three bf16 planes (split3_bf16), as
// 3·n_tokens rows of one bf16 GEMM (the weight read once per chunk), then y = (hi·W + mid·W) + lo·W in f32. Each
// product of a bf16 weight and a bf16 plane is exact in the fp32 accumulator, so no bit of x is dropped, where
// the pedantic fp32 GEMM runs on the FFMA pipes from a weight dequantized to f32 (at 64 decode rows the head
// and the router took ~23 % of a V4.1 step that way: bench/results/engine_h200.md). Sums differ in
// order (and the tensor cores' accumulation in rounding) from that GEMM. Scratch: x3 then a y3 chunk in ws.wbuf.
Status linear_gemm_split3(const DeviceLinear& w, const float* x, int n_tokens, float* y, LinearWorkspace& ws,
                          cudaStream_t stream, cublasHandle_t h, size_t x3_nbytes, int chunk) {
  void* x3 = ws.wbuf;
  float* y3 = reinterpret_cast<float*>(static_cast<char*>(ws.wbuf) + x3_nbytes);
  if (cudaError_t e = densedev::split3_bf16_launch(x, static_cast<size_t>(n_tokens) * w.n_in, x3, stream); e != cudaSuccess)
    return cuda_error("launch split3_bf16", e);
  const float alpha = 1.0f, beta = 0.0f;
  for (int r0 = 0; r0 < w.n_out; r0 += chunk) {
    const int rows = std::min(chunk, w.n_out - r0);
    const void* wt = static_cast<const uint16_t*>(w.w) + static_cast<size_t>(r0) * w.n_in;
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, 3 * n_tokens, w.n_in, &alpha, wt, CUDA_R_16BF,
                                    w.n_in, x3, CUDA_R_16BF, w.n_in, &beta, y3, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_error("GemmEx (f32 product, split bf16)", s);
    if (cudaError_t e = densedev::sum3_rows_launch(y3, n_tokens, rows, y, w.n_out, r0, stream); e != cudaSuccess)
      return cuda_error("launch sum3_rows", e);
  }
  return {};
}

Status linear_gemm(const DeviceLinear& w, const float* x, int n_tokens, float* y, bool round_out, LinearWorkspace& ws,
                   cudaStream_t stream) {
  auto* h = static_cast<cublasHandle_t>(ws.cublas);
  if (cublasStatus_t s = cublasSetStream(h, stream); s != CUBLAS_STATUS_SUCCESS) return cublas_error("set stream", s);
  if (w.f32_product && w.format == DenseFormat::kBf16 && w.act_block == 0 && f32_split_gemm_enabled()) {
    // Tokens in chunks whose x3 takes at most half the scratch (a 4096-token prefill chunk of the router or the
    // compressors, 126 MB of x3 at d = 5120, runs as 4 chunks instead of falling back to the fp32 GEMM); the rest
    // holds y3 for ≥ 128 output rows at a time, else the fp32 GEMM below.
    const size_t x3_token_nbytes = 6 * static_cast<size_t>(w.n_in);
    const int tc = static_cast<int>(std::min<size_t>(n_tokens, ws.wbuf_nbytes / 2 / x3_token_nbytes));
    const size_t x3_nbytes = (x3_token_nbytes * tc + 255) / 256 * 256;
    const size_t fit = tc > 0 && x3_nbytes < ws.wbuf_nbytes ? (ws.wbuf_nbytes - x3_nbytes) / (12 * size_t(tc)) / 128 * 128 : 0;
    if (fit > 0) {
      const int chunk = static_cast<int>(std::min<size_t>(fit, static_cast<size_t>(w.n_out)));
      for (int t0 = 0; t0 < n_tokens; t0 += tc) {
        const size_t t0s = static_cast<size_t>(t0);
        if (Status st = linear_gemm_split3(w, x + t0s * w.n_in, std::min(tc, n_tokens - t0), y + t0s * w.n_out, ws,
                                           stream, h, x3_nbytes, chunk);
            !st.ok())
          return st;
      }
      return {};
    }
  }
  // f32 products (and F32-stored weights) run a pedantic fp32 GEMM; everything else bf16 inputs.
  const bool f32 = w.f32_product || w.format == DenseFormat::kF32;
  const size_t el = f32 ? 4 : 2;
  const cudaDataType_t type = f32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t compute = f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;

  // [n_tokens, n_in] activation in the GEMM's input type (x itself when it already is).
  const void* act = x;
  if (w.act_block > 0 || !f32) {
    if (ws.act_nbytes < el * static_cast<size_t>(n_tokens) * w.n_in)
      return make_error("dense linear: workspace too small for ", n_tokens, "x", w.n_in, " activations");
    if (cudaError_t e = densedev::act_prepare_launch(x, n_tokens, w.n_in, w.act_block, ws.act, !f32, stream); e != cudaSuccess)
      return cuda_error("launch act_prepare", e);
    act = ws.act;
  }

  // The weight as stored when the GEMM can read it directly, else dequantized in row chunks.
  const bool direct = (w.format == DenseFormat::kBf16 && !f32) || w.format == DenseFormat::kF32;
  int chunk = w.n_out;
  if (!direct) {
    const size_t row_nbytes = el * static_cast<size_t>(w.n_in);
    const size_t fit = ws.wbuf_nbytes / row_nbytes / 128 * 128;
    if (fit == 0) return make_error("dense linear: weight scratch of ", ws.wbuf_nbytes, " bytes holds no 128 rows of ", w.n_in);
    chunk = static_cast<int>(std::min<size_t>(fit, static_cast<size_t>(w.n_out)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  for (int r0 = 0; r0 < w.n_out; r0 += chunk) {
    const int rows = std::min(chunk, w.n_out - r0);
    const void* wt = static_cast<const uint8_t*>(w.w) + el * static_cast<size_t>(r0) * w.n_in;
    if (!direct) {
      if (cudaError_t e = densedev::dequant_rows_launch(w, r0, rows, ws.wbuf, !f32, stream); e != cudaSuccess)
        return cuda_error("launch dequant_rows", e);
      wt = ws.wbuf;
    }
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tokens, w.n_in, &alpha, wt, type, w.n_in, act,
                                    type, w.n_in, &beta, y + r0, CUDA_R_32F, w.n_out, compute, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return cublas_error("GemmEx (dense linear)", s);
  }
  if (round_out && !w.f32_product) {
    if (cudaError_t e = densedev::round_bf16_launch(y, static_cast<size_t>(n_tokens) * w.n_out, stream); e != cudaSuccess)
      return cuda_error("launch round_bf16", e);
  }
  return {};
}

}  // namespace

Status linear_cuda(const DeviceLinear& w, const float* x, int n_tokens, float* y, bool round_out, LinearWorkspace& ws,
                   cudaStream_t stream, LinearPath path) {
  SPW_TRY(linear_cuda_check(w));
  if (n_tokens < 1) return {};
  path = resolve(path, n_tokens);
  if (path == LinearPath::kGemm) return linear_gemm(w, x, n_tokens, y, round_out, ws, stream);
  const int slice = gemv_slice_rows(w, ws);  // each row's sums stay the same
  for (int r0 = 0; r0 < n_tokens; r0 += slice)
    SPW_TRY(linear_gemv(w, x + size_t(r0) * w.n_in, std::min(slice, n_tokens - r0), y + size_t(r0) * w.n_out,
                        round_out, ws, stream));
  return {};
}

Status stacked_linear_cuda(const DeviceLinear& w, std::span<const int> part_rows, const float* x, int n_tokens,
                           std::span<float* const> ys, bool round_out, LinearWorkspace& ws, cudaStream_t stream) {
  SPW_TRY(linear_cuda_check(w));
  if (part_rows.size() < 2 || part_rows.size() > static_cast<size_t>(kMaxStackParts) || ys.size() != part_rows.size())
    return make_error("stacked linear: ", part_rows.size(), " parts and ", ys.size(), " outputs (2 to ", kMaxStackParts,
                      " parts, an output each)");
  const int block = w.format == DenseFormat::kFp8 ? w.weight_block : 1;
  long rows = 0;
  for (size_t p = 0; p < part_rows.size(); ++p) {
    if (part_rows[p] < 1 || (p + 1 < part_rows.size() && part_rows[p] % block != 0))
      return make_error("stacked linear: part ", p, " has ", part_rows[p], " rows (≥ 1, a multiple of ", block,
                        " except the last)");
    rows += part_rows[p];
  }
  if (rows != w.n_out) return make_error("stacked linear: the parts' ", rows, " rows are not the weight's ", w.n_out);
  const int slice = gemv_slice_rows(w, ws);  // as linear_cuda's kGemv
  for (int r0 = 0; r0 < n_tokens; r0 += slice) {
    float* slice_ys[kMaxStackParts];
    for (size_t p = 0; p < part_rows.size(); ++p) slice_ys[p] = ys[p] + size_t(r0) * part_rows[p];
    SPW_TRY(linear_gemv(w, x + size_t(r0) * w.n_in, std::min(slice, n_tokens - r0), nullptr, round_out, ws, stream,
                        part_rows, std::span<float* const>(slice_ys, part_rows.size())));
  }
  return {};
}

bool stack_keeps_rows(const DeviceLinear& w, std::span<const int> part_rows) {
  const int n_in = w.n_in;
  // The tensor-core path splits k by n_in alone: the same order for any rows.
  if (takes_mma(w)) return true;
  long rows = 0;
  for (int r : part_rows) rows += r;
  const int s = densedev::gemv_k_splits(rows, n_in);
  for (int r : part_rows)
    if (densedev::gemv_k_splits(r, n_in) != s) return false;
  return true;
}

bool f32_split_gemm_enabled() { return f32_split_gemm_flag.load(std::memory_order_relaxed); }
void set_f32_split_gemm(bool on) { f32_split_gemm_flag.store(on, std::memory_order_relaxed); }
bool gemv_mma_enabled() { return gemv_mma_flag.load(std::memory_order_relaxed); }
void set_gemv_mma(bool on) { gemv_mma_flag.store(on, std::memory_order_relaxed); }

bool linear_uses_gemv(LinearPath path, int n_tokens) { return resolve(path, n_tokens) == LinearPath::kGemv; }

Status grouped_proj_cuda(const uint16_t* w_a, const float* o, int n_tokens, int n_groups, int rank, int per_group,
                         float* z, bool round_out, LinearWorkspace& ws, cudaStream_t stream, LinearPath path) {
  if (n_groups < 1 || rank < 1 || per_group % 16 != 0 || per_group < 16 || !w_a)
    return make_error("grouped projection: bad shape (groups ", n_groups, ", rank ", rank, ", per_group ", per_group, ")");
  if (n_tokens < 1) return {};
  path = resolve(path, n_tokens);
  const int d_in = n_groups * per_group, d_out = n_groups * rank;
  if (path == LinearPath::kGemv) {
    // On tensor cores when the process chose them (set_gemv_mma): o as three exact bf16 planes, whatever it holds.
    // Slices as linear_cuda's kGemv: mma_slice_rows of o's three bf16 planes on tensor cores, else 16.
    const bool mma = gemv_mma_enabled() && per_group % 32 == 0 &&
                     ws.act_nbytes >= 6 * static_cast<size_t>(std::min(kGemvMaxTokens, n_tokens)) * d_in;
    const int slice = mma ? mma_slice_rows(6 * static_cast<size_t>(d_in), ws) : kGemvMaxTokens;
    for (int r0 = 0; r0 < n_tokens; r0 += slice) {
      densedev::GemvArgs a;
      a.format = DenseFormat::kBf16, a.w = w_a, a.n_out = rank, a.n_in = per_group;
      a.x = o + size_t(r0) * d_in, a.ldx = d_in, a.y = z + size_t(r0) * d_out, a.ldy = d_out;
      a.n_tokens = std::min(slice, n_tokens - r0), a.round_out = round_out;
      a.n_groups = n_groups, a.w_group_nbytes = sizeof(uint16_t) * static_cast<size_t>(rank) * per_group;
      a.x_group_off = per_group, a.y_group_off = rank;
      if (mma) {
        uint16_t* planes = static_cast<uint16_t*>(ws.act);
        if (cudaError_t e = densedev::split3_bf16_launch(a.x, static_cast<size_t>(a.n_tokens) * d_in, planes, stream);
            e != cudaSuccess)
          return cuda_error("launch split3_bf16", e);
        a.xc = planes, a.x_planes = 3;
        if (cudaError_t e = densedev::gemv_mma_launch(a, stream); e != cudaSuccess)
          return cuda_error("launch grouped mma gemv", e);
        continue;
      }
      if (cudaError_t e = densedev::gemv_launch(a, stream); e != cudaSuccess) return cuda_error("launch grouped gemv", e);
    }
    return {};
  }
  if (ws.act_nbytes < 2 * static_cast<size_t>(n_tokens) * d_in)
    return make_error("grouped projection: workspace too small for ", n_tokens, "x", d_in, " activations");
  if (cudaError_t e = densedev::act_prepare_launch(o, n_tokens, d_in, 0, ws.act, true, stream); e != cudaSuccess)
    return cuda_error("launch act_prepare", e);
  auto* h = static_cast<cublasHandle_t>(ws.cublas);
  if (cublasStatus_t s = cublasSetStream(h, stream); s != CUBLAS_STATUS_SUCCESS) return cublas_error("set stream", s);
  const float alpha = 1.0f, beta = 0.0f;
  // Group g: z_gᵀ [rank, n_tokens] (ld d_out) = W_a[g] [per_group, rank]ᵀ · o_gᵀ [per_group, n_tokens] (ld d_in).
  cublasStatus_t s = cublasGemmStridedBatchedEx(
      h, CUBLAS_OP_T, CUBLAS_OP_N, rank, n_tokens, per_group, &alpha, w_a, CUDA_R_16BF, per_group,
      static_cast<long long>(rank) * per_group, ws.act, CUDA_R_16BF, d_in, per_group, &beta, z, CUDA_R_32F, d_out, rank,
      n_groups, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) return cublas_error("GemmStridedBatchedEx (grouped projection)", s);
  if (round_out) {
    if (cudaError_t e = densedev::round_bf16_launch(z, static_cast<size_t>(n_tokens) * d_out, stream); e != cudaSuccess)
      return cuda_error("launch round_bf16", e);
  }
  return {};
}

}  // namespace spw
