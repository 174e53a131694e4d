// The image positions of a prompt (V4.1 vision): which prompt tokens are image positions, their
// embeddings, and the key the prefix cache stores the prompt under. model/image_positions.h says what
// the model does with image positions.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/image_positions.h"

namespace spw::runtime {

struct PromptImages {
  std::vector<uint8_t> is_image;   // one per prompt token
  std::vector<float> rows;         // [image positions, d_model], in prompt order
  std::vector<int32_t> cache_key;  // the prompt as the prefix cache keys it (image_cache_key)
  int d_model = 0;

  // The image positions of prompt[begin, end).
  ImagePositions slice(size_t begin, size_t end) const;
};

// The prompt with each position of image span i replaced by a negative id drawn from image_hashes[i]
// (a hash of that image's pixels) and the position's place in the span: token ids are never negative, so
// two prompts share prefix-cache entries only up to the first image they do not share. spans: (first
// position, length) per image, in prompt order.
std::vector<int32_t> image_cache_key(std::span<const int32_t> prompt,
                                     std::span<const std::pair<size_t, size_t>> spans,
                                     std::span<const uint64_t> image_hashes);

// FNV-1a 64 of bytes: the hash image_cache_key takes per image.
uint64_t hash_bytes(std::span<const uint8_t> bytes);

}  // namespace spw::runtime
