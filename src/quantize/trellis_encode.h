// EXL3 trellis encoding: the tail-biting Viterbi search that picks, for one 16×16 tile, the 256
// 16-bit states whose codebook values best match a target (least squares), and the bit packing
// that turns those states into the int16 words src/formats/exl3 decodes. Spec:
// ../shared/specs/exl3.md §1.4 (states, ring, packing), §2.1 (codebooks), §4.4 (search).
//
// The trellis: state(p) = ((state(p−1) << K) | new_bits(p)) & 0xFFFF, so consecutive states share
// an "edge" of 16−K bits: edge(p) = state(p) >> K = state(p−1) & (2^(16−K) − 1). The ring closes
// (tail-biting): edge(0) = state(255) & (2^(16−K) − 1).
//
// Search (our own implementation of the QTIP/exllamav3 two-pass scheme): pass 1 runs an
// unconstrained Viterbi from position 128 around the ring to 32 positions past 0 (upstream goes
// all the way round; the shorter pass saves a fifth of the time) and reads the edge its best path
// has at position 0; pass 2 runs positions 0..255 with the start edge fixed to that value and the
// end state constrained to close the ring. Each pass is exact for its constraints (fp32 costs,
// first minimum wins); the tail-biting result is a heuristic, like upstream's.
//
// Contract: integer K in 1..8 only (no half-integer rates). Targets are fp32. Not thread-safe per
// TrellisEncoder object (it owns scratch); use one per thread. Deterministic.
// Tests: tests/unit/test_exl3_quantize_trellis.cpp (brute force on short trellises, round trip
// through the reader).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/exl3.h"

namespace spw::quant {

class TrellisEncoder {
 public:
  TrellisEncoder(int bits, Exl3Codebook codebook);

  int bits() const { return k_; }
  Exl3Codebook codebook() const { return cb_; }

  // Best state path for targets[0..n) (n >= 1). start_edge / end_edge: −1 = free, else the
  // required edge(0) = states[0] >> K / the required states[n−1] & (2^(16−K) − 1).
  // Returns the summed squared error (+inf if the constraints admit no path).
  double viterbi(const float* targets, int n, int start_edge, int end_edge, uint16_t* states);

  // One tile: targets in tensor-core order (position p = index, spec §1.4). Writes the 256 states
  // of a closed ring; returns its squared error.
  double encode_tile(const float targets[256], uint16_t states[256]);

  // A 16×16 row-major tile (row = input feature): permutes to tensor-core order, encodes, and
  // writes the packed words (16·K int16) and the decoded values (row-major, fp32 of the fp16).
  double encode_tile_rowmajor(const float tile[256], uint16_t* words, float* decoded);

 private:
  int k_;
  Exl3Codebook cb_;
  const float* lut_;
  std::vector<float> cost_, next_, min_;
  std::vector<int32_t> arg_;
  std::vector<uint8_t> back_;  // [n][2^(16−K)] argmin predecessor's top K bits
};

// Packs a closed ring of 256 states into 16·K int16 words (spec §1.4). The states must obey the
// shift-register rule around the ring (as encode_tile returns them).
void exl3_pack_tile(const uint16_t states[256], int bits, uint16_t* words);

}  // namespace spw::quant
