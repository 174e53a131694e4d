// Compatibility with exllamav3 itself: tensors written by exllamav3's own quantizer
// (tools/exl3/make_fixtures.py, tests/fixtures/exl3/) must decode to exllamav3's Ŵ bit-for-bit;
// the original-basis W and y = x·W (exllamav3's fp16 kernels, EXL3_INT8_GEMV=0) agree within
// fp16-path tolerances (spec §2.4: exllamav3 rounds intermediates to fp16, we do not).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/dtypes.h"
#include "formats/exl3.h"
#include "formats/safetensors.h"

namespace spw {
namespace {

// The committed fixtures run in CI (a CPU test: reader + reference decoder). SPW_EXL3_FIXTURE_DIR overrides
// (scripts/gpu_test.sh checks freshly made fixtures on the GPU machine).
const std::string kDir = std::getenv("SPW_EXL3_FIXTURE_DIR") ? std::getenv("SPW_EXL3_FIXTURE_DIR")
                                                              : std::string(SPW_SOURCE_DIR) + "/tests/fixtures/exl3";

std::vector<uint16_t> f16_tensor(const TensorInfo* ti) {
  std::vector<uint16_t> v(ti->nbytes / 2);
  std::memcpy(v.data(), ti->data, ti->nbytes);
  return v;
}

TEST(Exl3Fixtures, MatchExllamav3) {
  std::ifstream mf(kDir + "/manifest.json");
  ASSERT_TRUE(bool(mf)) << "no fixtures at " << kDir << " (scripts/gpu_test.sh makes them with exllamav3 first)";
  nlohmann::json manifest = nlohmann::json::parse(mf);
  auto file = SafetensorsFile::open(kDir + "/exl3_fixtures.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  const SafetensorsFile& f = *file.value();
  int n_cases = 0;
  for (const auto& c : manifest["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    auto t = exl3_load(f, name);
    ASSERT_TRUE(t.ok()) << t.error().message;
    const double K = c["K"].get<double>();
    EXPECT_EQ(t->bits.k_x2, static_cast<int>(K * 2));
    EXPECT_STREQ(exl3_codebook_name(t->codebook), c["codebook"].get<std::string>().c_str());
    // Ŵ: bit-exact.
    std::vector<uint16_t> inner = exl3_decode_inner(*t);
    std::vector<uint16_t> want = f16_tensor(f.find(name + ".inner"));
    ASSERT_EQ(inner.size(), want.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < inner.size(); ++i) mismatches += inner[i] != want[i];
    EXPECT_EQ(mismatches, 0u);
    // W: exllamav3 computes it with fp16 intermediates; compare relative to RMS(W).
    std::vector<float> w = exl3_weight_ref(*t);
    std::vector<uint16_t> wx = f16_tensor(f.find(name + ".weight"));
    double se = 0, sw = 0, maxe = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      double d = w[i] - f16_to_f32(wx[i]);
      se += d * d, sw += double(w[i]) * w[i], maxe = std::max(maxe, std::fabs(d));
    }
    double rms_w = std::sqrt(sw / w.size());
    EXPECT_LT(std::sqrt(se / w.size()) / rms_w, 2e-3);
    EXPECT_LT(maxe / rms_w, 2e-2);
    // y = x·W: exllamav3's fp16 GEMM vs our fp64 reference (x from the fixture, fp16).
    std::vector<uint16_t> xh = f16_tensor(f.find(name + ".x"));
    std::vector<float> x(xh.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = f16_to_f32(xh[i]);
    const int64_t m = static_cast<int64_t>(x.size()) / t->k;
    std::vector<float> y(m * t->n);
    exl3_matmul_ref(*t, x.data(), m, y.data());
    for (const char* key : {"y1", "y4"}) {
      std::vector<uint16_t> yx = f16_tensor(f.find(name + "." + key));
      const size_t rows = yx.size() / t->n;
      double e2 = 0, y2 = 0;
      for (size_t i = 0; i < rows * t->n; ++i) {
        double d = y[i] - f16_to_f32(yx[i]);
        e2 += d * d, y2 += double(y[i]) * y[i];
      }
      EXPECT_LT(std::sqrt(e2 / y2), 5e-3) << key;  // spec §2: ≈0.3 % for exllamav3's fp16 path
    }
    ++n_cases;
  }
  EXPECT_GE(n_cases, 15);
  EXPECT_TRUE(manifest["failures"].empty()) << manifest["failures"].dump();
}

}  // namespace
}  // namespace spw
