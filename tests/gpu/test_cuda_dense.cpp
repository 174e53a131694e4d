// spw_cuda_dense (cuda/dense/dense_linear.h) against the CPU reference: weights dequantized by
// formats/quant.h (dequant_fp8_blocks, dequant_mxfp4), the activation fake-quantized by fake_quant_fp8,
// then ref::matmul_nt — exactly model/linear.cpp's numerics. Random weights and ue8m0 scales; V4.1 and
// V4 real shapes and awkward ones (n_out 7/127/1023, n_in 48/160/384, n_tokens 1/3/16/17/300); both
// paths (kGemv, kGemm) wherever n_tokens ≤ 100 (kGemv past 16 in slices of 16 rows, 64 on tensor cores); a weight
// scratch small enough to force many kGemm chunks;
// an fp8 weight in mapped pinned host memory; the grouped output projection.
// Every call: guard regions around y keep their sentinel, no NaN.
// Tolerance, per output i: |y − r| ≤ 2·sqrt(n_in)·2⁻²³·Σ_k|x̂_k·w_k| (+ one bf16 ulp of |r| when the
// output is rounded, y then also bf16-exact). Why: every product x̂_k·w_k is exact in fp32 (both are
// bf16 values), so GPU and reference differ only by the order of n_in fp32 additions, each off by at
// most 2⁻²⁴ of a partial sum ≤ Σ|x̂w|; random-order errors grow like sqrt(n_in), and the factor 2 covers
// both sides. A single wrong element or scale moves y by ~Σ|x̂w|/n_in, above the bound for n_in ≲ 30000.
// The quantized activation and the dequantized weights are compared bit for bit.
// Built into spw_gpu_tests (not run by ctest); scripts/gpu_test.sh runs it on the GPU machine.
#if defined(SPW_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "cuda/dense/dense_kernels.h"
#include "cuda/dense/dense_linear.h"
#include "formats/dtypes.h"
#include "formats/quant.h"
#include "ops/ref/linalg.h"

namespace spw {
namespace {

constexpr float kSentinel = 3.0e38f;
constexpr size_t kGuard = 256;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

// A device copy of a host vector (freed by the destructor).
struct DevBuf {
  void* p = nullptr;
  DevBuf() = default;
  template <class T>
  explicit DevBuf(const std::vector<T>& v) {
    upload(v);
  }
  template <class T>
  void upload(const std::vector<T>& v) {
    EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T) + 16), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p); }
};

// A random weight in one format, and its exact f32 dequantization (the reference's l.w).
struct HostLinear {
  DeviceLinear d;  // shapes and format; pointers filled on upload
  std::vector<uint8_t> bytes, scale;
  std::vector<float> w_ref;  // [n_out, n_in]
};

HostLinear make_linear(DenseFormat f, int n_out, int n_in, int weight_block, int act_block, bool f32_product,
                       std::mt19937& rng) {
  HostLinear h;
  h.d.format = f, h.d.n_out = n_out, h.d.n_in = n_in, h.d.weight_block = weight_block, h.d.act_block = act_block;
  h.d.f32_product = f32_product;
  const size_t n = size_t(n_out) * n_in;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> bf(n);
  if (f == DenseFormat::kFp8) {
    h.bytes.resize(n);
    for (auto& b : h.bytes) {
      do b = uint8_t(rng()); while ((b & 0x7f) == 0x7f);  // no NaN codes
    }
    const size_t sr = (n_out + weight_block - 1) / weight_block, sc = (n_in + weight_block - 1) / weight_block;
    h.scale.resize(sr * sc);
    for (auto& s : h.scale) s = uint8_t(118 + rng() % 12);  // 2^-9 .. 2^2
    dequant_fp8_blocks(h.bytes.data(), h.scale.data(), n_out, n_in, weight_block, bf.data());
  } else if (f == DenseFormat::kFp4) {
    h.bytes.resize(n / 2);
    for (auto& b : h.bytes) b = uint8_t(rng());
    h.scale.resize(n / 32);
    for (auto& s : h.scale) s = uint8_t(118 + rng() % 12);
    dequant_mxfp4(h.bytes.data(), h.scale.data(), n_out, n_in, bf.data());
  } else if (f == DenseFormat::kBf16) {  // sign, exponent 2^-9..2^-5, random mantissa: one rng call each
    for (auto& v : bf) {
      const uint32_t b = rng();
      v = uint16_t((b & 0x8000u) | ((118u + (b >> 16) % 5) << 7) | (b & 0x7fu));
    }
    h.bytes.resize(n * 2);
    std::memcpy(h.bytes.data(), bf.data(), n * 2);
  }
  h.w_ref.resize(n);
  if (f == DenseFormat::kF32) {
    for (auto& v : h.w_ref) v = 0.05f * nd(rng);
    h.bytes.resize(n * 4);
    std::memcpy(h.bytes.data(), h.w_ref.data(), n * 4);
  } else {
    for (size_t i = 0; i < n; ++i) h.w_ref[i] = bf16_to_f32(bf[i]);
  }
  return h;
}

// Activations with block magnitudes spread over 2^-6..2^6 (each 32-block its own scale).
std::vector<float> make_x(int n_tokens, int n_in, bool bf16_exact, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(n_tokens) * n_in);
  for (size_t b = 0; b < x.size(); b += 16) {
    const float mag = std::ldexp(1.0f, int(rng() % 13) - 6);
    for (size_t i = b; i < b + 16 && i < x.size(); ++i) x[i] = bf16_exact ? round_bf16(mag * nd(rng)) : mag * nd(rng);
  }
  return x;
}

float bf16_ulp(float a) { return a > 0 ? std::ldexp(1.0f, std::ilogb(a) - 7) : 0.0f; }

// Checks y [n_tokens, n_out] against the pre-rounding reference r and magnitudes mag (see the header).
void expect_close(const std::vector<float>& y, const std::vector<float>& r, const std::vector<float>& mag, int n_out,
                  int n_in, bool rounded, const std::string& what) {
  const double c = 2.0 * std::sqrt(double(n_in)) * std::ldexp(1.0, -23);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double bound = c * mag[i] + 1e-37;
    if (rounded) bound += bf16_ulp(std::fabs(r[i]) + float(bound));
    const bool ok = !std::isnan(y[i]) && std::fabs(double(y[i]) - r[i]) <= bound && (!rounded || y[i] == round_bf16(y[i]));
    if (!ok && bad++ == 0) first = i;
  }
  if (bad) {
    const double bound = c * mag[first];
    ADD_FAILURE() << what << ": " << bad << " of " << y.size() << " outputs off; first at token " << first / n_out
                  << " row " << first % n_out << ": gpu " << y[first] << " ref " << r[first] << " |diff| "
                  << std::fabs(double(y[first]) - r[first]) << " bound " << bound << (rounded ? " + 1 bf16 ulp" : "");
  }
}

// Runs y = linear_cuda(...) with guard regions; returns y (empty on a failed call).
std::vector<float> run_linear(const DeviceLinear& d, const DevBuf& dx, int n_tokens, bool round_out, LinearWorkspace& ws,
                              LinearPath path, const std::string& what) {
  const size_t ny = size_t(n_tokens) * d.n_out;
  std::vector<float> yh(ny + 2 * kGuard, kSentinel);
  DevBuf dy(yh);
  float* y = static_cast<float*>(dy.p) + kGuard;
  Status st = linear_cuda(d, static_cast<const float*>(dx.p), n_tokens, y, round_out, ws, nullptr, path);
  if (!st.ok()) {
    ADD_FAILURE() << what << ": " << st.error().message;
    return {};
  }
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(yh.data(), dy.p, yh.size() * sizeof(float), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    ADD_FAILURE() << what << ": " << cudaGetErrorString(e);
    return {};
  }
  for (size_t i = 0; i < kGuard; ++i) {
    if (yh[i] != kSentinel || yh[kGuard + ny + i] != kSentinel) {
      ADD_FAILURE() << what << ": guard region overwritten at offset " << i;
      return {};
    }
  }
  return std::vector<float>(yh.begin() + kGuard, yh.begin() + kGuard + ny);
}

std::string case_name(const DeviceLinear& d, int n_tokens) {
  return std::string(dense_format_name(d.format)) + " " + std::to_string(d.n_in) + "->" + std::to_string(d.n_out) +
         " wblock " + std::to_string(d.weight_block) + " ablock " + std::to_string(d.act_block) +
         (d.f32_product ? " f32-product" : "") + " tokens " + std::to_string(n_tokens);
}

// One weight, several token counts, each through every applicable path; round_out alternates.
void run_case(DenseFormat f, int n_out, int n_in, int weight_block, int act_block, bool f32_product,
              const std::vector<int>& token_counts, LinearWorkspace& ws, uint32_t seed, bool pinned = false) {
  std::mt19937 rng(seed);
  HostLinear h = make_linear(f, n_out, n_in, weight_block, act_block, f32_product, rng);
  DevBuf dw, ds;
  void* host_w = nullptr;
  if (pinned) {  // the weight read over PCIe from mapped pinned host memory
    ASSERT_EQ(cudaHostAlloc(&host_w, h.bytes.size(), cudaHostAllocMapped), cudaSuccess);
    std::memcpy(host_w, h.bytes.data(), h.bytes.size());
    ASSERT_EQ(cudaHostGetDevicePointer(&dw.p, host_w, 0), cudaSuccess);
  } else {
    dw.upload(h.bytes);
  }
  if (!h.scale.empty()) ds.upload(h.scale);
  h.d.w = dw.p, h.d.scale = static_cast<const uint8_t*>(ds.p);
  ASSERT_TRUE(linear_cuda_check(h.d).ok()) << case_name(h.d, 0) << ": " << linear_cuda_check(h.d).error().message;

  for (size_t ti = 0; ti < token_counts.size(); ++ti) {
    const int T = token_counts[ti];
    const bool bf16_x = !f32_product && act_block == 0;  // the kGemm contract for unquantized bf16 products
    std::vector<float> x = make_x(T, n_in, bf16_x, rng);
    std::vector<float> xq = x;
    if (act_block > 0)
      for (int t = 0; t < T; ++t) fake_quant_fp8(xq.data() + size_t(t) * n_in, n_in, act_block);
    std::vector<float> r(size_t(T) * n_out), mag(size_t(T) * n_out), xa(xq.size()), wa(h.w_ref.size());
    ref::matmul_nt(xq.data(), h.w_ref.data(), r.data(), T, n_in, n_out);
    for (size_t i = 0; i < xq.size(); ++i) xa[i] = std::fabs(xq[i]);
    for (size_t i = 0; i < wa.size(); ++i) wa[i] = std::fabs(h.w_ref[i]);
    ref::matmul_nt(xa.data(), wa.data(), mag.data(), T, n_in, n_out);

    DevBuf dx(x);
    const bool round_out = (ti + seed) % 2 == 0;
    const bool rounded = round_out && !f32_product;
    for (LinearPath path : {LinearPath::kGemv, LinearPath::kGemm}) {
      if (path == LinearPath::kGemv && T > 100) continue;  // slices of 16 (64 on tensor cores): 17 to 100 cover it
      const std::string what = case_name(h.d, T) + " path " + linear_path_name(path) + (round_out ? " round_out" : "") +
                               (pinned ? " pinned-host weight" : "");
      std::vector<float> y = run_linear(h.d, dx, T, round_out, ws, path, what);
      if (!y.empty()) expect_close(y, r, mag, n_out, n_in, rounded, what);
    }
  }
  if (pinned) {
    cudaFreeHost(host_w);
    dw.p = nullptr;
  }
}

// Sets the FP8 decode path for a scope (dense_linear.h: set_gemv_mma), restoring the previous one.
struct GemvMmaScope {
  explicit GemvMmaScope(bool on) : was(gemv_mma_enabled()) { set_gemv_mma(on); }
  ~GemvMmaScope() { set_gemv_mma(was); }
  bool was;
};

class CudaDense : public testing::Test {
 protected:
  void SetUp() override {
    SPW_REQUIRE_GPU();
    Status st = linear_workspace_alloc(ws_, 512, 15360);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  void TearDown() override { linear_workspace_free(ws_); }
  LinearWorkspace ws_;
};

// V4.1-Flash (fp8 32×32 weight blocks, activation blocks of 32), spec §2.3.
TEST_F(CudaDense, V41RealShapes) {
  for (bool mma : {false, true}) {  // both FP8 decode paths (dense_linear.h: set_gemv_mma)
    SCOPED_TRACE(mma ? "tensor-core FP8 GEMV" : "scalar FP8 GEMV");
    GemvMmaScope scope(mma);
    const std::vector<int> tokens = {1, 4, 16, 17, 64};
    run_case(DenseFormat::kFp8, 1280, 5120, 32, 32, false, tokens, ws_, 101);    // attn.wq_a
    run_case(DenseFormat::kFp8, 32768, 1280, 32, 32, false, {1, 16, 17}, ws_, 102);  // attn.wq_b
    run_case(DenseFormat::kFp8, 512, 5120, 32, 32, false, tokens, ws_, 103);     // attn.wkv
    run_case(DenseFormat::kFp8, 5120, 8192, 32, 32, false, tokens, ws_, 104);    // attn.wo_b
    run_case(DenseFormat::kFp8, 2304, 5120, 32, 32, false, tokens, ws_, 105);    // shared w1 / w3
    run_case(DenseFormat::kFp8, 5120, 2304, 32, 32, false, tokens, ws_, 106);    // shared w2
    run_case(DenseFormat::kFp8, 4096, 1280, 32, 32, false, tokens, ws_, 107);    // indexer wq_b
    run_case(DenseFormat::kFp4, 2304, 5120, 0, 32, false, tokens, ws_, 108);     // expert w1 / w3 (MXFP4)
    run_case(DenseFormat::kFp4, 5120, 2304, 0, 32, false, tokens, ws_, 109);     // expert w2
    run_case(DenseFormat::kBf16, 384, 5120, 0, 0, true, tokens, ws_, 110);       // ffn.gate (router, f32 product)
    run_case(DenseFormat::kBf16, 32, 5120, 0, 0, false, tokens, ws_, 111);       // indexer weights_proj
    run_case(DenseFormat::kBf16, 129280, 5120, 0, 0, true, {1, 4}, ws_, 112);    // head (f32 product)
  }
}

// f32-product bf16 weights on the kGemm path (more than 16 tokens) through three bf16 planes on tensor cores
// (dense_linear.h: set_f32_split_gemm) against the reference, with the same bound as the fp32 GEMM: every product
// is exact, only the summation differs. Sizes: the router and the head of V4.1 (at 64 tokens its y3 takes two
// chunks of the 64 MB scratch), an awkward k (two 512 tiles + 16) and 512 tokens.
TEST_F(CudaDense, F32ProductSplitGemm) {
  struct Scope {
    Scope() : was(f32_split_gemm_enabled()) { set_f32_split_gemm(true); }
    ~Scope() { set_f32_split_gemm(was); }
    bool was;
  } scope;
  run_case(DenseFormat::kBf16, 384, 5120, 0, 0, true, {17, 64}, ws_, 601);     // ffn.gate (router)
  run_case(DenseFormat::kBf16, 129280, 5120, 0, 0, true, {17, 64}, ws_, 602);  // head
  run_case(DenseFormat::kBf16, 1023, 1040, 0, 0, true, {17, 300}, ws_, 603);
  run_case(DenseFormat::kBf16, 4096, 5120, 0, 0, true, {300, 512}, ws_, 604);
  // Token chunks (x3 in at most half the scratch): with a 1 MB scratch, 300 tokens of k = 5120 run as 17 chunks
  // of 17 and one of 11; 300 tokens of k = 1040 as three chunks of 84 and one of 48, each with y3 in two chunks of
  // output rows (512 + 511).
  LinearWorkspace small;
  ASSERT_TRUE(linear_workspace_alloc(small, 512, 5120, size_t(1) << 20).ok());
  run_case(DenseFormat::kBf16, 384, 5120, 0, 0, true, {17, 300}, small, 605);
  run_case(DenseFormat::kBf16, 1023, 1040, 0, 0, true, {40, 300}, small, 606);
  linear_workspace_free(small);
}

// V4-Flash (fp8 128×128 weight blocks, activation blocks of 128), spec §2.2.
TEST_F(CudaDense, V4RealShapes) {
  for (bool mma : {false, true}) {  // both FP8 decode paths (dense_linear.h: set_gemv_mma)
    SCOPED_TRACE(mma ? "tensor-core FP8 GEMV" : "scalar FP8 GEMV");
    GemvMmaScope scope(mma);
    const std::vector<int> tokens = {1, 3, 16, 17, 64};
    run_case(DenseFormat::kFp8, 1024, 4096, 128, 128, false, tokens, ws_, 201);  // attn.wq_a
    run_case(DenseFormat::kFp8, 512, 4096, 128, 128, false, tokens, ws_, 202);   // attn.wkv
    run_case(DenseFormat::kFp8, 4096, 8192, 128, 128, false, tokens, ws_, 203);  // attn.wo_b
    run_case(DenseFormat::kFp4, 2048, 4096, 0, 128, false, tokens, ws_, 204);    // expert w1
    run_case(DenseFormat::kF32, 1024, 4096, 0, 0, true, tokens, ws_, 205);       // F32-stored weight
  }
}

TEST_F(CudaDense, AwkwardSizes) {
  for (bool mma : {false, true}) {  // both FP8 decode paths (dense_linear.h: set_gemv_mma)
    SCOPED_TRACE(mma ? "tensor-core FP8 GEMV" : "scalar FP8 GEMV");
    GemvMmaScope scope(mma);
    const std::vector<int> tokens = {1, 2, 3, 16, 17, 300};
    uint32_t seed = 300;
    for (int n_out : {1, 7, 127, 1023}) {
      run_case(DenseFormat::kFp8, n_out, 384, 128, 128, false, tokens, ws_, ++seed);
      run_case(DenseFormat::kFp8, n_out, 160, 128, 32, false, tokens, ws_, ++seed);  // partial 128-block in k
      run_case(DenseFormat::kFp8, n_out, 160, 32, 32, false, tokens, ws_, ++seed);
      run_case(DenseFormat::kFp4, n_out, 160, 0, 32, false, tokens, ws_, ++seed);
      run_case(DenseFormat::kBf16, n_out, 48, 0, 0, false, tokens, ws_, ++seed);
      run_case(DenseFormat::kBf16, n_out, 1040, 0, 0, true, tokens, ws_, ++seed);  // k tiles 512 + 512 + 16
      run_case(DenseFormat::kF32, n_out, 128, 0, 0, true, tokens, ws_, ++seed);
      run_case(DenseFormat::kFp8, n_out, 128, 128, 0, false, tokens, ws_, ++seed);  // fake quant off
      run_case(DenseFormat::kFp8, n_out, 2080, 128, 32, false, tokens, ws_, ++seed);  // k split in 2, the second shorter
    }
  }
}

// kGemv's rows do not depend on how many tokens share the call: each token's outputs, computed alone
// (the streaming kernel, 1 token), in pairs (streaming, 2 tokens), in runs of 17 and in one call of 70 (scalar:
// slices of 16 and one of 6, the staged kernel; tensor cores: a launch of 64 tokens, eight n tiles — the shared-x
// kernels where the weight has the rows for them, wq_b and the 17000-row BF16 ones — and one of 6) are
// bit-identical, with and without a k split. Batched decode relies on this (EngineBatch's decode-vs-alone tests).
TEST_F(CudaDense, GemvTokenCountDoesNotChangeRows) {
  for (bool mma : {false, true}) {  // both FP8 decode paths (dense_linear.h: set_gemv_mma)
    SCOPED_TRACE(mma ? "tensor-core FP8 GEMV" : "scalar FP8 GEMV");
    GemvMmaScope scope(mma);
    struct Shape {
      DenseFormat f;
      int n_out, n_in, weight_block, act_block;
      bool f32_product;
    };
    const Shape shapes[] = {
        {DenseFormat::kFp8, 5120, 8192, 32, 32, false},   // V4.1 attn.wo_b: 2 rows per warp when streaming
        {DenseFormat::kFp8, 32768, 1280, 32, 32, false},  // V4.1 attn.wq_b: 4 rows per warp, a half tile at the end
        {DenseFormat::kFp8, 1023, 160, 128, 32, false},   // awkward: 1 row per warp, partial rows and tiles
        {DenseFormat::kFp4, 2304, 5120, 0, 32, false},
        {DenseFormat::kBf16, 1000, 1040, 0, 0, true},
        {DenseFormat::kFp8, 512, 5120, 128, 128, false},  // V4.1 attn.wkv: k split over 4 blocks
        {DenseFormat::kBf16, 300, 2080, 0, 0, true},      // k split over 2 blocks, the second shorter
        {DenseFormat::kF32, 384, 5120, 0, 0, true},       // f32 (staged kernel at every token count), split 4
        {DenseFormat::kBf16, 500, 1024, 0, 0, false},     // bf16 activations: one plane on tensor cores
        // Rows enough for the shared-x kernels past 16 tokens (dense_gemv_mma_wide.cu: ≥ 132 blocks of 128 rows),
        // as the head takes them: three planes (f32 product, k split over 2 warps there) and one.
        {DenseFormat::kBf16, 17000, 1024, 0, 0, true},
        {DenseFormat::kBf16, 17000, 256, 0, 0, false},
    };
    constexpr int kTokens = 70;
    uint32_t seed = 700;
    for (const Shape& sh : shapes) {
      std::mt19937 rng(++seed);
      HostLinear h = make_linear(sh.f, sh.n_out, sh.n_in, sh.weight_block, sh.act_block, sh.f32_product, rng);
      DevBuf dw(h.bytes), ds;
      if (!h.scale.empty()) ds.upload(h.scale);
      h.d.w = dw.p, h.d.scale = static_cast<const uint8_t*>(ds.p);
      const std::vector<float> x = make_x(kTokens, sh.n_in, true, rng);
      const std::string what = case_name(h.d, kTokens);
      DevBuf dx(x);
      const std::vector<float> all = run_linear(h.d, dx, kTokens, false, ws_, LinearPath::kGemv, what);
      ASSERT_EQ(all.size(), size_t(kTokens) * sh.n_out) << what;
      for (int t0 = 0; t0 < kTokens; ++t0) {
        for (int n : {1, 2, 17}) {
          if (t0 + n > kTokens || (n == 17 && t0 % 13 != 0)) continue;
          DevBuf part(std::vector<float>(x.begin() + size_t(t0) * sh.n_in, x.begin() + size_t(t0 + n) * sh.n_in));
          const std::vector<float> y = run_linear(h.d, part, n, false, ws_, LinearPath::kGemv, what);
          ASSERT_EQ(y.size(), size_t(n) * sh.n_out) << what;
          size_t differ = 0;
          for (size_t i = 0; i < y.size(); ++i)
            differ += std::memcmp(&y[i], &all[size_t(t0) * sh.n_out + i], sizeof(float)) != 0;
          EXPECT_EQ(differ, 0u) << what << ": tokens " << t0 << ".." << t0 + n - 1 << " alone, " << differ
                                << " outputs differ from the 70-token call";
        }
      }
    }
  }
}

// Weights on one input, stacked (each part's rows in turn; scales likewise) and run in one launch
// (stacked_linear_cuda), give outputs bit-identical to linear_cuda on each part, into outputs with their own
// row strides and untouched guards; bad part lists are refused. The engine stacks wq_a + wkv, wq_b + the
// indexer's wq_b, the shared expert's w1 + w3 (FP8) and up to four compressor projections (BF16, f32 products)
// this way (engine/device_weights.cpp), only where stack_keeps_rows holds.
TEST_F(CudaDense, StackedLinearMatchesOneCallPerPart) {
  for (bool mma : {false, true}) {  // both FP8 decode paths (dense_linear.h: set_gemv_mma)
    SCOPED_TRACE(mma ? "tensor-core FP8 GEMV" : "scalar FP8 GEMV");
    GemvMmaScope scope(mma);
    struct Stack {
      DenseFormat f;
      std::vector<int> rows;
      int n_in, block;
      bool f32_product;
    };
    const Stack stacks[] = {
        {DenseFormat::kFp8, {1280, 512}, 5120, 32, false},                // V4.1 wq_a + wkv
        {DenseFormat::kFp8, {2304, 2304}, 5120, 32, false},               // V4.1 shared w1 + w3
        {DenseFormat::kFp8, {32768, 4096}, 1280, 32, false},              // V4.1 wq_b + indexer wq_b (persistent kernel)
        {DenseFormat::kFp8, {1024, 512}, 4096, 128, false},               // V4 wq_a + wkv
        {DenseFormat::kBf16, {1024, 1024, 256, 256}, 4096, 0, true},      // V4 CSA compressors + indexer compressors
        {DenseFormat::kBf16, {512, 512}, 5120, 0, true},                  // V4.1 ratio-2 compressor
        {DenseFormat::kFp8, {256, 128, 96}, 160, 32, false},              // awkward: partial tiles, a short last part
    };
    uint32_t seed = 900;
    for (const Stack& sk : stacks) {
      std::mt19937 rng(++seed);
      const int act_block = sk.f == DenseFormat::kFp8 ? sk.block : 0;
      DeviceLinear like;
      like.format = sk.f, like.n_in = sk.n_in, like.weight_block = sk.block, like.act_block = act_block;
      ASSERT_TRUE(stack_keeps_rows(like, sk.rows)) << sk.rows[0] << "+...";
      std::vector<HostLinear> parts;
      std::vector<uint8_t> w, sc;
      int total = 0;
      for (int r : sk.rows) {
        parts.push_back(make_linear(sk.f, r, sk.n_in, sk.block, act_block, sk.f32_product, rng));
        w.insert(w.end(), parts.back().bytes.begin(), parts.back().bytes.end());
        sc.insert(sc.end(), parts.back().scale.begin(), parts.back().scale.end());
        total += r;
      }
      DevBuf dw(w), ds;
      if (!sc.empty()) ds.upload(sc);
      const auto* wp = static_cast<const uint8_t*>(dw.p);
      const auto* sp = static_cast<const uint8_t*>(ds.p);
      DeviceLinear st = parts[0].d;
      st.w = wp, st.scale = sp, st.n_out = total;
      for (HostLinear& h : parts) {
        h.d.w = wp, h.d.scale = sp;
        wp += h.bytes.size(), sp += h.scale.size();
      }
      std::string name = std::string(dense_format_name(sk.f)) + " stack";
      for (int r : sk.rows) name += " " + std::to_string(r);
      name += " x" + std::to_string(sk.n_in);
      // 40: scalar slices of 16, 16 and 8; one tensor-core launch (shared x for wq_b + indexer wq_b)
      for (int n : {1, 2, 5, 16, 40}) {
        const std::string what = name + ", tokens " + std::to_string(n);
        const std::vector<float> x = make_x(n, sk.n_in, true, rng);
        DevBuf dx(x);
        // guard, y_0, guard, y_1, ..., guard
        size_t len = kGuard;
        std::vector<size_t> at;
        for (int r : sk.rows) at.push_back(len), len += size_t(n) * r + kGuard;
        std::vector<float> out(len, kSentinel);
        DevBuf dout(out);
        std::vector<float*> ys;
        for (size_t off : at) ys.push_back(static_cast<float*>(dout.p) + off);
        Status s = stacked_linear_cuda(st, sk.rows, static_cast<const float*>(dx.p), n, ys, true, ws_, nullptr);
        ASSERT_TRUE(s.ok()) << what << ": " << s.error().message;
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(out.data(), dout.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
        for (size_t p = 0; p < parts.size(); ++p) {
          const std::vector<float> y = run_linear(parts[p].d, dx, n, true, ws_, LinearPath::kGemv, what);
          const size_t m = size_t(n) * sk.rows[p];
          ASSERT_EQ(y.size(), m) << what;
          EXPECT_EQ(std::memcmp(out.data() + at[p], y.data(), m * sizeof(float)), 0) << what << ": part " << p << " differs";
          for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(out[at[p] - kGuard + i], kSentinel) << what << ": guard before part " << p;
        }
        for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(out[len - kGuard + i], kSentinel) << what << ": guard after the last part";
      }
      std::vector<float> x1 = make_x(1, sk.n_in, true, rng);
      DevBuf dx1(x1), dy(std::vector<float>(size_t(total), 0.f));
      const float* xp = static_cast<const float*>(dx1.p);
      std::vector<float*> ys(sk.rows.size(), static_cast<float*>(dy.p));
      std::vector<int> wrong = sk.rows;
      wrong.back() += 1;
      EXPECT_FALSE(stacked_linear_cuda(st, wrong, xp, 1, ys, true, ws_, nullptr).ok()) << name << ": rows ≠ the weight's";
      EXPECT_FALSE(stacked_linear_cuda(st, std::vector<int>{total}, xp, 1, std::vector<float*>{ys[0]}, true, ws_, nullptr).ok())
          << name << ": one part";
      EXPECT_FALSE(stacked_linear_cuda(st, sk.rows, xp, 1, std::span<float* const>(ys).first(1), true, ws_, nullptr).ok())
          << name << ": fewer outputs than parts";
      if (sk.f == DenseFormat::kFp8) {
        std::vector<int> inside = sk.rows;
        inside[0] += 1, inside[1] -= 1;
        EXPECT_FALSE(stacked_linear_cuda(st, inside, xp, 1, ys, true, ws_, nullptr).ok())
            << name << ": a part boundary inside a weight block";
      }
    }
    // Parts whose k splits differ from the stack's would change the rows' sums: not stackable (the scalar kernel
    // splits k by the rows); the tensor-core FP8 and BF16 paths split by n_in alone, so any rows stack there.
    DeviceLinear bf16;
    bf16.format = DenseFormat::kBf16, bf16.n_in = 5120;
    EXPECT_EQ(stack_keeps_rows(bf16, std::vector<int>{32768, 512}), mma);
    DeviceLinear fp8 = bf16;
    fp8.format = DenseFormat::kFp8, fp8.weight_block = 32, fp8.act_block = 32;
    EXPECT_EQ(stack_keeps_rows(fp8, std::vector<int>{32768, 512}), mma);
  }
}

// A weight scratch of 128 f32 rows of 1280: kGemm dequantizes wq_b in 256 (bf16) or 128 (f32) row chunks.
TEST_F(CudaDense, ChunkedPrefill) {
  LinearWorkspace small;
  ASSERT_TRUE(linear_workspace_alloc(small, 512, 5120, size_t(128) * 1280 * 4).ok());
  run_case(DenseFormat::kFp8, 32768, 1280, 32, 32, false, {1, 33}, small, 401);
  run_case(DenseFormat::kFp4, 1000, 1280, 0, 32, true, {2, 300}, small, 402);
  LinearWorkspace tiny;
  ASSERT_TRUE(linear_workspace_alloc(tiny, 16, 1280, 1024).ok());
  DeviceLinear d;
  d.format = DenseFormat::kFp8, d.n_out = 256, d.n_in = 1280, d.weight_block = 32, d.act_block = 32;
  std::vector<uint8_t> zeros(256 * 1280);
  DevBuf dw(zeros), dx(std::vector<float>(16 * 1280)), dy(std::vector<float>(16 * 256));
  d.w = dw.p, d.scale = static_cast<const uint8_t*>(dw.p);
  EXPECT_FALSE(linear_cuda(d, static_cast<const float*>(dx.p), 16, static_cast<float*>(dy.p), true, tiny, nullptr,
                           LinearPath::kGemm).ok())
      << "a scratch below 128 rows must be an error";
  linear_workspace_free(tiny);
  linear_workspace_free(small);
}

TEST_F(CudaDense, PinnedHostWeight) { run_case(DenseFormat::kFp8, 1280, 5120, 32, 32, false, {1, 4}, ws_, 501, true); }

// The grouped low-rank output projection against model/attention.cpp's per-group matmul_nt.
void run_grouped(int G, int R, int P, const std::vector<int>& token_counts, LinearWorkspace& ws, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> wa(size_t(G) * R * P);
  for (auto& v : wa) v = f32_to_bf16(0.02f * nd(rng));
  DevBuf dw(wa);
  for (size_t ti = 0; ti < token_counts.size(); ++ti) {
    const int T = token_counts[ti];
    std::vector<float> o = make_x(T, G * P, true, rng);  // the attention output is bf16
    std::vector<float> r(size_t(T) * G * R), mag(r.size());
    std::vector<float> og(size_t(T) * P), oa(og.size()), wg(size_t(R) * P), wga(wg.size()), zg(size_t(T) * R), za(zg.size());
    for (int g = 0; g < G; ++g) {
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < P; ++k) og[size_t(t) * P + k] = o[size_t(t) * G * P + size_t(g) * P + k], oa[size_t(t) * P + k] = std::fabs(og[size_t(t) * P + k]);
      for (size_t i = 0; i < wg.size(); ++i) wg[i] = bf16_to_f32(wa[size_t(g) * R * P + i]), wga[i] = std::fabs(wg[i]);
      ref::matmul_nt(og.data(), wg.data(), zg.data(), T, P, R);
      ref::matmul_nt(oa.data(), wga.data(), za.data(), T, P, R);
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < R; ++j) r[size_t(t) * G * R + size_t(g) * R + j] = zg[size_t(t) * R + j], mag[size_t(t) * G * R + size_t(g) * R + j] = za[size_t(t) * R + j];
    }
    DevBuf dx(o);
    const bool round_out = ti % 2 == 1;
    for (LinearPath path : {LinearPath::kGemv, LinearPath::kGemm}) {
      if (path == LinearPath::kGemv && T > 100) continue;  // slices of 16 (64 on tensor cores): 17 to 100 cover it
      const std::string what = "grouped G=" + std::to_string(G) + " rank=" + std::to_string(R) + " per_group=" +
                               std::to_string(P) + " tokens " + std::to_string(T) + " path " + linear_path_name(path) +
                               (round_out ? " round_out" : "");
      const size_t nz = size_t(T) * G * R;
      std::vector<float> zh(nz + 2 * kGuard, kSentinel);
      DevBuf dz(zh);
      Status st = grouped_proj_cuda(static_cast<const uint16_t*>(dw.p), static_cast<const float*>(dx.p), T, G, R, P,
                                    static_cast<float*>(dz.p) + kGuard, round_out, ws, nullptr, path);
      ASSERT_TRUE(st.ok()) << what << ": " << st.error().message;
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaMemcpy(zh.data(), dz.p, zh.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < kGuard; ++i) {
        ASSERT_EQ(zh[i], kSentinel) << what << ": guard before z at " << i;
        ASSERT_EQ(zh[kGuard + nz + i], kSentinel) << what << ": guard after z at " << i;
      }
      expect_close(std::vector<float>(zh.begin() + kGuard, zh.begin() + kGuard + nz), r, mag, G * R, P, round_out, what);
    }
  }
}

TEST_F(CudaDense, GroupedOutputProjection) {
  for (bool mma : {false, true}) {  // both decode paths (dense_linear.h: set_gemv_mma); 48 and 528 stay scalar
    SCOPED_TRACE(mma ? "tensor-core GEMV" : "scalar GEMV");
    GemvMmaScope scope(mma);
    run_grouped(8, 1024, 4096, {1, 16, 17, 100}, ws_, 601);  // V4.1 / V4: 8 groups of rank 1024 over 64·512/8
    run_grouped(3, 7, 48, {1, 5, 17}, ws_, 602);
    run_grouped(2, 130, 528, {3, 40}, ws_, 603);
    run_grouped(3, 7, 64, {1, 9, 17}, ws_, 604);
    run_grouped(2, 130, 512, {3, 40}, ws_, 605);
  }
}

// The activation fake quant on the GPU is fake_quant_fp8 bit for bit, including the scale hazards:
// amax exactly 448·2^k, blocks below the 1e-4 floor, zeros, e4m3 ties and subnormals.
TEST_F(CudaDense, ActivationQuantBitExact) {
  for (int block : {32, 128}) {
    const int T = 5, n_in = 1024;
    std::mt19937 rng(700 + block);
    std::vector<float> x = make_x(T, n_in, false, rng);
    for (int b = 0; b < T * n_in / block; ++b) {
      float* p = x.data() + size_t(b) * block;
      switch (b % 6) {
        case 0: p[b % block] = 448.0f * std::ldexp(1.0f, b % 7 - 3); break;    // amax on a power of two times 448
        case 1: for (int i = 0; i < block; ++i) p[i] *= 1e-7f; break;          // below the amax floor
        case 2: for (int i = 0; i < block; ++i) p[i] = 0.0f; break;
        case 3:  // s = 1 and e4m3 ties (midpoints of the 1/8 grid on [1, 2))
          p[0] = 300.0f;
          for (int i = 1; i < block; ++i) p[i] = (i % 2 ? -1.0f : 1.0f) * (1.0f + (2 * (i % 8) + 1) / 16.0f);
          break;
        case 4: p[0] = 400.0f; for (int i = 1; i < block; ++i) p[i] = std::ldexp(float(i), -12); break;  // subnormal codes
        default: break;
      }
    }
    std::vector<float> ref = x;
    for (int t = 0; t < T; ++t) fake_quant_fp8(ref.data() + size_t(t) * n_in, n_in, block);
    DevBuf dx(x), dq(std::vector<float>(x.size())), db(std::vector<uint16_t>(x.size()));
    CUDA_OK(densedev::act_prepare_launch(static_cast<const float*>(dx.p), T, n_in, block, dq.p, false, nullptr));
    CUDA_OK(densedev::act_prepare_launch(static_cast<const float*>(dx.p), T, n_in, block, db.p, true, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> q(x.size());
    std::vector<uint16_t> qb(x.size());
    CUDA_OK(cudaMemcpy(q.data(), dq.p, q.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(qb.data(), db.p, qb.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(std::memcmp(&q[i], &ref[i], 4), 0) << "block " << block << " element " << i << " (token " << i / n_in
                                                    << ", k " << i % n_in << "): x " << x[i] << " gpu " << q[i] << " ref " << ref[i];
      ASSERT_EQ(bf16_to_f32(qb[i]), ref[i]) << "bf16 output, block " << block << " element " << i;
    }
  }
}

// The GEMM scratch dequantization reproduces formats/quant.h bit for bit (every fp8 code and fp4 nibble).
TEST_F(CudaDense, DequantBitExact) {
  std::mt19937 rng(800);
  for (auto [f, wb] : {std::pair{DenseFormat::kFp8, 32}, std::pair{DenseFormat::kFp8, 128}, std::pair{DenseFormat::kFp4, 0}}) {
    HostLinear h = make_linear(f, 300, 512, wb, 32, false, rng);
    if (f == DenseFormat::kFp8)
      for (size_t i = 0; i < 256; ++i) h.bytes[i] = (i & 0x7f) == 0x7f ? 0 : uint8_t(i);  // every finite code
    if (f == DenseFormat::kFp8) {
      std::vector<uint16_t> bf(h.w_ref.size());
      dequant_fp8_blocks(h.bytes.data(), h.scale.data(), 300, 512, wb, bf.data());
      for (size_t i = 0; i < bf.size(); ++i) h.w_ref[i] = bf16_to_f32(bf[i]);
    }
    DevBuf dw(h.bytes), ds(h.scale), df(std::vector<float>(h.w_ref.size())), db(std::vector<uint16_t>(h.w_ref.size()));
    h.d.w = dw.p, h.d.scale = static_cast<const uint8_t*>(ds.p);
    CUDA_OK(densedev::dequant_rows_launch(h.d, 0, 300, df.p, false, nullptr));
    CUDA_OK(densedev::dequant_rows_launch(h.d, 0, 300, db.p, true, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> wf(h.w_ref.size());
    std::vector<uint16_t> wbits(h.w_ref.size());
    CUDA_OK(cudaMemcpy(wf.data(), df.p, wf.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(wbits.data(), db.p, wbits.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < wf.size(); ++i) {
      ASSERT_EQ(wf[i], h.w_ref[i]) << dense_format_name(f) << " wblock " << wb << " row " << i / 512 << " col " << i % 512;
      ASSERT_EQ(bf16_to_f32(wbits[i]), h.w_ref[i]) << dense_format_name(f) << " bf16 scratch, row " << i / 512 << " col " << i % 512;
    }
  }
}

TEST(CudaDenseLimits, RejectsUnsupported) {
  uint8_t dummy[64] = {};
  DeviceLinear d;
  d.format = DenseFormat::kFp8, d.n_out = 8, d.n_in = 48, d.w = dummy, d.scale = dummy, d.act_block = 0;
  EXPECT_FALSE(linear_cuda_check(d).ok()) << "fp8 n_in 48 is not a multiple of 32";
  d.n_in = 64, d.weight_block = 64;
  EXPECT_FALSE(linear_cuda_check(d).ok()) << "weight_block 64";
  d.weight_block = 128, d.act_block = 128;
  EXPECT_FALSE(linear_cuda_check(d).ok()) << "act_block 128 does not divide 64";
  d.act_block = 32, d.scale = nullptr;
  EXPECT_FALSE(linear_cuda_check(d).ok()) << "fp8 without scales";
  d.format = DenseFormat::kBf16, d.n_in = 40, d.act_block = 0;
  EXPECT_FALSE(linear_cuda_check(d).ok()) << "bf16 n_in 40";
  d.n_in = 48;
  EXPECT_TRUE(linear_cuda_check(d).ok());
}

}  // namespace
}  // namespace spw
#endif  // SPW_HAVE_CUDA
