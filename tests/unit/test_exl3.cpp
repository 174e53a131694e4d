// Tests for formats/exl3.h with cases checkable by hand from ../shared/specs/exl3.md:
// the §2.6 worked example (K=2 tile, states and codebook values), single-state codebook values,
// the §1.4 permutation, a bit-level packer written independently from the §1.4 prose (round trip
// for every K incl. half-integers), the Hadamard emulation, the reference x·W against the
// materialized W, loader validation errors and quantization_config parsing.
#include "formats/exl3.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/dtypes.h"

namespace spw {
namespace {

// Packs 256 per-position "new bits" into a tile exactly as §1.4 describes the stream: position p
// writes its D(p) bits MSB-first at stream bits [S(p-1), S(p)); bit s lives in uint32 word s/32 at
// bit 31 - s%32; uint32 word w is stored as int16 elements 2w (low half) and 2w+1 (high half).
std::vector<uint16_t> pack_tile(const std::vector<uint32_t>& new_bits, Exl3Bits bits) {
  std::vector<uint32_t> words(bits.words_per_tile() / 2, 0);
  int64_t s = 0;
  for (int p = 0; p < 256; ++p) {
    int d = bits.step_bits(p);
    for (int b = d - 1; b >= 0; --b, ++s)
      if ((new_bits[p] >> b) & 1) words[s / 32] |= 1u << (31 - s % 32);
  }
  EXPECT_EQ(s, static_cast<int64_t>(words.size()) * 32);
  std::vector<uint16_t> tile(words.size() * 2);
  for (size_t w = 0; w < words.size(); ++w) {
    tile[2 * w] = words[w] & 0xffff;
    tile[2 * w + 1] = words[w] >> 16;
  }
  return tile;
}

TEST(Exl3, SpecWorkedExampleK2) {
  // §2.6: K = 2, words [0]=0x1234 [1]=0x7E32 [2]=0x8228 [3]=0x47DE ... [30]=0xA2C0 [31]=0xB666.
  std::vector<uint16_t> tile(32, 0);
  tile[0] = 0x1234; tile[1] = 0x7E32; tile[2] = 0x8228; tile[3] = 0x47DE; tile[30] = 0xA2C0; tile[31] = 0xB666;
  Exl3Bits bits{4};
  uint16_t st[256];
  exl3_tile_states(tile.data(), bits, st);
  // p=0: last 14 ring bits (0xA2C0 & 0x3FFF = 0x22C0) then the first two stream bits "01" of 0x7E32.
  EXPECT_EQ(st[0], 0x8B01);
  EXPECT_EQ(st[1], 0x2C07);
  EXPECT_EQ(st[2], 0xB01F);
  EXPECT_EQ(st[3], 0xC07E);
  EXPECT_EQ(st[4], 0x01F8);
  EXPECT_EQ(st[7], 0x7E32);    // the first 16 stream bits
  EXPECT_EQ(st[255], 0xA2C0);  // the last 16 stream bits
  struct Row { int p; float v3inst, vmcg; uint16_t mul1; };
  const Row rows[] = {{0, 0.806152f, 0.450439f, 0xBCFD}, {1, 0.365723f, 0.950684f, 0x3678},
                      {2, -0.762207f, -0.717773f, 0x2D15}, {3, -0.083252f, 2.890625f, 0xAF7B},
                      {4, 0.584961f, -0.365967f, 0x3D2A}, {7, -1.644531f, -0.382812f, 0xBCBF},
                      {255, -2.667969f, -0.530273f, 0x3D00}};
  uint16_t w3[256], wm[256], w1[256];
  exl3_decode_tile(tile.data(), bits, Exl3Codebook::k3Inst, w3);
  exl3_decode_tile(tile.data(), bits, Exl3Codebook::kMcg, wm);
  exl3_decode_tile(tile.data(), bits, Exl3Codebook::kMul1, w1);
  for (const Row& r : rows) {
    int at = exl3_perm_row(r.p) * 16 + exl3_perm_col(r.p);
    EXPECT_NEAR(f16_to_f32(w3[at]), r.v3inst, 1e-6) << r.p;
    EXPECT_NEAR(f16_to_f32(wm[at]), r.vmcg, 1e-6) << r.p;
    EXPECT_EQ(w1[at], r.mul1) << r.p;
  }
}

TEST(Exl3, SingleStateCodebookValues) {
  EXPECT_EQ(exl3_codebook_f16(Exl3Codebook::k3Inst, 0x0000), 0x3A25);
  EXPECT_EQ(exl3_codebook_f16(Exl3Codebook::kMcg, 0x0000), 0x3F60);
  EXPECT_EQ(exl3_codebook_f16(Exl3Codebook::kMul1, 0x0000), 0xC2E8);
  EXPECT_NEAR(f16_to_f32(exl3_codebook_f16(Exl3Codebook::k3Inst, 0xFFFF)), -0.158203f, 1e-6);
  EXPECT_NEAR(f16_to_f32(exl3_codebook_f16(Exl3Codebook::kMcg, 0xFFFF)), 0.850098f, 1e-6);
  EXPECT_NEAR(f16_to_f32(exl3_codebook_f16(Exl3Codebook::kMul1, 0xFFFF)), -0.651367f, 1e-6);
}

TEST(Exl3, CodebookStatistics) {
  // §2.1: σ ≈ 1.2437 (3INST), 1.2441 (MCG), 1.0003 (MUL1); MUL1 has 913 distinct values in [−3.453, 3.348].
  const double sigma[3] = {1.24371, 1.2441, 1.0003};
  for (int c = 0; c < 3; ++c) {
    const float* lut = exl3_codebook_lut_f32(static_cast<Exl3Codebook>(c));
    double s = 0, s2 = 0;
    for (int i = 0; i < 65536; ++i) s += lut[i], s2 += double(lut[i]) * lut[i];
    double mean = s / 65536, sd = std::sqrt(s2 / 65536 - mean * mean);
    EXPECT_NEAR(sd, sigma[c], 2e-4) << c;
  }
  const uint16_t* mul1 = exl3_codebook_lut(Exl3Codebook::kMul1);
  std::map<uint16_t, int> distinct;
  for (int i = 0; i < 65536; ++i) distinct[mul1[i]]++;
  EXPECT_EQ(distinct.size(), 913u);
}

TEST(Exl3, TensorCorePermutation) {
  // Lane 0 owns (0,0),(1,0),(8,0),(9,0),(0,8),(1,8),(8,8),(9,8); the map is a bijection.
  const int r0[8] = {0, 1, 8, 9, 0, 1, 8, 9}, c0[8] = {0, 0, 0, 0, 8, 8, 8, 8};
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(exl3_perm_row(j), r0[j]);
    EXPECT_EQ(exl3_perm_col(j), c0[j]);
  }
  std::vector<int> seen(256, 0);
  for (int p = 0; p < 256; ++p) seen[exl3_perm_row(p) * 16 + exl3_perm_col(p)]++;
  for (int v : seen) EXPECT_EQ(v, 1);
}

TEST(Exl3, PackRoundTripAllBitrates) {
  std::mt19937 rng(7);
  for (int k_x2 = 2; k_x2 <= 16; ++k_x2) {
    Exl3Bits bits{k_x2};
    if (bits.half() && k_x2 > 15) continue;
    std::vector<uint32_t> nb(256);
    for (int p = 0; p < 256; ++p) nb[p] = rng() & ((1u << bits.step_bits(p)) - 1);
    std::vector<uint16_t> tile = pack_tile(nb, bits);
    ASSERT_EQ(static_cast<int>(tile.size()), bits.words_per_tile());
    uint16_t st[256];
    exl3_tile_states(tile.data(), bits, st);
    // The state is a 16-bit shift register: state(p) = (state(p−1) << D(p) | new(p)) & 0xFFFF, around the ring.
    for (int p = 0; p < 256; ++p) {
      int prev = (p + 255) % 256, d = bits.step_bits(p);
      uint32_t expect = ((static_cast<uint32_t>(st[prev]) << d) | nb[p]) & 0xffff;
      ASSERT_EQ(st[p], expect) << "k_x2=" << k_x2 << " p=" << p;
    }
  }
}

TEST(Exl3, HalfIntegerStepPattern) {
  // §2.6: K = 2.5 → D = 2,3,2,3,…; S = 2,5,7,10,…; 40 int16 words per tile.
  Exl3Bits bits{5};
  EXPECT_EQ(bits.words_per_tile(), 40);
  int s = 0, expect_s[6] = {2, 5, 7, 10, 12, 15};
  for (int p = 0; p < 6; ++p) EXPECT_EQ(s += bits.step_bits(p), expect_s[p]);
}

TEST(Exl3, Had128Emulation) {
  // e_0 → every output 1/√128 = fp16(fp32(1)·0.088388347648) = 0x2DA8 (0.08837890625).
  uint16_t in[128] = {}, out[128];
  in[0] = 0x3C00;
  exl3_had128_f16(in, out, nullptr, nullptr);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(out[i], 0x2DA8) << i;
  // Post-scale by −2 flips and doubles: 0xB1A8.
  uint16_t post[128];
  for (auto& p : post) p = 0xC000;
  exl3_had128_f16(in, out, nullptr, post);
  EXPECT_EQ(out[5], 0xB1A8);
  // Pre-scale 2 on e_3: row 3 of H times 2/√128: sign (−1)^popcount(3&i).
  in[0] = 0; in[3] = 0x3C00;
  for (auto& p : post) p = 0x4000;
  exl3_had128_f16(in, out, post, nullptr);
  for (int i = 0; i < 128; ++i) EXPECT_EQ(out[i], (__builtin_popcount(3 & i) & 1) ? 0xB1A8 : 0x31A8) << i;
}

TEST(Exl3, F16Rounding) {
  EXPECT_EQ(exl3_f64_to_f16(1.0), 0x3C00);
  EXPECT_EQ(exl3_f64_to_f16(1.0 + std::ldexp(1.0, -11)), 0x3C00);       // tie → even
  EXPECT_EQ(exl3_f64_to_f16(1.0 + 3 * std::ldexp(1.0, -11)), 0x3C02);   // tie → even (up)
  EXPECT_EQ(exl3_f64_to_f16(-2.0), 0xC000);
  EXPECT_EQ(exl3_f64_to_f16(65504.0), 0x7BFF);
  EXPECT_EQ(exl3_f64_to_f16(1e6), 0x7C00);
  EXPECT_EQ(exl3_f64_to_f16(std::ldexp(1.0, -24)), 0x0001);
  for (uint32_t h = 0; h < 0x7C00; ++h) ASSERT_EQ(exl3_f64_to_f16(f16_to_f32(h)), h);
}

// A self-contained fake checkpoint: TensorInfos over owned byte buffers.
struct FakeStore {
  std::map<std::string, TensorInfo> infos;
  std::map<std::string, std::vector<uint8_t>> bytes;
  template <class T>
  void put(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
    auto& b = bytes[name];
    b.resize(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    TensorInfo ti;
    ti.name = name;
    ti.dtype = dt;
    ti.shape = std::move(shape);
    ti.data = b.data();
    ti.nbytes = b.size();
    ti.file = "fake.safetensors";
    infos[name] = ti;
  }
  Exl3Lookup lookup() const {
    return [this](const std::string& n) -> const TensorInfo* {
      auto it = infos.find(n);
      return it == infos.end() ? nullptr : &it->second;
    };
  }
};

FakeStore random_linear(const std::string& p, int64_t k, int64_t n, int k_x2, const char* marker, uint32_t seed) {
  std::mt19937 rng(seed);
  FakeStore s;
  int words = 8 * k_x2;
  std::vector<uint16_t> tr(static_cast<size_t>(k / 16) * (n / 16) * words);
  for (auto& w : tr) w = rng() & 0xffff;
  s.put(p + ".trellis", DType::I16, {k / 16, n / 16, words}, tr);
  std::normal_distribution<float> nd(0, 0.05f);
  std::vector<uint16_t> suh(k), svh(n);
  for (auto& v : suh) v = exl3_f64_to_f16(nd(rng));
  for (auto& v : svh) v = exl3_f64_to_f16((rng() & 1) ? 1.0 + nd(rng) : -1.0 + nd(rng));
  s.put(p + ".suh", DType::F16, {k}, suh);
  s.put(p + ".svh", DType::F16, {n}, svh);
  if (marker) {
    uint32_t m = std::string(marker) == "mcg" ? kExl3McgMult : kExl3Mul1Mult;
    s.put(p + "." + marker, DType::I32, {}, std::vector<uint32_t>{m});
  }
  return s;
}

TEST(Exl3, LoadAndReferenceMatmulAgree) {
  const std::string p = exl3_expert_prefix(3, 17, 2);
  EXPECT_EQ(p, "layers.3.ffn.experts.17.w2");
  FakeStore s = random_linear(p, 256, 128, 6, "mcg", 1);
  std::vector<float> bias(128);
  for (int i = 0; i < 128; ++i) bias[i] = 0.01f * i;
  s.put(p + ".bias", DType::F32, {128}, bias);
  ASSERT_TRUE(exl3_is_stored(s.lookup(), p));
  auto t = exl3_load(s.lookup(), p);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->k, 256);
  EXPECT_EQ(t->n, 128);
  EXPECT_EQ(t->bits.k_x2, 6);
  EXPECT_EQ(t->codebook, Exl3Codebook::kMcg);
  ASSERT_EQ(t->bias.size(), 128u);
  // y = x·W + bias two ways: the fused reference and the materialized original-basis W.
  std::vector<float> w = exl3_weight_ref(*t);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int m = 3;
  std::vector<float> x(m * 256), y(m * 128);
  for (auto& v : x) v = nd(rng);
  exl3_matmul_ref(*t, x.data(), m, y.data());
  for (int r = 0; r < m; ++r)
    for (int j = 0; j < 128; ++j) {
      double acc = f16_to_f32(t->bias[j]);
      for (int i = 0; i < 256; ++i) acc += double(x[r * 256 + i]) * w[i * 128 + j];
      ASSERT_NEAR(y[r * 128 + j], acc, 1e-5 * (1 + std::fabs(acc))) << r << "," << j;
    }
  // One W element by the §2.4 per-element formula.
  std::vector<uint16_t> wi = exl3_decode_inner(*t);
  const int i0 = 130, j0 = 77;
  double e = 0;
  for (int a = 128; a < 256; ++a)
    for (int b = 0; b < 128; ++b) {
      double ha = (__builtin_popcount((i0 % 128) & (a % 128)) & 1) ? -1 : 1;
      double hb = (__builtin_popcount((b % 128) & (j0 % 128)) & 1) ? -1 : 1;
      e += ha * f16_to_f32(wi[a * 128 + b]) * hb / 128.0;
    }
  e *= f16_to_f32(t->suh[i0]) * f16_to_f32(t->svh[j0]);
  EXPECT_NEAR(w[i0 * 128 + j0], e, 1e-6);
}

TEST(Exl3, LegacySignsExpand) {
  const std::string p = "model.layers.0.mlp.down_proj";
  FakeStore s = random_linear(p, 128, 128, 4, nullptr, 2);
  s.infos.erase(p + ".suh");
  s.infos.erase(p + ".svh");
  std::vector<uint16_t> su(8, 0), sv(8, 0);
  su[0] = 0x0005;  // elements 0 and 2 negative
  sv[7] = 0x8000;  // element 127 negative
  s.put(p + ".su", DType::I16, {8}, su);
  s.put(p + ".sv", DType::I16, {8}, sv);
  auto t = exl3_load(s.lookup(), p);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->legacy_signs);
  EXPECT_EQ(t->codebook, Exl3Codebook::k3Inst);
  EXPECT_EQ(t->suh[0], 0xBC00);
  EXPECT_EQ(t->suh[1], 0x3C00);
  EXPECT_EQ(t->suh[2], 0xBC00);
  EXPECT_EQ(t->svh[127], 0xBC00);
  EXPECT_EQ(t->svh[126], 0x3C00);
}

TEST(Exl3, LoadErrorsNameTheProblem) {
  const std::string p = "layers.1.ffn.experts.0.w1";
  auto expect_error = [&](FakeStore& s, const std::string& needle) {
    auto t = exl3_load(s.lookup(), p);
    ASSERT_FALSE(t.ok()) << needle;
    EXPECT_NE(t.error().message.find(needle), std::string::npos) << t.error().message;
  };
  {
    FakeStore s = random_linear(p, 128, 128, 6, "mul1", 1);
    s.put(p + ".mcg", DType::I32, {}, std::vector<uint32_t>{kExl3McgMult});
    expect_error(s, "both mcg and mul1");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 6, nullptr, 1);
    s.put(p + ".mul1", DType::I32, {}, std::vector<uint32_t>{0x12345678});
    expect_error(s, "0x12345678");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 5, "mcg", 1);  // K = 2.5 with mcg
    expect_error(s, "requires the mul1 codebook");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 6, nullptr, 1);
    s.put(p + ".trellis", DType::I16, {8, 8, 20}, std::vector<uint16_t>(8 * 8 * 20));
    expect_error(s, "no supported bitrate");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 6, nullptr, 1);
    s.put(p + ".suh", DType::F16, {64}, std::vector<uint16_t>(64));
    expect_error(s, "expected [128]");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 6, nullptr, 1);
    s.put(p + ".svh", DType::BF16, {128}, std::vector<uint16_t>(128));
    expect_error(s, "expected F16");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 6, nullptr, 1);
    s.infos.erase(p + ".svh");
    expect_error(s, ".svh");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 6, nullptr, 1);
    s.put(p + ".scale", DType::F32, {}, std::vector<float>{1.0f});
    expect_error(s, "scale");
  }
  {
    FakeStore s = random_linear(p, 128, 128, 6, nullptr, 1);
    s.put(p + ".trellis", DType::I16, {8, 9, 48}, std::vector<uint16_t>(8 * 9 * 48));
    s.put(p + ".svh", DType::F16, {144}, std::vector<uint16_t>(144));
    expect_error(s, "multiples of the 128");
  }
  FakeStore none;
  auto t = exl3_load(none.lookup(), p);
  ASSERT_FALSE(t.ok());
  EXPECT_FALSE(exl3_is_stored(none.lookup(), p));
}

TEST(Exl3, QuantConfig) {
  auto qc = nlohmann::json::parse(R"({"quant_method":"exl3","version":"1.6.5","bits":3.0,"head_bits":6,
      "calibration":{"rows":250,"cols":2048},"out_scales":"always","codebook":"mcg","mtp_bits":3})");
  auto c = exl3_parse_quant_config(qc);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->version, "1.6.5");
  EXPECT_DOUBLE_EQ(c->bits, 3.0);
  EXPECT_EQ(*c->head_bits, 6);
  EXPECT_EQ(*c->mtp_bits, 3);
  EXPECT_EQ(c->codebook, Exl3Codebook::kMcg);
  EXPECT_EQ(c->calibration_rows, 250);
  EXPECT_EQ(c->calibration_cols, 2048);
  auto d = exl3_parse_quant_config(nlohmann::json::parse(R"({"quant_method":"exl3","bits":2.5})"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->codebook, Exl3Codebook::kMul1);
  EXPECT_FALSE(d->head_bits.has_value());
  auto bad = exl3_parse_quant_config(nlohmann::json::parse(R"({"quant_method":"gptq"})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("quant_method"), std::string::npos);
  auto bad_cb = exl3_parse_quant_config(nlohmann::json::parse(R"({"quant_method":"exl3","codebook":"hyb"})"));
  ASSERT_FALSE(bad_cb.ok());
  EXPECT_NE(bad_cb.error().message.find("\"hyb\""), std::string::npos);
}

}  // namespace
}  // namespace spw
