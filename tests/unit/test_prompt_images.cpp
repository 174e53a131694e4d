// PromptImages (runtime/prompt_images.h): slicing a prompt's image positions for prefill pieces, and the
// prefix-cache key that stands image positions in for their image's content.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/prompt_images.h"

namespace spw::runtime {
namespace {

// Prompt of 8 tokens, image positions 2..4 and 6; rows hold their index in the prompt (d_model 2).
PromptImages sample() {
  PromptImages p;
  p.d_model = 2;
  p.is_image = {0, 0, 1, 1, 1, 0, 1, 0};
  for (float pos : {2.f, 3.f, 4.f, 6.f}) p.rows.insert(p.rows.end(), {pos, -pos});
  return p;
}

TEST(PromptImages, SliceTakesThePiecesRows) {
  const PromptImages p = sample();
  ImagePositions piece = p.slice(3, 7);
  ASSERT_EQ(piece.is_image.size(), 4u);
  EXPECT_EQ(piece.count(), 3u);
  EXPECT_EQ(std::vector<float>(piece.rows.begin(), piece.rows.end()), (std::vector<float>{3, -3, 4, -4, 6, -6}));
  EXPECT_EQ(p.slice(0, 2).rows.size(), 0u);
  EXPECT_EQ(p.slice(7, 8).count(), 0u);
  EXPECT_EQ(p.slice(0, 8).rows.size(), p.rows.size());
}

TEST(PromptImages, CacheKeyStandsImagesInForTheirContent) {
  const std::vector<int32_t> prompt = {5, 9, 7, 7, 7, 1, 7, 7, 2};
  const std::vector<std::pair<size_t, size_t>> spans = {{2, 3}, {6, 2}};
  const auto a = image_cache_key(prompt, spans, std::vector<uint64_t>{11, 22});
  const auto b = image_cache_key(prompt, spans, std::vector<uint64_t>{11, 23});
  ASSERT_EQ(a.size(), prompt.size());
  for (size_t i : {0u, 1u, 5u, 8u}) EXPECT_EQ(a[i], prompt[i]) << i;  // text keeps its ids
  for (size_t i : {2u, 3u, 4u, 6u, 7u}) EXPECT_LT(a[i], 0) << i;      // never a token id
  EXPECT_NE(a[2], a[3]);                                              // each place in a span its own key
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 6), std::vector<int32_t>(b.begin(), b.begin() + 6));
  EXPECT_NE(a[6], b[6]);                                              // another image, another key
  EXPECT_EQ(a, image_cache_key(prompt, spans, std::vector<uint64_t>{11, 22}));
}

TEST(PromptImages, HashBytesSeesEveryByte) {
  std::vector<uint8_t> bytes(64, 3);
  const uint64_t h = hash_bytes(bytes);
  bytes[63] = 4;
  EXPECT_NE(hash_bytes(bytes), h);
}

}  // namespace
}  // namespace spw::runtime
