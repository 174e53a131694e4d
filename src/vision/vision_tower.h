// The CPU reference of the V4.1 vision tower and aligner (specs §5.6): slow and obvious, the oracle
// for any faster path. Everything is f32 (weights widened from BF16 at load, activations and sums in
// f32); there is no BF16 rounding between ops, so it matches a BF16 GPU run only to BF16 accuracy.
//
// ViT, for a grid of n_h x n_w patches (d = hidden_size, d_head = d / n_heads):
//   x = patch_embed(patch) + bias                          [n, d], patches row-major in the grid
//   per block: x += wo(attn(rope(q), rope(k), v)) + bias   (q | k | v = wqkv(norm1(x)) + bias)
//              x += w2(silu(gate) * up), (gate | up) = w1(norm2(x))
//   out = norm(x)                                          RMSNorm eps 1e-6 everywhere
// Attention is bidirectional over all patches of one image, scale 1/sqrt(d_head).
// 2-D RoPE, rotate-half: each head's first half (d_head/2 slots) is paired with its second half;
// with q = d_head/4 frequencies f_i = theta^(-2i/(d_head/2)), slots [0, q) turn by row·f_i and
// slots [q, 2q) by col·f_i. For d_head = 64 that is the spec's 16 frequencies 10000^(-2i/32).
//
// Aligner (r = downsample_ratio): the [n_h, n_w, d] output is zero-padded to multiples of r, cut
// into r x r cells in row-major order, each cell flattened channel-major (feature c·r² + i·r + j for
// channel c at cell row i, column j, as torch's unfold), then w2(gelu_erf(w1·cell + b1)) + b2.
//
// Tests: tests/unit/test_vision_tower.cpp against goldens from tools/vision/make_tiny_vision.py.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "vision/image_processor.h"
#include "vision/vision_weights.h"

namespace spw::vision {

// patches: [n_h·n_w][3][patch][patch] f32. Returns [n_h·n_w][d].
Result<std::vector<float>> vit_forward_ref(const VisionWeights& w, const std::vector<float>& patches, int n_h, int n_w);
// vit: [n_h·n_w][d]. Returns [ceil(n_h/r)·ceil(n_w/r)][d_llm], cells row-major.
Result<std::vector<float>> aligner_forward_ref(const VisionWeights& w, const std::vector<float>& vit, int n_h,
                                               int n_w);
// Both, on a processed image (its BF16 patches widened to f32). Returns [n_llm_h·n_llm_w][d_llm]: the
// embeddings of the span's IMAGE positions in order (START / NEW_LINE / END take w.image_*).
Result<std::vector<float>> vision_encode_ref(const VisionWeights& w, const ProcessedImage& image);
// The embeddings of the image's whole span, in image_tokens.h's layout: image_start, each row of
// vision_encode_ref's output followed by image_newline, then image_end. Returns [grid.n_tokens][d_llm].
Result<std::vector<float>> image_span_embeddings_ref(const VisionWeights& w, const ProcessedImage& image);
// That layout from the aligner's output `cells` [n_llm_h·n_llm_w][D] and the three learned vectors [D].
std::vector<float> lay_out_span(const ImageGrid& grid, const std::vector<float>& cells, const std::vector<float>& start,
                                const std::vector<float>& newline, const std::vector<float>& end);

}  // namespace spw::vision
