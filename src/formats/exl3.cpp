// EXL3 reader and scalar reference decode; see exl3.h for the contract and spec sections.
#include "formats/exl3.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "formats/dtypes.h"

namespace spw {

const char* exl3_codebook_name(Exl3Codebook cb) {
  switch (cb) {
    case Exl3Codebook::k3Inst: return "3inst";
    case Exl3Codebook::kMcg: return "mcg";
    case Exl3Codebook::kMul1: return "mul1";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// fp16 conversion

uint16_t exl3_f64_to_f16(double v) {
  uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  double a = std::fabs(v);
  if (std::isnan(v)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0, -14)) {
    // subnormal range: quantum 2^-24, round half to even
    double q = std::nearbyint(a * std::ldexp(1.0, 24));  // default rounding mode is to-nearest-even
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  double m = std::frexp(a, &e);  // a = m·2^e, m in [0.5, 1)
  // 11 significant bits: scale to [1024, 2048)
  double q = std::nearbyint(std::ldexp(m, 11));
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  int exp_field = e - 1 + 15;
  if (exp_field >= 31) return sign | 0x7c00;
  return sign | static_cast<uint16_t>((exp_field << 10) | (static_cast<int>(q) - 1024));
}

float exl3_f16_to_f32(uint16_t h) { return f16_to_f32(h); }

// ---------------------------------------------------------------------------------------------
// codebooks (spec §2.1)

uint16_t exl3_codebook_f16(Exl3Codebook cb, uint16_t state) {
  const uint32_t s = state;
  if (cb == Exl3Codebook::kMul1) {
    uint32_t x = s * kExl3Mul1Mult;
    uint32_t b = (x & 0xff) + ((x >> 8) & 0xff) + ((x >> 16) & 0xff) + (x >> 24);
    double h = 1024.0 + b;
    const double k_inv = f16_to_f32(0x1EEE), k_bias = f16_to_f32(0xC931);
    return exl3_f64_to_f16(h * k_inv + k_bias);  // product and sum exact in fp64: one rounding
  }
  uint32_t x = cb == Exl3Codebook::kMcg ? s * kExl3McgMult : s * 89226354u + 64248484u;
  x = (x & 0x8FFF8FFFu) ^ 0x3B603B60u;
  double sum = static_cast<double>(f16_to_f32(x & 0xffff)) + f16_to_f32(x >> 16);  // exact
  return exl3_f64_to_f16(sum);
}

namespace {

struct Luts {
  std::array<std::vector<uint16_t>, 3> f16;
  std::array<std::vector<float>, 3> f32;
};

const Luts& luts() {
  static const Luts* l = [] {
    auto* out = new Luts;
    for (int c = 0; c < 3; ++c) {
      out->f16[c].resize(65536);
      out->f32[c].resize(65536);
      for (uint32_t s = 0; s < 65536; ++s) {
        uint16_t h = exl3_codebook_f16(static_cast<Exl3Codebook>(c), static_cast<uint16_t>(s));
        out->f16[c][s] = h;
        out->f32[c][s] = f16_to_f32(h);
      }
    }
    return out;
  }();
  return *l;
}

}  // namespace

const uint16_t* exl3_codebook_lut(Exl3Codebook cb) { return luts().f16[static_cast<int>(cb)].data(); }
const float* exl3_codebook_lut_f32(Exl3Codebook cb) { return luts().f32[static_cast<int>(cb)].data(); }

// ---------------------------------------------------------------------------------------------
// trellis (spec §1.4)

void exl3_tile_states(const uint16_t* tile, Exl3Bits bits, uint16_t states[256]) {
  const int n_words32 = bits.words_per_tile() / 2;
  const int64_t ring = static_cast<int64_t>(n_words32) * 32;
  uint32_t w[64];
  for (int i = 0; i < n_words32; ++i) w[i] = static_cast<uint32_t>(tile[2 * i]) | (static_cast<uint32_t>(tile[2 * i + 1]) << 16);
  int64_t end = 0;  // S(p): stream bits consumed through position p
  for (int p = 0; p < 256; ++p) {
    end += bits.step_bits(p);
    int64_t start = ((end - 16) % ring + ring) % ring;
    int i0 = static_cast<int>(start >> 5), off = static_cast<int>(start & 31);
    uint64_t window = (static_cast<uint64_t>(w[i0]) << 32) | w[(i0 + 1) % n_words32];
    states[p] = static_cast<uint16_t>((window >> (48 - off)) & 0xffff);
  }
}

void exl3_decode_tile(const uint16_t* tile, Exl3Bits bits, Exl3Codebook cb, uint16_t out[256]) {
  uint16_t st[256];
  exl3_tile_states(tile, bits, st);
  const uint16_t* lut = exl3_codebook_lut(cb);
  for (int p = 0; p < 256; ++p) out[exl3_perm_row(p) * 16 + exl3_perm_col(p)] = lut[st[p]];
}

std::vector<uint16_t> exl3_decode_inner(const Exl3Tensor& t) {
  std::vector<uint16_t> w(static_cast<size_t>(t.k) * t.n);
  uint16_t tile[256];
  for (int64_t tk = 0; tk < t.k / 16; ++tk)
    for (int64_t tn = 0; tn < t.n / 16; ++tn) {
      exl3_decode_tile(t.tile(tk, tn), t.bits, t.codebook, tile);
      for (int r = 0; r < 16; ++r)
        std::memcpy(&w[(tk * 16 + r) * t.n + tn * 16], &tile[r * 16], 16 * sizeof(uint16_t));
    }
  return w;
}

// ---------------------------------------------------------------------------------------------
// Hadamard (spec §2.3)

void exl3_had128_f16(const uint16_t* in, uint16_t* out, const uint16_t* pre, const uint16_t* post) {
  float v[128];
  for (int i = 0; i < 128; ++i) {
    float a = f16_to_f32(in[i]);
    if (pre) a = f16_to_f32(exl3_f64_to_f16(static_cast<double>(a) * f16_to_f32(pre[i])));  // exact product
    v[i] = a;
  }
  for (int s = 1; s < 128; s <<= 1)
    for (int i = 0; i < 128; ++i)
      if (!(i & s)) {
        float a = v[i], b = v[i + s];
        v[i] = a + b;
        v[i + s] = a - b;
      }
  const float r_scale = 0.088388347648f;
  for (int i = 0; i < 128; ++i) {
    uint16_t h = exl3_f64_to_f16(v[i] * r_scale);  // fp32 product, then one rounding to fp16
    if (post) h = exl3_f64_to_f16(static_cast<double>(f16_to_f32(h)) * f16_to_f32(post[i]));
    out[i] = h;
  }
}

namespace {

// In-place normalized Sylvester Hadamard of 128 doubles.
void had128_f64(double* v) {
  for (int s = 1; s < 128; s <<= 1)
    for (int i = 0; i < 128; ++i)
      if (!(i & s)) {
        double a = v[i], b = v[i + s];
        v[i] = a + b;
        v[i + s] = a - b;
      }
  const double r = 1.0 / std::sqrt(128.0);
  for (int i = 0; i < 128; ++i) v[i] *= r;
}

}  // namespace

std::vector<float> exl3_weight_ref(const Exl3Tensor& t) {
  std::vector<uint16_t> wi = exl3_decode_inner(t);
  std::vector<double> w(wi.size());
  for (size_t i = 0; i < wi.size(); ++i) w[i] = f16_to_f32(wi[i]);
  double col[128];
  // Hk on the left: columns, blocks of 128 rows.
  for (int64_t j = 0; j < t.n; ++j)
    for (int64_t b = 0; b < t.k; b += 128) {
      for (int i = 0; i < 128; ++i) col[i] = w[(b + i) * t.n + j];
      had128_f64(col);
      for (int i = 0; i < 128; ++i) w[(b + i) * t.n + j] = col[i] * f16_to_f32(t.suh[b + i]);
    }
  // Hn on the right: rows, blocks of 128 columns.
  std::vector<float> out(w.size());
  for (int64_t i = 0; i < t.k; ++i)
    for (int64_t b = 0; b < t.n; b += 128) {
      double* row = &w[i * t.n + b];
      had128_f64(row);
      for (int j = 0; j < 128; ++j) out[i * t.n + b + j] = static_cast<float>(row[j] * f16_to_f32(t.svh[b + j]));
    }
  return out;
}

void exl3_matmul_ref(const Exl3Tensor& t, const float* x, int64_t m, float* y) {
  std::vector<uint16_t> wi = exl3_decode_inner(t);
  std::vector<double> xr(static_cast<size_t>(t.k)), acc(static_cast<size_t>(t.n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < t.k; ++i) xr[i] = static_cast<double>(x[r * t.k + i]) * f16_to_f32(t.suh[i]);
    for (int64_t b = 0; b < t.k; b += 128) had128_f64(&xr[b]);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t i = 0; i < t.k; ++i) {
      const double xi = xr[i];
      const uint16_t* wrow = &wi[i * t.n];
      for (int64_t j = 0; j < t.n; ++j) acc[j] += xi * f16_to_f32(wrow[j]);
    }
    for (int64_t b = 0; b < t.n; b += 128) had128_f64(&acc[b]);
    for (int64_t j = 0; j < t.n; ++j) {
      double v = acc[j] * f16_to_f32(t.svh[j]);
      if (!t.bias.empty()) v += f16_to_f32(t.bias[j]);
      y[r * t.n + j] = static_cast<float>(v);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// loading (spec §1.1–1.3, §1.6)

bool exl3_is_stored(const Exl3Lookup& lookup, const std::string& p) {
  return lookup(p + ".trellis") && (lookup(p + ".suh") || lookup(p + ".su")) && (lookup(p + ".svh") || lookup(p + ".sv"));
}

namespace {

Error tensor_error(const TensorInfo& ti, const std::string& what) {
  return make_error(ti.file, ": tensor ", ti.name, ": ", what);
}

Result<std::vector<uint16_t>> read_f16_vector(const TensorInfo& ti, int64_t len, bool allow_f32) {
  if (ti.shape.size() != 1 || ti.shape[0] != len)
    return tensor_error(ti, "shape " + shape_text(ti.shape) + ", expected [" + std::to_string(len) + "]");
  if (!ti.data) return tensor_error(ti, "no data (header-only file)");
  std::vector<uint16_t> out(static_cast<size_t>(len));
  if (ti.dtype == DType::F16) {
    std::memcpy(out.data(), ti.data, out.size() * 2);
  } else if (ti.dtype == DType::F32 && allow_f32) {  // exllamav3 casts an fp32 bias to fp16 on load
    for (int64_t i = 0; i < len; ++i) {
      float f;
      std::memcpy(&f, ti.data + 4 * i, 4);
      out[i] = exl3_f64_to_f16(f);
    }
  } else {
    return tensor_error(ti, std::string("dtype ") + std::string(dtype_name(ti.dtype)) + ", expected F16");
  }
  return out;
}

// Legacy packed signs: bit i of int16 word j ↔ element 16j+i, set ⇒ −1.
Result<std::vector<uint16_t>> read_signs(const TensorInfo& ti, int64_t len) {
  if (ti.dtype != DType::I16) return tensor_error(ti, std::string("dtype ") + std::string(dtype_name(ti.dtype)) + ", expected I16");
  if (ti.shape.size() != 1 || ti.shape[0] * 16 != len)
    return tensor_error(ti, "shape " + shape_text(ti.shape) + ", expected [" + std::to_string(len / 16) + "]");
  if (!ti.data) return tensor_error(ti, "no data (header-only file)");
  std::vector<uint16_t> out(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    uint16_t word;
    std::memcpy(&word, ti.data + 2 * (i / 16), 2);
    out[i] = ((word >> (i % 16)) & 1) ? 0xBC00 : 0x3C00;  // −1.0 / +1.0
  }
  return out;
}

Status check_marker(const TensorInfo& ti, uint32_t expected) {
  if (ti.dtype != DType::I32 || !(ti.shape.empty() || (ti.shape.size() == 1 && ti.shape[0] == 1)))
    return tensor_error(ti, "codebook marker must be an int32 scalar, got " + std::string(dtype_name(ti.dtype)) + " " + shape_text(ti.shape));
  if (!ti.data) return tensor_error(ti, "no data (header-only file)");
  uint32_t v;
  std::memcpy(&v, ti.data, 4);
  if (v != expected) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "multiplier 0x%08X, expected the locked 0x%08X", v, expected);
    return tensor_error(ti, buf);
  }
  return {};
}

}  // namespace

Result<Exl3Tensor> exl3_load(const Exl3Lookup& lookup, const std::string& p) {
  const TensorInfo* tr = lookup(p + ".trellis");
  if (!tr) return make_error("EXL3 tensor ", p, ": missing ", p, ".trellis");
  if (lookup(p + ".scale")) return tensor_error(*lookup(p + ".scale"), "the very old EXL3 `scale` format is not supported");
  if (tr->dtype != DType::I16) return tensor_error(*tr, std::string("dtype ") + std::string(dtype_name(tr->dtype)) + ", expected I16");
  if (tr->shape.size() != 3 || tr->shape[0] <= 0 || tr->shape[1] <= 0)
    return tensor_error(*tr, "shape " + shape_text(tr->shape) + ", expected [k/16, n/16, 16·K]");
  if (!tr->data) return tensor_error(*tr, "no data (header-only file)");
  Exl3Tensor t;
  t.name = p;
  t.k = tr->shape[0] * 16;
  t.n = tr->shape[1] * 16;
  const int64_t words = tr->shape[2];
  if (words % 16 == 0 && words / 16 >= 1 && words / 16 <= 8) {
    t.bits.k_x2 = static_cast<int>(words / 8);
  } else if (words % 16 == 8 && words >= 24 && words <= 120) {
    t.bits.k_x2 = static_cast<int>(words / 8);  // K = KA + 0.5, KA in 1..7
  } else {
    return tensor_error(*tr, "last dimension " + std::to_string(words) + " is no supported bitrate (16·K words, K in 1..8 or KA+0.5)");
  }
  if (reinterpret_cast<uintptr_t>(tr->data) % 2 != 0) return tensor_error(*tr, "data is not 2-byte aligned");
  t.trellis = reinterpret_cast<const uint16_t*>(tr->data);

  const TensorInfo* mcg = lookup(p + ".mcg");
  const TensorInfo* mul1 = lookup(p + ".mul1");
  if (mcg && mul1) return make_error("EXL3 tensor ", p, ": both mcg and mul1 codebook markers are present");
  if (mcg) {
    SPW_TRY(check_marker(*mcg, kExl3McgMult));
    t.codebook = Exl3Codebook::kMcg;
  } else if (mul1) {
    SPW_TRY(check_marker(*mul1, kExl3Mul1Mult));
    t.codebook = Exl3Codebook::kMul1;
  }
  if (t.bits.half() && t.codebook != Exl3Codebook::kMul1)
    return tensor_error(*tr, "half-integer bitrate K=" + std::to_string(t.bits.ka()) + ".5 requires the mul1 codebook, tensor uses " + exl3_codebook_name(t.codebook));

  if (const TensorInfo* suh = lookup(p + ".suh")) {
    auto v = read_f16_vector(*suh, t.k, false);
    if (!v) return v.error();
    t.suh = std::move(v.value());
  } else if (const TensorInfo* su = lookup(p + ".su")) {
    auto v = read_signs(*su, t.k);
    if (!v) return v.error();
    t.suh = std::move(v.value());
    t.legacy_signs = true;
  } else {
    return make_error("EXL3 tensor ", p, ": missing ", p, ".suh (or legacy ", p, ".su)");
  }
  if (const TensorInfo* svh = lookup(p + ".svh")) {
    auto v = read_f16_vector(*svh, t.n, false);
    if (!v) return v.error();
    t.svh = std::move(v.value());
  } else if (const TensorInfo* sv = lookup(p + ".sv")) {
    auto v = read_signs(*sv, t.n);
    if (!v) return v.error();
    t.svh = std::move(v.value());
    t.legacy_signs = true;
  } else {
    return make_error("EXL3 tensor ", p, ": missing ", p, ".svh (or legacy ", p, ".sv)");
  }
  if (t.k % kExl3HadamardBlock != 0 || t.n % kExl3HadamardBlock != 0)
    return tensor_error(*tr, "k=" + std::to_string(t.k) + ", n=" + std::to_string(t.n) + ": both must be multiples of the 128-wide Hadamard blocks");
  if (const TensorInfo* bias = lookup(p + ".bias")) {
    auto v = read_f16_vector(*bias, t.n, true);
    if (!v) return v.error();
    t.bias = std::move(v.value());
  }
  return t;
}

Result<Exl3Tensor> exl3_load(const Checkpoint& c, const std::string& prefix) {
  return exl3_load([&c](const std::string& n) { return c.find(n); }, prefix);
}

Result<Exl3Tensor> exl3_load(const SafetensorsFile& f, const std::string& prefix) {
  return exl3_load([&f](const std::string& n) { return f.find(n); }, prefix);
}

std::string exl3_expert_prefix(int layer, int expert, int w) {
  return "layers." + std::to_string(layer) + ".ffn.experts." + std::to_string(expert) + ".w" + std::to_string(w);
}

Result<Exl3QuantConfig> exl3_parse_quant_config(const nlohmann::json& qc) {
  if (!qc.is_object()) return make_error("quantization_config: expected an object");
  auto method = qc.find("quant_method");
  if (method == qc.end() || !method->is_string() || method->get<std::string>() != "exl3")
    return make_error("quantization_config.quant_method: expected \"exl3\", got ", method == qc.end() ? std::string("nothing") : method->dump());
  Exl3QuantConfig out;
  auto field_error = [](const char* name, const nlohmann::json& v, const char* want) {
    return make_error("quantization_config.", name, ": expected ", want, ", got ", v.dump());
  };
  if (auto it = qc.find("version"); it != qc.end()) {
    if (!it->is_string()) return field_error("version", *it, "a string");
    out.version = it->get<std::string>();
  }
  if (auto it = qc.find("bits"); it != qc.end()) {
    if (!it->is_number() || it->get<double>() <= 0 || it->get<double>() > 16) return field_error("bits", *it, "a number in (0, 16]");
    out.bits = it->get<double>();
  }
  for (auto [name, slot] : {std::pair{"head_bits", &out.head_bits}, std::pair{"mtp_bits", &out.mtp_bits}}) {
    if (auto it = qc.find(name); it != qc.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<int>() < 1 || it->get<int>() > 8) return field_error(name, *it, "an integer in 1..8");
      *slot = it->get<int>();
    }
  }
  if (auto it = qc.find("codebook"); it != qc.end()) {
    std::string cb = it->is_string() ? it->get<std::string>() : "";
    if (cb == "mul1") out.codebook = Exl3Codebook::kMul1;
    else if (cb == "mcg") out.codebook = Exl3Codebook::kMcg;
    else if (cb == "3inst") out.codebook = Exl3Codebook::k3Inst;
    else return field_error("codebook", *it, "\"mul1\", \"mcg\" or \"3inst\"");
  }
  if (auto it = qc.find("out_scales"); it != qc.end()) {
    std::string os = it->is_string() ? it->get<std::string>() : "";
    if (os != "always" && os != "never" && os != "auto") return field_error("out_scales", *it, "\"always\", \"never\" or \"auto\"");
    out.out_scales = os;
  }
  if (auto it = qc.find("calibration"); it != qc.end()) {
    if (!it->is_object()) return field_error("calibration", *it, "an object {rows, cols}");
    for (auto [name, slot] : {std::pair{"rows", &out.calibration_rows}, std::pair{"cols", &out.calibration_cols}}) {
      auto f = it->find(name);
      if (f == it->end()) continue;
      if (!f->is_number_integer() || f->get<int64_t>() < 0) return field_error(name, *f, "a non-negative integer");
      *slot = f->get<int>();
    }
  }
  return out;
}

}  // namespace spw
