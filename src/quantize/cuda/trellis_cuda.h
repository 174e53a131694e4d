// The tail-biting Viterbi trellis search on the GPU: one thread block per 16×16 tile, every tile
// of a launch in parallel. Same algorithm, same fp32 roundings and same tie-breaking as
// TrellisEncoder::encode_tile (quantize/trellis_encode.h), so the states are bit-exact:
//   pass 1: unconstrained DP over positions 128..255, 0..31 (160 steps), its best path's edge at
//           position 0 is the ring's edge; pass 2: positions 0..255 with start edge = end edge.
//   cost(s, p) = fl(fl(d·d) + M_p[s >> K]), d = fl(lut[s] − target[p]) (no FMA), M_{p+1}[e] =
//   min over h = 0..2^K−1 of cost((h << (16−K)) | e, p), first minimum (lowest h) wins; the final
//   state is the lowest-index minimum.
//
// Contract:
//   targets: [n_tiles][256] fp32, device, tensor-core order (position p = index, spec §1.4).
//   states:  [n_tiles][256] uint16, device, overwritten with closed rings (exl3_pack_tile's input).
//   K integer 1..8; every codebook. The workspace holds the back-pointers ([max_tiles][256]
//   [2^(16−K)] bytes: 2 MB per tile at K=3, 4 MB at K=2) and is not shared between streams.
// Limits: K=1 keeps its DP state in global memory (2 × 128 KB per tile does not fit shared
// memory); K=8 reads the codebook from global memory instead of registers. Both are slower paths.
// Tests: tests/gpu/test_quantize_cuda_trellis.cpp. Benchmark: bench/quantize (bench_quantize).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "formats/exl3.h"

namespace spw::quant {

struct TrellisCudaWorkspace {
  int bits = 0;
  Exl3Codebook codebook = Exl3Codebook::kMul1;
  int max_tiles = 0;
  uint8_t* back = nullptr;      // [max_tiles][256][2^(16−K)]
  float* m_global = nullptr;    // K=1 only: [max_tiles][2][32768]
  uint16_t* lut16 = nullptr;    // codebook, fp16 bits [65536]
  float* lut32 = nullptr;       // codebook, fp32 [65536]
};

Status trellis_cuda_workspace_alloc(TrellisCudaWorkspace& ws, int bits, Exl3Codebook codebook, int max_tiles);
void trellis_cuda_workspace_free(TrellisCudaWorkspace& ws);

// Encodes n_tiles ≤ ws.max_tiles tiles (asynchronous on stream).
Status trellis_encode_tiles_cuda(const float* targets, int n_tiles, uint16_t* states, TrellisCudaWorkspace& ws,
                                 cudaStream_t stream);

// Packs closed rings into trellis words (exl3_pack_tile on the GPU): states [n_tiles][256] →
// words [n_tiles][16K] (asynchronous). Tile i goes to words + i·16K.
void trellis_pack_tiles_cuda(const uint16_t* states, int n_tiles, int bits, uint16_t* words, cudaStream_t stream);

}  // namespace spw::quant
