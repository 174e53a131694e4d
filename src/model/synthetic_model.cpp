// make_synthetic_model: the config rules and tensor list of tools/synth/make_synthetic_model.py, in memory.
#include "model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/host_memory.h"
#include "formats/dtypes.h"
#include "model/released_configs.h"
#include "ops/ref/engram_hash.h"

namespace spw {
namespace {

using json = nlohmann::json;

constexpr uint32_t kMul1Mult = 0x83DCD12D;  // exllamav3's mul1 codebook multiplier (formats/exl3.h)
constexpr double kFp8Std = 16.0;            // FP8 codes are drawn ~N(0, 16²); the block scale 2^e sets the std
constexpr size_t kPoolSlack = size_t(64) << 20;  // room for windows at different offsets into a pool

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& name, uint64_t seed) {
  uint64_t h = 0xCBF29CE484222325ull ^ seed;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001B3ull;
  return splitmix64(h);
}

// n quantiles of N(0, 1) at (i + 0.5) / n, by Newton's method on erf.
std::vector<double> normal_quantiles(int n) {
  std::vector<double> x(n, 0.0);
  for (int i = 0; i < n; ++i) {
    const double p = (i + 0.5) / n;
    double v = 0;
    for (int it = 0; it < 60; ++it) {
      const double cdf = 0.5 * (1 + std::erf(v / std::sqrt(2.0)));
      const double step = (cdf - p) / (std::exp(-v * v / 2) / std::sqrt(2 * M_PI));
      v -= step;
      if (std::fabs(step) < 1e-12) break;
    }
    x[i] = v;
  }
  return x;
}

// f16 bits of a normal-range value (|v| in [2^-14, 65504]), round to nearest even.
uint16_t f16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  const int exp = int((u >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = u & 0x7FFFFF;
  uint32_t half = (uint32_t(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return uint16_t(sign | half);
}

int pow2_exponent(double v) { return int(std::floor(std::log2(v) + 0.5)); }

int64_t up128(int64_t value, int k) { return std::max<int64_t>(128, (value / k + 127) / 128 * 128); }

// The bytes every tensor points at. Blobs never move once handed out.
struct Storage {
  std::vector<std::unique_ptr<uint8_t[]>> blobs;
  uint8_t* blob(size_t n) {
    blobs.push_back(std::make_unique_for_overwrite<uint8_t[]>(std::max<size_t>(n, 1)));
    return blobs.back().get();
  }
};

class Builder {
 public:
  Builder(const SyntheticSpec& spec, int block)
      : storage_(std::make_shared<Storage>()), seed_(spec.seed), rng_(spec.seed * 0x2545F4914F6CDD1Dull + 1),
        block_(block) {
    const std::vector<double> q256 = normal_quantiles(256);
    for (int i = 0; i < 256; ++i) {  // the e4m3 code nearest each N(0, 16²) quantile
      const double target = q256[i] * kFp8Std;
      int best = 0;
      double best_err = INFINITY;
      for (int c = 0; c < 256; ++c) {
        const float v = e4m3_to_f32(uint8_t(c));
        if (std::isnan(v)) continue;
        if (std::fabs(v - target) < best_err) best_err = std::fabs(v - target), best = c;
      }
      e4m3_lut_[i] = uint8_t(best);
    }
    const std::vector<double> q16 = normal_quantiles(65536);
    normal_q16_.assign(q16.begin(), q16.end());
  }

  std::vector<TensorInfo> take() { return std::move(tensors_); }
  std::shared_ptr<Storage> storage() const { return storage_; }

  // Sizes the shared pools before any window is handed out (each at least the largest tensor drawn from it).
  void reserve_pools(size_t fp8_max, size_t random_max, int64_t sign_max) {
    fp8_pool_n_ = fp8_max + kPoolSlack;
    fp8_pool_ = storage_->blob(fp8_pool_n_);
    fill_random(fp8_pool_, fp8_pool_n_);
    for (size_t i = 0; i < fp8_pool_n_; ++i) fp8_pool_[i] = e4m3_lut_[fp8_pool_[i]];
    random_pool_n_ = random_max + kPoolSlack;
    random_pool_ = storage_->blob(random_pool_n_);
    fill_random(random_pool_, random_pool_n_);
    sign_pool_n_ = size_t(sign_max) + (size_t(1) << 20);
    sign_pool_ = reinterpret_cast<uint16_t*>(storage_->blob(2 * sign_pool_n_));
    for (size_t i = 0; i < sign_pool_n_; ++i) sign_pool_[i] = (splitmix64(rng_) & 1) ? 0x8000 : 0;
  }

  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const uint8_t* data) {
    TensorInfo t;
    t.name = name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.data = data;
    t.nbytes = size_t(t.numel()) * dtype_nbytes(dtype);
    tensors_.push_back(std::move(t));
  }

  void bf16(const std::string& name, std::vector<int64_t> shape, double std, double mean = 0) {
    const size_t n = numel(shape);
    std::vector<uint16_t> lut(65536);
    for (int i = 0; i < 65536; ++i) lut[i] = f32_to_bf16(float(normal_q16_[i] * std + mean));
    auto* out = reinterpret_cast<uint16_t*>(storage_->blob(2 * n));
    for (size_t i = 0; i < n; ++i) out[i] = lut[splitmix64(rng_) & 0xFFFF];
    add(name, DType::BF16, std::move(shape), reinterpret_cast<const uint8_t*>(out));
  }
  void norm(const std::string& name, int64_t n) { bf16(name, {n}, 0.1, 1.0); }

  void f32(const std::string& name, std::vector<int64_t> shape, double std, double mean = 0) {
    const size_t n = numel(shape);
    auto* out = reinterpret_cast<float*>(storage_->blob(4 * n));
    for (size_t i = 0; i < n; ++i) out[i] = float(normal_q16_[splitmix64(rng_) & 0xFFFF] * std + mean);
    add(name, DType::F32, std::move(shape), reinterpret_cast<const uint8_t*>(out));
  }
  void f32_values(const std::string& name, const std::vector<float>& values) {
    auto* out = storage_->blob(4 * values.size());
    std::memcpy(out, values.data(), 4 * values.size());
    add(name, DType::F32, {int64_t(values.size())}, out);
  }
  void i32_values(const std::string& name, std::vector<int64_t> shape, const std::vector<int32_t>& values) {
    auto* out = storage_->blob(4 * values.size());
    std::memcpy(out, values.data(), 4 * values.size());
    add(name, DType::I32, std::move(shape), out);
  }

  // FP8 e4m3 [rows, cols] + ue8m0 block scales; dequantized std ~ std (default 1/sqrt(cols)).
  void fp8(const std::string& stem, int64_t rows, int64_t cols, double std = 0) {
    if (std == 0) std = 1.0 / std::sqrt(double(cols));
    const int e = pow2_exponent(std / kFp8Std);
    add(stem + ".weight", DType::F8_E4M3, {rows, cols}, window(fp8_pool_, fp8_pool_n_, stem, size_t(rows * cols)));
    const int64_t srows = (rows + block_ - 1) / block_, scols = (cols + block_ - 1) / block_;
    add(stem + ".scale", DType::F8_E8M0, {srows, scols}, constant(uint8_t(127 + e), size_t(srows * scols)));
  }
  // An Engram table: FP8 rows of values ~N(0, 1) (codes ~N(0, 16²) under scale 2^-4 per 32).
  void engram_table(const std::string& stem, int64_t rows, int64_t head_dim) {
    add(stem + ".weight", DType::F8_E4M3, {rows, head_dim}, window(fp8_pool_, fp8_pool_n_, stem, size_t(rows * head_dim)));
    add(stem + ".scale", DType::F8_E8M0, {rows, head_dim / 32}, constant(127 - 4, size_t(rows * head_dim / 32)));
  }
  // MXFP4 [rows, cols/2] I8 + ue8m0 [rows, cols/32]: uniform random nibbles have std 2.93 (|e2m1| of 0..6); the
  // scale brings the weights to ~1/sqrt(cols).
  void mxfp4(const std::string& stem, int64_t rows, int64_t cols) {
    const int e = pow2_exponent(1.0 / (std::sqrt(68.5 / 8) * std::sqrt(double(cols))));
    add(stem + ".weight", DType::I8, {rows, cols / 2}, window(random_pool_, random_pool_n_, stem, size_t(rows * cols / 2)));
    add(stem + ".scale", DType::F8_E8M0, {rows, cols / 32}, constant(uint8_t(127 + e), size_t(rows * cols / 32)));
  }
  // EXL3 (k = n_in, n = n_out, multiples of 128): random trellis words are valid codes; the mul1 codebook has mean
  // 0 and std 1, the Hadamards are orthonormal, so suh = ±1 and svh = ±1/sqrt(k) give weights of std ~1/sqrt(k).
  void exl3(const std::string& stem, int64_t n_out, int64_t n_in, int bits) {
    const int64_t k = n_in, n = n_out;
    add(stem + ".trellis", DType::I16, {k / 16, n / 16, 16 * bits},
        window(random_pool_, random_pool_n_, stem, size_t(k * n * bits / 8)));
    add(stem + ".suh", DType::F16, {k}, signs(stem + ".suh", k, 1.0f));
    add(stem + ".svh", DType::F16, {n}, signs(stem + ".svh", n, float(1.0 / std::sqrt(double(k)))));
    add(stem + ".mul1", DType::I32, {}, mul1());
  }

  uint64_t next() { return splitmix64(rng_); }

 private:
  static size_t numel(const std::vector<int64_t>& shape) {
    return size_t(std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<int64_t>()));
  }

  void fill_random(uint8_t* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t v = splitmix64(rng_);
      std::memcpy(p + i, &v, 8);
    }
    for (; i < n; ++i) p[i] = uint8_t(splitmix64(rng_));
  }

  // n bytes at a 64-byte-aligned offset into the pool chosen by the tensor's name.
  const uint8_t* window(const uint8_t* pool, size_t pool_n, const std::string& name, size_t n) const {
    const size_t span = pool_n - n;
    return pool + (name_hash(name, seed_) % (span + 1)) / 64 * 64;
  }

  // ±mag as f16, the signs a window of the sign pool (mag's bits or'ed in: one blob per distinct mag).
  const uint8_t* signs(const std::string& name, int64_t n, float mag) {
    auto it = sign_mags_.find(mag);
    if (it == sign_mags_.end()) {
      auto* out = reinterpret_cast<uint16_t*>(storage_->blob(2 * sign_pool_n_));
      const uint16_t bits = f16_bits(mag);
      for (size_t i = 0; i < sign_pool_n_; ++i) out[i] = sign_pool_[i] | bits;
      it = sign_mags_.emplace(mag, out).first;
    }
    const size_t span = sign_pool_n_ - size_t(n);
    return reinterpret_cast<const uint8_t*>(it->second + name_hash(name, seed_) % (span + 1));
  }

  const uint8_t* constant(uint8_t value, size_t n) {
    auto& [blob, size] = constants_[value];
    if (size < n) {
      blob = storage_->blob(n);
      std::memset(blob, value, n);
      size = n;
    }
    return blob;
  }

  const uint8_t* mul1() {
    if (!mul1_) {
      mul1_ = storage_->blob(4);
      std::memcpy(mul1_, &kMul1Mult, 4);
    }
    return mul1_;
  }

  std::shared_ptr<Storage> storage_;
  std::vector<TensorInfo> tensors_;
  uint64_t seed_;
  uint64_t rng_;
  int block_;
  uint8_t e4m3_lut_[256];
  std::vector<double> normal_q16_;
  uint8_t* fp8_pool_ = nullptr;
  size_t fp8_pool_n_ = 0;
  uint8_t* random_pool_ = nullptr;
  size_t random_pool_n_ = 0;
  uint16_t* sign_pool_ = nullptr;
  size_t sign_pool_n_ = 0;
  std::map<float, const uint16_t*> sign_mags_;
  std::map<uint8_t, std::pair<uint8_t*, size_t>> constants_;
  uint8_t* mul1_ = nullptr;
};

Status check_spec(const SyntheticSpec& s) {
  if (s.name != "v41-flash")
    return make_error("--synthetic: '", s.name, "' is not built in memory; the one name is v41-flash (for V4-Flash, "
                      "write a checkpoint with tools/synth/make_synthetic_model.py --arch v4)");
  if (s.layers < 1 || s.layers > 40) return make_error("--layers: ", s.layers, " outside 1..40 (V4.1-Flash has 40)");
  if (s.expert_bits < 0 || s.expert_bits > 8)
    return make_error("--expert-bits: ", s.expert_bits, " outside 1..8 (EXL3 bits per weight), or 0 for MXFP4");
  if (s.width_divisor < 1) return make_error("--width-divisor: ", s.width_divisor, " must be at least 1");
  if (s.engram_vocab < 2) return make_error("--engram-vocab: ", s.engram_vocab, " must be at least 2");
  if (!(s.routing_skew >= 0)) return make_error("--routing-skew: ", s.routing_skew, " must be at least 0");
  return {};
}

// The released config cut to the spec (tools/synth/make_synthetic_model.py make_config).
json make_config(const SyntheticSpec& s) {
  json cfg = json::parse(released_config_v41_flash());
  cfg.erase("vision_config");
  json& tc = cfg["text_config"];
  const int N = s.layers;
  tc["num_hidden_layers"] = N;
  auto ratios = tc["compress_ratios"].get<std::vector<int>>();
  ratios.resize(size_t(N));
  tc["compress_ratios"] = ratios;
  tc["num_nextn_predict_layers"] = 0;
  for (const char* key : {"kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids"}) {
    std::vector<int> ids;
    for (int id : tc[key].get<std::vector<int>>())
      if (id < N) ids.push_back(id);
    tc[key] = ids;
  }
  if (tc["candidate_source_layer_id"].get<int>() >= N) tc["candidate_source_layer_id"] = -1;
  for (auto it = tc.begin(); it != tc.end();) it = it.key().rfind("dspark_", 0) == 0 ? tc.erase(it) : std::next(it);
  tc["engram_vocab_size"] = s.engram_vocab;
  std::vector<int64_t> rows;
  for (const auto& p : ref::engram_hash_params(tc["engram_layer_ids"].get<std::vector<int>>(), s.engram_vocab,
                                               tc["engram_compressed_vocab_size"].get<int64_t>(),
                                               tc["engram_max_ngram_size"].get<int>(), tc["engram_n_heads"].get<int>()))
    rows.push_back(p.n_rows);
  tc["engram_num_embeddings"] = rows;
  if (const int k = s.width_divisor; k > 1) {
    const int topk = tc["num_experts_per_tok"], groups = tc["o_groups"];
    tc["hidden_size"] = up128(tc["hidden_size"].get<int64_t>(), k);
    tc["moe_intermediate_size"] = up128(tc["moe_intermediate_size"].get<int64_t>(), k);
    tc["n_routed_experts"] = std::max(2 * topk, tc["n_routed_experts"].get<int>() / k);
    tc["num_attention_heads"] = std::max(groups, tc["num_attention_heads"].get<int>() / k / groups * groups);
    tc["q_lora_rank"] = up128(tc["q_lora_rank"].get<int64_t>(), k);
    tc["o_lora_rank"] = up128(tc["o_lora_rank"].get<int64_t>(), k);
    tc["index_n_heads"] = std::max(4, tc["index_n_heads"].get<int>() / k);
  }
  if (s.expert_bits > 0) {
    json fp8 = cfg["quantization_config"];
    cfg["quantization_config"] = {{"quant_method", "exl3"},
                                  {"version", "synthetic (spillway bench --synthetic)"},
                                  {"bits", double(s.expert_bits)},
                                  {"calibration", {{"rows", 0}, {"cols", 0}}},
                                  {"out_scales", "always"},
                                  {"codebook", "mul1"},
                                  {"quantized_modules", "routed_experts"},
                                  {"original_quantization_config", fp8}};
  }
  cfg["synthetic"] = {{"generator", "spillway bench --synthetic"}, {"layers", N}, {"width_divisor", s.width_divisor},
                      {"experts", s.expert_bits > 0 ? "exl3" : "mxfp4"}, {"routing_skew", s.routing_skew},
                      {"random_weights", true}};
  return cfg;
}

// Every tensor of layer L (the loader's list: model/weights.cpp; the generator's layer_tensors for V4.1).
void layer_tensors(Builder& b, const json& tc, const ModelConfig& c, int L, const SyntheticSpec& s) {
  const int64_t d = c.d_model, H = c.n_heads, D = c.d_head, ql = c.q_lora_rank, G = c.o_groups, olr = c.o_lora_rank;
  const int64_t E = c.n_experts, F = c.d_expert, hc = c.hc_mult, Hi = c.index_n_heads, Di = c.index_head_dim;
  const std::string p = "layers." + std::to_string(L) + ".";
  const int64_t n_mix = (2 + hc) * hc;
  const LayerPlan& plan = c.layers[size_t(L)];
  if (plan.engram) {
    const auto ids = tc["engram_layer_ids"].get<std::vector<int>>();
    const size_t slot = size_t(std::find(ids.begin(), ids.end(), L) - ids.begin());
    b.engram_table(p + "engram.embed", c.engram_num_embeddings[slot], c.engram_head_dim);
    b.fp8(p + "engram.wkv", (hc + 1) * d, int64_t(c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim);
    b.bf16(p + "engram.q_weight", {hc, d}, 0.3, 1.0);
    b.bf16(p + "engram.k_weight", {hc, d}, 0.3, 1.0);
  }
  b.norm(p + "attn_norm.weight", d);
  b.norm(p + "ffn_norm.weight", d);
  for (const char* site : {"attn", "ffn"}) {
    b.f32(p + "hc_" + site + "_fn", {n_mix, hc * d}, 1.0 / std::sqrt(double(hc * d)));
    b.f32(p + "hc_" + site + "_base", {n_mix}, 0.5);
    b.f32(p + "hc_" + site + "_scale", {3}, 0.2, 1.0);
  }
  b.fp8(p + "attn.wq_a", ql, d);
  b.norm(p + "attn.q_norm.weight", ql);
  b.fp8(p + "attn.wq_b", H * D, ql);
  b.fp8(p + "attn.wkv", D, d);
  b.norm(p + "attn.kv_norm.weight", D);
  b.fp8(p + "attn.wo_a", G * olr, H * D / G);
  b.fp8(p + "attn.wo_b", d, G * olr);
  b.f32(p + "attn.attn_sink", {H}, 1.0);
  const double inv_sqrt_d = 1.0 / std::sqrt(double(d));
  if (plan.kv_source) {
    b.bf16(p + "attn.compressor.wkv.weight", {D, d}, inv_sqrt_d);
    if (plan.compress_ratio == 2) b.bf16(p + "attn.compressor.wgate.weight", {D, d}, inv_sqrt_d);
    b.norm(p + "attn.compressor.norm.weight", D);
    b.bf16(p + "attn.indexer.wk.weight", {Di, D}, 1.0 / std::sqrt(double(D)));
    b.norm(p + "attn.indexer.k_norm.weight", Di);
  }
  if (plan.index_source) {
    b.fp8(p + "attn.indexer.wq_b", Hi * Di, ql);
    b.bf16(p + "attn.indexer.weights_proj.weight", {Hi, d}, inv_sqrt_d);
  }
  b.bf16(p + "ffn.gate.weight", {E, d}, inv_sqrt_d);
  if (s.routing_skew > 0) {  // Zipf-like popularity over a random ranking of the layer's experts
    std::vector<int> rank(static_cast<size_t>(E));
    std::iota(rank.begin(), rank.end(), 0);
    for (size_t i = rank.size() - 1; i > 0; --i) std::swap(rank[i], rank[b.next() % (i + 1)]);
    std::vector<float> bias(rank.size());
    for (size_t e = 0; e < bias.size(); ++e) bias[e] = float(-s.routing_skew * std::log1p(double(rank[e])));
    b.f32_values(p + "ffn.gate.bias", bias);
  } else {
    b.f32(p + "ffn.gate.bias", {E}, 0.01);
  }
  b.f32(p + "ffn.gate.bias_vl", {E}, 0.01);
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = p + "ffn.experts." + std::to_string(e) + ".";
    const std::pair<const char*, std::pair<int64_t, int64_t>> parts[] = {{"w1", {F, d}}, {"w2", {d, F}}, {"w3", {F, d}}};
    for (const auto& [w, shape] : parts) {
      if (s.expert_bits > 0)
        b.exl3(q + w, shape.first, shape.second, s.expert_bits);
      else
        b.mxfp4(q + w, shape.first, shape.second);
    }
  }
  b.fp8(p + "ffn.shared_experts.w1", F, d);
  b.fp8(p + "ffn.shared_experts.w2", d, F);
  b.fp8(p + "ffn.shared_experts.w3", F, d);
}

}  // namespace

std::string synthetic_model_name(const SyntheticSpec& s) {
  std::string name = "synthetic " + s.name + ", " + std::to_string(s.layers) + " layers, ";
  name += s.expert_bits > 0 ? "EXL3 " + std::to_string(s.expert_bits) + "-bit experts" : std::string("MXFP4 experts");
  if (s.width_divisor > 1) name += ", widths / " + std::to_string(s.width_divisor);
  if (s.routing_skew > 0) {
    char skew[32];
    std::snprintf(skew, sizeof skew, "%g", s.routing_skew);
    name += std::string(", routing skew ") + skew;
  }
  return name;
}

Result<SyntheticModel> make_synthetic_model(const SyntheticSpec& spec, const std::function<void(int, int)>& on_progress) {
  SPW_TRY(check_spec(spec));
  SyntheticModel m;
  const json cfg = make_config(spec);
  m.config_json = cfg.dump(2);
  auto config = parse_model_config(m.config_json, synthetic_model_name(spec));
  if (!config.ok()) return config.error();
  m.config = std::move(config.value());
  const ModelConfig& c = m.config;
  const json& tc = cfg["text_config"];
  if (spec.expert_bits > 0 && (c.d_model % 128 != 0 || c.d_expert % 128 != 0))
    return make_error("--synthetic: EXL3 experts need widths that are multiples of 128 (d_model ", c.d_model,
                      ", expert width ", c.d_expert, ")");

  Builder b(spec, c.weight_block);
  // The largest tensor each pool serves: FP8 codes (wq_b, wo_a/wo_b, Engram wkv, Engram tables), expert bytes.
  size_t fp8_max = size_t(c.n_heads) * c.d_head * c.q_lora_rank;
  fp8_max = std::max(fp8_max, size_t(c.o_groups) * c.o_lora_rank * (size_t(c.n_heads) * c.d_head / c.o_groups));
  fp8_max = std::max(fp8_max, size_t(c.d_model) * c.o_groups * c.o_lora_rank);
  for (size_t i = 0; i < c.engram_layers.size(); ++i) {
    fp8_max = std::max(fp8_max, size_t(c.engram_num_embeddings[i]) * c.engram_head_dim);
    fp8_max = std::max(fp8_max, size_t(c.hc_mult + 1) * c.d_model * (c.engram_max_ngram - 1) * c.engram_n_heads *
                                    c.engram_head_dim);
  }
  const size_t expert_max = size_t(c.d_model) * c.d_expert * std::max(spec.expert_bits, 4) / 8;
  // What the build holds (the pools, the embedding and head, the Engram tables' scales); the rest is small.
  size_t engram_scales = 0;
  for (int64_t rows : c.engram_num_embeddings) engram_scales = std::max(engram_scales, size_t(rows) * c.engram_head_dim / 32);
  const size_t need = fp8_max + expert_max + 2 * kPoolSlack + engram_scales + 4 * size_t(c.vocab_size) * c.d_model;
  if (const size_t avail = host_available_nbytes(); avail > 0 && need > avail)
    return make_error("--synthetic: building the model needs ", need >> 20, " MiB of host memory and ", avail >> 20,
                      " MiB are available (the Engram tables grow with --engram-vocab: ", spec.engram_vocab, ")");
  b.reserve_pools(fp8_max, expert_max, std::max(c.d_model, c.d_expert));

  b.bf16("embed.weight", {c.vocab_size, c.d_model}, 1.0);
  b.bf16("head.weight", {c.vocab_size, c.d_model}, 1.0 / std::sqrt(double(c.d_model)));
  b.norm("norm.weight", c.d_model);
  if (!c.engram_layers.empty()) {  // token id → compressed Engram class (the tokenizer defines it; random here)
    std::vector<int32_t> map(size_t(c.vocab_size));
    for (int32_t& v : map) v = int32_t(b.next() % uint64_t(c.engram_compressed_vocab_size));
    b.i32_values("engram_token_map", {c.vocab_size}, map);
  }
  for (int L = 0; L < c.n_layers; ++L) {
    layer_tensors(b, tc, c, L, spec);
    if (on_progress) on_progress(L + 1, c.n_layers);
  }
  auto ckpt = Checkpoint::in_memory(synthetic_model_name(spec), b.take(), b.storage());
  if (!ckpt.ok()) return ckpt.error();
  m.checkpoint = std::move(ckpt.value());
  return m;
}

}  // namespace spw
