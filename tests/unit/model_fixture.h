// Test helpers shared by the CPU model tests: the golden fixtures (tests/golden/fixtures/{v4,v41}/model)
// loaded as a Model, and seeded random token ids.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"

namespace spw::test {

inline std::string fixture_dir(const std::string& arch) {
  return std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/" + arch + "/model";
}

// The fixture `arch` ("v4" or "v41"); nullptr after a test failure naming the load error.
inline std::unique_ptr<Model> load_fixture(const std::string& arch, Numerics numerics,
                                           const LoadOptions& options = {}) {
  auto m = load_model(fixture_dir(arch), numerics, options);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

// n token ids uniform in [0, vocab), the same for the same seed.
inline std::vector<int32_t> random_tokens(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab - 1));
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = dist(gen);
  return ids;
}

}  // namespace spw::test
