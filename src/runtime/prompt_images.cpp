#include "runtime/prompt_images.h"

#include <algorithm>

namespace spw::runtime {

ImagePositions PromptImages::slice(size_t begin, size_t end) const {
  const auto first = is_image.begin();
  const size_t row = size_t(std::count_if(first, first + std::ptrdiff_t(begin), [](uint8_t b) { return b != 0; }));
  const size_t n = size_t(std::count_if(first + std::ptrdiff_t(begin), first + std::ptrdiff_t(end),
                                        [](uint8_t b) { return b != 0; }));
  return {std::span<const uint8_t>(is_image).subspan(begin, end - begin),
          std::span<const float>(rows).subspan(row * size_t(d_model), n * size_t(d_model))};
}

namespace {

// splitmix64's finaliser: spreads (hash, place) over all 64 bits.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<int32_t> image_cache_key(std::span<const int32_t> prompt,
                                     std::span<const std::pair<size_t, size_t>> spans,
                                     std::span<const uint64_t> image_hashes) {
  std::vector<int32_t> key(prompt.begin(), prompt.end());
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto [first, length] = spans[i];
    for (size_t k = 0; k < length; ++k)
      key[first + k] = -1 - int32_t(mix(image_hashes[i] ^ mix(k)) & 0x3FFFFFFF);  // in [-2^30, -1]
  }
  return key;
}

uint64_t hash_bytes(std::span<const uint8_t> bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001B3ull;
  return h;
}

}  // namespace spw::runtime
