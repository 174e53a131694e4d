#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

namespace spw {
namespace {

using json = nlohmann::json;

// Reads typed fields from one JSON object, remembering the first error with its field name.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  template <class T>
  T get(const char* field) {
    if (!obj_.contains(field)) {
      fail(make_error(source_, ": missing field '", field, "'"));
      return T{};
    }
    return as<T>(field, obj_.at(field));
  }
  template <class T>
  T get_or(const char* field, T fallback) {
    if (!obj_.contains(field) || obj_.at(field).is_null()) return fallback;
    return as<T>(field, obj_.at(field));
  }
  bool has(const char* field) const { return obj_.contains(field) && !obj_.at(field).is_null(); }
  const json& raw(const char* field) const { return obj_.at(field); }

  void fail(Error e) {
    if (!error_) error_ = std::move(e);
  }
  // An unsupported value: names the field, the value and what is supported.
  void reject(const char* field, const std::string& value, const std::string& supported) {
    fail(make_error(source_, ": unsupported value ", value, " for field '", field, "' (supported: ", supported,
                    ")"));
  }
  const std::optional<Error>& error() const { return error_; }
  const std::string& source() const { return source_; }

 private:
  template <class T>
  T as(const char* field, const json& v) {
    if (!representable<T>(v)) {
      fail(make_error(source_, ": field '", field, "' has the wrong type or is out of range (", v.dump(), ")"));
      return T{};
    }
    try {
      return v.get<T>();
    } catch (const json::exception&) {
      fail(make_error(source_, ": field '", field, "' has the wrong type (", v.dump(), ")"));
      return T{};
    }
  }
  // Whether v converts to T exactly: nlohmann converts a float to an integer (or a double to a float) by a
  // cast, which is undefined behaviour out of range (1e26 for an int field: found by fuzz/fuzz_model_config).
  // Integer fields take JSON integers in T's range, float fields finite numbers within T's range.
  template <class T>
  static bool representable(const json& v) {
    if constexpr (std::is_same_v<T, bool>) {
      return v.is_boolean();
    } else if constexpr (std::is_integral_v<T>) {
      if (v.is_number_unsigned()) return v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
      if (!v.is_number_integer()) return false;
      const int64_t x = v.get<int64_t>();
      return x >= int64_t(std::numeric_limits<T>::min()) && x <= int64_t(std::numeric_limits<T>::max());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) return false;
      const double x = v.get<double>();
      return std::isfinite(x) && std::fabs(x) <= double(std::numeric_limits<T>::max());
    } else if constexpr (requires { typename T::value_type; } && !std::is_same_v<T, std::string>) {
      if (!v.is_array()) return false;
      for (const json& e : v)
        if (!representable<typename T::value_type>(e)) return false;
      return true;
    } else {
      return true;  // strings: nlohmann reports a mismatch itself
    }
  }
  const json& obj_;
  std::string source_;
  std::optional<Error> error_;
};

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void read_quantization(FieldReader& top, ModelConfig& c) {
  const int expected_block = c.is_v41() ? 32 : 128;
  if (!top.has("quantization_config")) {
    top.fail(make_error(top.source(), ": missing field 'quantization_config' (released checkpoints are FP8)"));
    return;
  }
  // An EXL3 pack (`spillway quantize`, specs/exl3.md §1.5) quantizes only the routed experts and
  // keeps the released FP8 settings under original_quantization_config.
  const json* qc = &top.raw("quantization_config");
  if (qc->is_object() && qc->value("quant_method", json()) == "exl3" && qc->contains("original_quantization_config")) {
    const json& bits = qc->value("bits", json());
    if (!bits.is_number() || bits.get<double>() <= 0 || bits.get<double>() > 16) {
      top.fail(make_error(top.source(), ": quantization_config.bits of an EXL3 pack: expected a number in (0, 16], got ",
                          bits.dump()));
      return;
    }
    c.exl3_expert_bits = bits.get<double>();
    qc = &qc->at("original_quantization_config");
  }
  FieldReader q(*qc, top.source() + " quantization_config");
  auto method = q.get<std::string>("quant_method");
  if (method != "fp8") q.reject("quantization_config.quant_method", in_quotes(method), "\"fp8\"");
  auto fmt = q.get_or<std::string>("fmt", "e4m3");
  if (fmt != "e4m3") q.reject("quantization_config.fmt", in_quotes(fmt), "\"e4m3\"");
  auto scale_fmt = q.get_or<std::string>("scale_fmt", "ue8m0");
  if (scale_fmt != "ue8m0") q.reject("quantization_config.scale_fmt", in_quotes(scale_fmt), "\"ue8m0\"");
  auto block = q.get<std::vector<int>>("weight_block_size");
  if (block.size() != 2 || block[0] != block[1] || block[0] != expected_block)
    q.reject("quantization_config.weight_block_size", json(block).dump(),
             "[" + std::to_string(expected_block) + ", " + std::to_string(expected_block) + "] for " + c.model_type);
  auto expert_dtype = q.get_or<std::string>("expert_dtype", "fp4");
  if (expert_dtype != "fp4") q.reject("quantization_config.expert_dtype", in_quotes(expert_dtype), "\"fp4\"");
  if (q.error()) top.fail(*q.error());
  c.weight_block = expected_block;
  c.act_block = expected_block;
}

void read_rope(FieldReader& f, ModelConfig& c) {
  c.rope_theta = f.get_or<float>("rope_theta", 10000.f);
  c.compress_rope_theta = f.get_or<float>("compress_rope_theta", 160000.f);
  if (!f.has("rope_scaling")) {
    f.fail(make_error(f.source(), ": missing field 'rope_scaling' (the compressed layers use YaRN)"));
    return;
  }
  FieldReader r(f.raw("rope_scaling"), f.source() + " rope_scaling");
  auto type = r.get_or<std::string>("rope_type", r.get_or<std::string>("type", ""));
  if (type != "yarn") r.reject("rope_scaling.type", in_quotes(type), "\"yarn\"");
  c.yarn_factor = r.get<float>("factor");
  c.yarn_original_len = r.get<int64_t>("original_max_position_embeddings");
  c.yarn_beta_fast = r.get_or<float>("beta_fast", 32.f);
  c.yarn_beta_slow = r.get_or<float>("beta_slow", 1.f);
  if (r.error()) f.fail(*r.error());
}

void read_v41_fields(FieldReader& f, ModelConfig& c) {
  c.kv_source_layers = f.get<std::vector<int>>("kv_source_layer_ids");
  c.index_source_layers = f.get<std::vector<int>>("index_source_layer_ids");
  c.candidate_source_layer = f.get<int>("candidate_source_layer_id");
  c.candidate_topk_blocks = f.get<int>("candidate_topk_blocks");
  c.candidate_block_size = f.get<int>("candidate_block_size");
  c.engram_layers = f.get_or<std::vector<int>>("engram_layer_ids", {});
  if (!c.engram_layers.empty()) {
    c.engram_num_embeddings = f.get<std::vector<int64_t>>("engram_num_embeddings");
    c.engram_max_ngram = f.get<int>("engram_max_ngram_size");
    c.engram_vocab_size = f.get<int64_t>("engram_vocab_size");
    c.engram_n_heads = f.get<int>("engram_n_heads");
    c.engram_head_dim = f.get<int>("engram_head_dim");
    c.engram_pad_token_id = f.get<int64_t>("engram_pad_token_id");
    c.engram_compressed_vocab_size = f.get<int64_t>("engram_compressed_vocab_size");
  }
}

// Structural checks that depend on several fields; each names the field and value at fault.
void validate(FieldReader& f, ModelConfig& c) {
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) f.reject(field, std::to_string(v), "a positive integer");
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.d_model);
  positive("num_hidden_layers", c.n_layers);
  positive("num_attention_heads", c.n_heads);
  positive("q_lora_rank", c.q_lora_rank);
  positive("o_lora_rank", c.o_lora_rank);
  positive("moe_intermediate_size", c.d_expert);
  positive("n_routed_experts", c.n_experts);
  positive("sliding_window", c.window);
  positive("hc_mult", c.hc_mult);
  positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  if (c.top_k <= 0 || c.top_k > c.n_experts)
    f.reject("num_experts_per_tok", std::to_string(c.top_k), "1..n_routed_experts");
  if (c.d_rope <= 0 || c.d_rope % 2 != 0 || c.d_rope > c.d_head)
    f.reject("qk_rope_head_dim", std::to_string(c.d_rope), "an even number <= head_dim");
  if (c.o_groups <= 0 || c.n_heads % c.o_groups != 0)
    f.reject("o_groups", std::to_string(c.o_groups), "a divisor of num_attention_heads");
  const int b = c.weight_block;
  if (b > 0) {
    for (auto [field, v] : {std::pair{"hidden_size", c.d_model}, {"q_lora_rank", c.q_lora_rank},
                            {"head_dim", c.d_head}, {"moe_intermediate_size", c.d_expert},
                            {"o_lora_rank", c.o_lora_rank}})
      if (v % b != 0) f.reject(field, std::to_string(v), "a multiple of the FP8 block " + std::to_string(b));
  }
  if (c.d_expert % 32 != 0) f.reject("moe_intermediate_size", std::to_string(c.d_expert), "a multiple of 32 (FP4)");
  if (!c.is_v41() && (c.d_head - c.d_rope) % 64 != 0)
    f.reject("head_dim", std::to_string(c.d_head), "head_dim − qk_rope_head_dim a multiple of 64 (V4 KV fp8 blocks)");
  if (c.index_head_dim < c.d_rope || (c.index_head_dim & (c.index_head_dim - 1)) != 0 || c.index_head_dim % 32 != 0)
    f.reject("index_head_dim", std::to_string(c.index_head_dim), "a power of two >= 32 and >= qk_rope_head_dim");
  if (int(c.compress_ratios.size()) < c.n_layers)
    f.reject("compress_ratios", "of length " + std::to_string(c.compress_ratios.size()),
             "one entry per layer (" + std::to_string(c.n_layers) + ")");
}

void plan_layers(FieldReader& f, ModelConfig& c) {
  c.layers.assign(c.n_layers, LayerPlan{});
  bool seen_kv_source = false, seen_index_source = false, seen_candidate = false;
  for (int l = 0; l < c.n_layers && l < int(c.compress_ratios.size()); ++l) {
    LayerPlan& p = c.layers[l];
    const int r = c.compress_ratios[l];
    p.compress_ratio = r;
    const std::string field = "compress_ratios[" + std::to_string(l) + "]";
    if (!c.is_v41()) {
      p.hash_routed = l < c.n_hash_layers;
      if (r == 0) p.attn = AttnKind::Window;
      else if (r == 4) p.attn = AttnKind::Csa;
      else if (r == 128) p.attn = AttnKind::Hca;
      else f.reject(field.c_str(), std::to_string(r), "0, 4 or 128 for deepseek_v4");
      continue;
    }
    if (r != 0 && r != 1 && r != 2) f.reject(field.c_str(), std::to_string(r), "0, 1 or 2 for deepseek_v41");
    p.kv_source = contains(c.kv_source_layers, l);
    p.index_source = contains(c.index_source_layers, l);
    p.candidate_source = c.candidate_source_layer == l;
    p.engram = contains(c.engram_layers, l);
    const std::string layer = "layer " + std::to_string(l);
    if (r == 0) {
      if (p.kv_source || p.index_source)
        f.reject("kv_source_layer_ids/index_source_layer_ids", layer, "layers with compress ratio > 0");
      p.attn = AttnKind::Window;
    } else if (p.kv_source) {
      if (!p.index_source) f.reject("index_source_layer_ids", layer + " missing", "every KV source also indexes");
      p.attn = AttnKind::Source;
      seen_kv_source = seen_index_source = true;
    } else if (p.index_source) {
      if (!seen_kv_source || !seen_candidate)
        f.reject("index_source_layer_ids", layer, "re-index layers after a KV source and the candidate source");
      p.attn = AttnKind::Reindex;
    } else {
      if (!seen_kv_source || !seen_index_source)
        f.reject("compress_ratios", layer + " reuses before any source", "a KV source before every reuse layer");
      p.attn = AttnKind::Reuse;
    }
    if (p.candidate_source) {
      if (!p.kv_source) f.reject("candidate_source_layer_id", std::to_string(l), "a KV source layer");
      seen_candidate = true;
    }
  }
  if (c.is_v41()) {
    for (int l : c.engram_layers)
      if (l < 0 || l >= c.n_layers) f.reject("engram_layer_ids", std::to_string(l), "backbone layer ids");
    if (!c.engram_layers.empty() && c.engram_num_embeddings.size() != c.engram_layers.size())
      f.reject("engram_num_embeddings", "of length " + std::to_string(c.engram_num_embeddings.size()),
               "one per Engram layer");
    if (c.candidate_block_size <= 0) f.reject("candidate_block_size", std::to_string(c.candidate_block_size), "> 0");
  }
}

}  // namespace

const char* attn_kind_name(AttnKind kind) {
  switch (kind) {
    case AttnKind::Window: return "window";
    case AttnKind::Csa: return "csa";
    case AttnKind::Hca: return "hca";
    case AttnKind::Source: return "source";
    case AttnKind::Reindex: return "reindex";
    case AttnKind::Reuse: return "reuse";
  }
  return "?";
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return make_error(source, ": not a JSON object (is this a model config.json?)");

  ModelConfig c;
  FieldReader top(root, source);
  c.model_type = top.get<std::string>("model_type");
  if (top.error()) return *top.error();
  if (c.model_type == "deepseek_v4") c.arch = Arch::V4;
  else if (c.model_type == "deepseek_v41") c.arch = Arch::V41;
  else return make_error(source, ": unsupported value \"", c.model_type,
                         "\" for field 'model_type' (supported: \"deepseek_v4\", \"deepseek_v41\")");

  const json* text = &root;
  std::string text_source = source;
  if (c.is_v41()) {
    if (!root.contains("text_config") || !root["text_config"].is_object())
      return make_error(source, ": missing field 'text_config' (deepseek_v41 nests the text model)");
    text = &root["text_config"];
    text_source = source + " text_config";
  }
  FieldReader f(*text, text_source);
  c.vocab_size = f.get<int64_t>("vocab_size");
  c.d_model = f.get<int>("hidden_size");
  c.n_layers = f.get<int>("num_hidden_layers");
  c.n_heads = f.get<int>("num_attention_heads");
  c.d_head = f.get<int>("head_dim");
  c.d_rope = f.get<int>("qk_rope_head_dim");
  c.q_lora_rank = f.get<int>("q_lora_rank");
  c.o_groups = f.get<int>("o_groups");
  c.o_lora_rank = f.get<int>("o_lora_rank");
  c.window = f.get<int>("sliding_window");
  c.d_expert = f.get<int>("moe_intermediate_size");
  c.n_experts = f.get<int>("n_routed_experts");
  c.top_k = f.get<int>("num_experts_per_tok");
  c.n_hash_layers = f.get_or<int>("num_hash_layers", 0);
  c.route_scale = f.get<float>("routed_scaling_factor");
  c.swiglu_limit = f.get_or<float>("swiglu_limit", 0.f);
  c.index_n_heads = f.get<int>("index_n_heads");
  c.index_head_dim = f.get<int>("index_head_dim");
  c.index_topk = f.get<int>("index_topk");
  c.hc_mult = f.get<int>("hc_mult");
  c.hc_sinkhorn_iters = f.get<int>("hc_sinkhorn_iters");
  c.hc_eps = f.get_or<float>("hc_eps", 1e-6f);
  c.norm_eps = f.get_or<float>("rms_norm_eps", c.is_v41() ? 1e-20f : 1e-6f);
  c.compress_ratios = f.get<std::vector<int>>("compress_ratios");
  c.bos_id = top.get_or<int64_t>("bos_token_id", f.get_or<int64_t>("bos_token_id", 0));
  c.eos_id = top.get_or<int64_t>("eos_token_id", f.get_or<int64_t>("eos_token_id", 1));
  c.pad_id = top.get_or<int64_t>("pad_token_id", f.get_or<int64_t>("pad_token_id", -1));
  c.image_token_id = top.get_or<int64_t>("image_token_id", -1);
  read_rope(f, c);
  read_quantization(top, c);

  // Fixed choices of the released models that the engine relies on.
  if (f.get_or<int>("num_key_value_heads", 1) != 1)
    f.reject("num_key_value_heads", std::to_string(f.get<int>("num_key_value_heads")), "1 (shared K=V)");
  if (auto act = f.get_or<std::string>("hidden_act", "silu"); act != "silu") f.reject("hidden_act", in_quotes(act), "\"silu\"");
  if (auto s = f.get_or<std::string>("scoring_func", "sqrtsoftplus"); s != "sqrtsoftplus")
    f.reject("scoring_func", in_quotes(s), "\"sqrtsoftplus\"");
  if (auto m = f.get_or<std::string>("topk_method", "noaux_tc"); m != "noaux_tc")
    f.reject("topk_method", in_quotes(m), "\"noaux_tc\"");
  if (!f.get_or<bool>("norm_topk_prob", true)) f.reject("norm_topk_prob", "false", "true");
  if (int n = f.get_or<int>("n_shared_experts", 1); n != 1) f.reject("n_shared_experts", std::to_string(n), "1");
  if (f.get_or<bool>("tie_word_embeddings", false)) f.reject("tie_word_embeddings", "true", "false");
  if (f.get_or<bool>("attention_bias", false)) f.reject("attention_bias", "true", "false");
  if (c.is_v41()) read_v41_fields(f, c);

  if (f.error()) return *f.error();
  if (top.error()) return *top.error();
  validate(f, c);
  if (f.error()) return *f.error();
  plan_layers(f, c);
  if (f.error()) return *f.error();
  return c;
}

Result<ModelConfig> read_model_config(const std::string& path) {
  std::string file = path;
  if (file.size() < 5 || file.substr(file.size() - 5) != ".json") file += "/config.json";
  std::ifstream in(file);
  if (!in) return make_error(file, ": cannot open (is this a model directory?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), file);
}

}  // namespace spw
