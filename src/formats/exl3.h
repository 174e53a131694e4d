// EXL3 (exllamav3) quantized linear tensors: reading them as exllamav3 writes them, and the scalar
// reference decode. Spec: ../shared/specs/exl3.md (§1 on-disk format, §2 decode math).
//
// What a stored linear is (prefix P, e.g. `layers.3.ffn.experts.17.w1`):
//   P.trellis int16 [k/16, n/16, 16·K]  tail-biting 16-bit trellis, one 16×16 tile per (tk, tn)
//   P.suh / P.svh fp16 [k] / [n]        input / output factors (legacy: P.su / P.sv int16 sign bits)
//   P.mcg | P.mul1 int32 scalar         codebook marker (neither: 3INST)
//   P.bias fp16|fp32 [n]                optional
// and the layer computes y = x·W + bias with W = diag(suh)·Hk·Ŵ·Hn·diag(svh) (k = in_features rows,
// n = out_features columns, Hk/Hn block-diagonal normalized Sylvester Hadamards of order 128).
// Ŵ (fp16) is the bit-exact decode target; everything after it is compared with a tolerance.
//
// Contract: Exl3Tensor borrows the trellis bytes (an mmap'd checkpoint must outlive it); suh, svh
// and bias are copied. K may be a half-integer (mul1 only, spec §1.3/§1.4). Every user-caused
// problem (missing tensor, wrong dtype/shape, bad marker, unsupported variant) is an Error naming
// the tensor; nothing here aborts on bad files.
// Tests: tests/unit/test_exl3.cpp (hand-checkable spec cases), tests/unit/test_exl3_fixtures.cpp
// (bit-exact against exllamav3's own quantizer output, tests/fixtures/exl3/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/status.h"
#include "formats/safetensors.h"

namespace spw {

enum class Exl3Codebook : uint8_t { k3Inst = 0, kMcg = 1, kMul1 = 2 };

// The locked multipliers; stored markers must hold exactly these words (as int32).
inline constexpr uint32_t kExl3McgMult = 0xCBAC1FEDu;
inline constexpr uint32_t kExl3Mul1Mult = 0x83DCD12Du;
inline constexpr int kExl3HadamardBlock = 128;

const char* exl3_codebook_name(Exl3Codebook cb);

// Bits per weight of one tensor: K = k_x2 / 2 (k_x2 odd ⇔ half-integer K).
struct Exl3Bits {
  int k_x2 = 0;
  bool half() const { return (k_x2 & 1) != 0; }
  int ka() const { return k_x2 / 2; }  // integer part
  int words_per_tile() const { return 8 * k_x2; }  // int16 words per 256-weight tile (16·K)
  // Trellis bits consumed by position p of a tile (0..255): K, or KA + bit (p mod 16) of 0xAAAA.
  int step_bits(int p) const { return half() ? ka() + ((0xAAAA >> (p & 15)) & 1) : ka(); }
};

struct Exl3Tensor {
  std::string name;  // the prefix P
  int64_t k = 0;     // in_features as stored (padded; multiple of 16)
  int64_t n = 0;     // out_features as stored (padded; multiple of 16)
  Exl3Bits bits;
  Exl3Codebook codebook = Exl3Codebook::k3Inst;
  const uint16_t* trellis = nullptr;  // [k/16][n/16][words_per_tile], borrowed
  std::vector<uint16_t> suh;          // fp16 bits [k]
  std::vector<uint16_t> svh;          // fp16 bits [n]
  std::vector<uint16_t> bias;         // fp16 bits [n], empty when absent
  bool legacy_signs = false;          // suh/svh came from packed su/sv

  int words_per_tile() const { return bits.words_per_tile(); }
  const uint16_t* tile(int64_t tk, int64_t tn) const {
    return trellis + (tk * (n / 16) + tn) * words_per_tile();
  }
  size_t trellis_nbytes() const { return static_cast<size_t>(k / 16) * (n / 16) * words_per_tile() * 2; }
};

using Exl3Lookup = std::function<const TensorInfo*(const std::string&)>;

// True when P.trellis, (P.suh | P.su) and (P.svh | P.sv) all exist (exllamav3's is_exl3_storage).
bool exl3_is_stored(const Exl3Lookup& lookup, const std::string& prefix);
// Reads and validates one linear. Errors name the tensor, field and value.
Result<Exl3Tensor> exl3_load(const Exl3Lookup& lookup, const std::string& prefix);
Result<Exl3Tensor> exl3_load(const Checkpoint& checkpoint, const std::string& prefix);
Result<Exl3Tensor> exl3_load(const SafetensorsFile& file, const std::string& prefix);

// DeepSeek-V4 / V4.1 routed expert projection: `layers.{layer}.ffn.experts.{expert}.w{1,2,3}`
// (w1 gate, w2 down, w3 up), exllamav3's architecture/deepseek_v4.py naming.
std::string exl3_expert_prefix(int layer, int expert, int w);

// config.json["quantization_config"] written by exllamav3's compile step (spec §1.5).
struct Exl3QuantConfig {
  std::string version;           // exllamav3 version that compiled the model
  double bits = 0;               // average decoder bpw (informational; per-tensor K is in the shapes)
  std::optional<int> head_bits;
  std::optional<int> mtp_bits;
  Exl3Codebook codebook = Exl3Codebook::kMul1;  // exllamav3's default when absent
  std::string out_scales;        // "always" | "never" | "auto" | "" (absent)
  int calibration_rows = 0, calibration_cols = 0;
};
// Accepts the quantization_config object itself. Errors on quant_method != "exl3", an unknown
// codebook or out_scales, or wrongly typed fields; unknown extra fields are ignored.
Result<Exl3QuantConfig> exl3_parse_quant_config(const nlohmann::json& qc);

// ---- decode (reference) ----

// One codebook value as fp16 bits, computed from the spec formula (§2.1).
uint16_t exl3_codebook_f16(Exl3Codebook cb, uint16_t state);
// The 65,536-entry fp16 table of a codebook (built once, thread-safe).
const uint16_t* exl3_codebook_lut(Exl3Codebook cb);
// The same table as fp32 (exact: every fp16 is an fp32).
const float* exl3_codebook_lut_f32(Exl3Codebook cb);

// Tensor-core order of a tile position p = 8t + j (spec §1.4): row (input feature) and column
// (output feature) inside the 16×16 tile.
inline int exl3_perm_row(int p) {
  int t = p >> 3, j = p & 7;
  return 2 * (t & 3) + (j & 1) + 8 * ((j >> 1) & 1);
}
inline int exl3_perm_col(int p) {
  int t = p >> 3, j = p & 7;
  return (t >> 2) + 8 * ((j >> 2) & 1);
}

// The 256 16-bit states of one tile (tail-biting ring, MSB-first, int16 pairs low half first).
void exl3_tile_states(const uint16_t* tile, Exl3Bits bits, uint16_t states[256]);
// One tile of Ŵ, row-major 16×16 fp16 bits.
void exl3_decode_tile(const uint16_t* tile, Exl3Bits bits, Exl3Codebook cb, uint16_t out[256]);
// The whole inner weight Ŵ, [k][n] fp16 bits (row = input feature).
std::vector<uint16_t> exl3_decode_inner(const Exl3Tensor& t);

// exllamav3's had_r_128 on one 128-vector, emulated exactly (spec §2.3): optional fp16 pre-scale,
// fp32 butterflies with strides 1..64, ×fp32(0.088388347648), round to fp16, optional post-scale.
// pre/post may be null. in and out may alias.
void exl3_had128_f16(const uint16_t* in, uint16_t* out, const uint16_t* pre, const uint16_t* post);

// Original-basis W [k][n] in fp32 (computed in fp64: diag(suh)·Hk·Ŵ·Hn·diag(svh)).
std::vector<float> exl3_weight_ref(const Exl3Tensor& t);

// Reference y = x·W + bias. x: [m][k] fp32 row-major, y: [m][n] fp32 (overwritten).
// Computed in fp64 from Ŵ and the fp16 factors without any intermediate rounding, then rounded
// once to fp32; this is "the exact product" every fast path is measured against.
void exl3_matmul_ref(const Exl3Tensor& t, const float* x, int64_t m, float* y);

// fp16 helpers (round to nearest even; exact decode).
uint16_t exl3_f64_to_f16(double v);
float exl3_f16_to_f32(uint16_t h);

}  // namespace spw
