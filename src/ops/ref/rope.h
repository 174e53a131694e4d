// Partial interleaved RoPE on the LAST d_rope channels of each vector (specs §3 "RoPE"):
// pair i = channels (2i, 2i+1) of that slice, angle = pos·θ'_i in f32; inverse = conjugate.
// θ_i = base^(−2i/d_rope); with YaRN (compressed layers) θ'_i = θ_i/f·ramp_i + θ_i·(1−ramp_i).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spw::ref {

struct RopeParams {
  float base = 10000.f;
  int d_rope = 64;
  bool yarn = false;
  float yarn_factor = 16.f;
  int64_t yarn_original_len = 65536;
  float beta_fast = 32.f;
  float beta_slow = 1.f;
};

// The d_rope/2 per-pair frequencies θ'_i.
std::vector<float> rope_frequencies(const RopeParams& p);

// Rotates x[n_vectors, d] (last d_rope channels) by pos·freq (inverse: by −pos·freq), in place.
void rope_apply(float* x, size_t n_vectors, size_t d, const std::vector<float>& freqs, int64_t pos,
                bool inverse);

}  // namespace spw::ref
