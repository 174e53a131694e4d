// The CUDA tail-biting Viterbi (quantize/cuda/trellis_cuda.h) against TrellisEncoder::encode_tile
// (quantize/trellis_encode.h): for the same targets the states must be bit-identical (tolerance:
// none; both sides compute fl(fl(d·d) + M) without FMA and break ties by the first minimum), for
// K = 1..8, every codebook, Gaussian targets at the quantizer's scale, large and tiny scales,
// constant tiles (massive ties) and a tile of zeros. The packed words must equal exl3_pack_tile's.
// Guard regions after the outputs must keep their sentinel. On a mismatch the message names the
// case, the tile and the first differing position.
// Built into spw_gpu_tests (not run by ctest); a missing GPU is a failure, not a skip.
#if defined(SPW_HAVE_CUDA) && defined(SPW_HAVE_QUANTIZE_CUDA)
#include "gpu_test_util.h"
#include "quantize/cuda/trellis_cuda.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "quantize/trellis_encode.h"

namespace spw::quant {
namespace {

// Tiles of one kind: 0 Gaussian σ=1, 1 Gaussian σ=3 (clipped codebook tails), 2 σ=0.01, 3 constant
// per tile, 4 zeros.
std::vector<float> make_targets(int n_tiles, int kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> t(size_t(n_tiles) * 256);
  for (int i = 0; i < n_tiles; ++i) {
    const float c = nd(rng);
    for (int p = 0; p < 256; ++p) {
      float& v = t[size_t(i) * 256 + size_t(p)];
      switch (kind) {
        case 0: v = nd(rng); break;
        case 1: v = 3 * nd(rng); break;
        case 2: v = 0.01f * nd(rng); break;
        case 3: v = c; break;
        default: v = 0; break;
      }
    }
  }
  return t;
}

void run_case(int bits, Exl3Codebook cb, int kind, int n_tiles) {
  SCOPED_TRACE(testing::Message() << "K=" << bits << " cb=" << exl3_codebook_name(cb) << " kind=" << kind
                                  << " n_tiles=" << n_tiles);
  const std::vector<float> targets = make_targets(n_tiles, kind, 1000u * bits + 10u * kind + uint32_t(cb));
  const int guard = 64, words = 16 * bits;
  float* d_targets = nullptr;
  uint16_t *d_states = nullptr, *d_words = nullptr;
  ASSERT_EQ(cudaMalloc(&d_targets, targets.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_states, (targets.size() + guard) * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_words, (size_t(n_tiles) * words + guard) * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_targets, targets.data(), targets.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_states, 0xAB, (targets.size() + guard) * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_words, 0xAB, (size_t(n_tiles) * words + guard) * sizeof(uint16_t)), cudaSuccess);

  TrellisCudaWorkspace ws;
  auto st = trellis_cuda_workspace_alloc(ws, bits, cb, n_tiles);
  ASSERT_TRUE(st.ok()) << st.error().message;
  st = trellis_encode_tiles_cuda(d_targets, n_tiles, d_states, ws, nullptr);
  ASSERT_TRUE(st.ok()) << st.error().message;
  trellis_pack_tiles_cuda(d_states, n_tiles, bits, d_words, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> states(targets.size() + guard), packed(size_t(n_tiles) * words + guard);
  ASSERT_EQ(cudaMemcpy(states.data(), d_states, states.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(packed.data(), d_words, packed.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  trellis_cuda_workspace_free(ws);
  cudaFree(d_targets);
  cudaFree(d_states);
  cudaFree(d_words);
  for (int i = 0; i < guard; ++i) {
    ASSERT_EQ(states[targets.size() + size_t(i)], 0xABAB) << "states guard overwritten at +" << i;
    ASSERT_EQ(packed[size_t(n_tiles) * words + size_t(i)], 0xABAB) << "words guard overwritten at +" << i;
  }

  TrellisEncoder enc(bits, cb);
  const float* lut = exl3_codebook_lut_f32(cb);
  int n_mismatch = 0;
  for (int i = 0; i < n_tiles; ++i) {
    uint16_t ref[256];
    const double err_ref = enc.encode_tile(&targets[size_t(i) * 256], ref);
    const uint16_t* got = &states[size_t(i) * 256];
    int first = -1;
    for (int p = 0; p < 256 && first < 0; ++p)
      if (got[p] != ref[p]) first = p;
    if (first >= 0) {
      double err_got = 0;
      for (int p = 0; p < 256; ++p) {
        const double d = double(lut[got[p]]) - targets[size_t(i) * 256 + size_t(p)];
        err_got += d * d;
      }
      if (n_mismatch++ < 3)
        ADD_FAILURE() << "tile " << i << ": first differing position " << first << " (cpu state " << ref[first]
                      << ", cuda " << got[first] << "); squared error cpu " << err_ref << ", cuda " << err_got;
      continue;
    }
    std::vector<uint16_t> ref_words(static_cast<size_t>(words));
    exl3_pack_tile(ref, bits, ref_words.data());
    for (int w = 0; w < words; ++w)
      ASSERT_EQ(packed[size_t(i) * words + size_t(w)], ref_words[size_t(w)]) << "tile " << i << " word " << w;
  }
  EXPECT_EQ(n_mismatch, 0) << "tiles whose states differ from the CPU's";
}

TEST(QuantizeCudaTrellis, BitExactWithCpuEveryK) {
  SPW_REQUIRE_GPU();
  for (int bits = 1; bits <= 8; ++bits) run_case(bits, Exl3Codebook::kMul1, 0, bits <= 4 ? 24 : 6);
}

TEST(QuantizeCudaTrellis, BitExactWithCpuEveryCodebook) {
  SPW_REQUIRE_GPU();
  for (Exl3Codebook cb : {Exl3Codebook::k3Inst, Exl3Codebook::kMcg, Exl3Codebook::kMul1})
    for (int bits : {2, 3, 4}) run_case(bits, cb, 0, 8);
}

TEST(QuantizeCudaTrellis, BitExactOnScalesAndTies) {
  SPW_REQUIRE_GPU();
  for (int kind = 1; kind <= 4; ++kind)
    for (int bits : {2, 3}) run_case(bits, Exl3Codebook::kMul1, kind, 4);
}

// More tiles than SMs (several waves) and an odd count.
TEST(QuantizeCudaTrellis, BitExactManyTiles) {
  SPW_REQUIRE_GPU();
  run_case(3, Exl3Codebook::kMul1, 0, 333);
}

}  // namespace
}  // namespace spw::quant
#endif
