// Tests for model/config.h: the two tiny fixture configs and the real released shapes parse into
// the layer plans of specs §1.3; every unsupported or malformed value is rejected with a message
// that names the field and the value (docs/STYLE.md rule 7).
#include "model/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace spw {
namespace {

using json = nlohmann::json;

std::string fixture_model(const std::string& arch) {
  return std::string(SPW_SOURCE_DIR) + "/tests/golden/fixtures/" + arch + "/model";
}

// The real DeepSeek-V4-Flash config.json (specs §1.1).
json real_v4_json() {
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 20; ++i) ratios.push_back(4), ratios.push_back(128);
  ratios.push_back(4);
  ratios.push_back(0);  // MTP
  return json{{"architectures", {"DeepseekV4ForCausalLM"}}, {"model_type", "deepseek_v4"}, {"bos_token_id", 0},
              {"eos_token_id", 1}, {"vocab_size", 129280}, {"hidden_size", 4096}, {"num_hidden_layers", 43},
              {"num_nextn_predict_layers", 1}, {"num_attention_heads", 64}, {"num_key_value_heads", 1},
              {"head_dim", 512}, {"qk_rope_head_dim", 64}, {"q_lora_rank", 1024}, {"o_groups", 8},
              {"o_lora_rank", 1024}, {"sliding_window", 128}, {"moe_intermediate_size", 2048},
              {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 6},
              {"num_hash_layers", 3}, {"scoring_func", "sqrtsoftplus"}, {"topk_method", "noaux_tc"},
              {"norm_topk_prob", true}, {"routed_scaling_factor", 1.5}, {"swiglu_limit", 10.0},
              {"hidden_act", "silu"}, {"index_n_heads", 64}, {"index_head_dim", 128}, {"index_topk", 512},
              {"hc_mult", 4}, {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6}, {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000}, {"compress_rope_theta", 160000},
              {"rope_scaling",
               {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536}, {"beta_fast", 32},
                {"beta_slow", 1}}},
              {"max_position_embeddings", 1048576}, {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"},
              {"quantization_config",
               {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"}, {"activation_scheme", "dynamic"},
                {"weight_block_size", {128, 128}}}},
              {"compress_ratios", ratios}};
}

// The real DeepSeek-V4.1-Flash config.json (specs §1.2), text part nested in text_config.
json real_v41_json() {
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  for (int i = 0; i < 3; ++i) ratios.push_back(0);  // DSpark
  json text = {{"model_type", "deepseek_v41_text"}, {"vocab_size", 129280}, {"hidden_size", 5120},
               {"moe_intermediate_size", 2304}, {"num_hidden_layers", 40}, {"num_attention_heads", 64},
               {"num_key_value_heads", 1}, {"head_dim", 512}, {"qk_rope_head_dim", 64}, {"q_lora_rank", 1280},
               {"o_lora_rank", 1024}, {"o_groups", 8}, {"hidden_act", "silu"}, {"swiglu_limit", 10.0},
               {"rms_norm_eps", 1e-20}, {"attention_bias", false}, {"tie_word_embeddings", false},
               {"max_position_embeddings", 1048576}, {"rope_theta", 10000},
               {"rope_scaling",
                {{"rope_type", "yarn"}, {"factor", 16}, {"beta_fast", 32}, {"beta_slow", 1},
                 {"original_max_position_embeddings", 65536}}},
               {"n_routed_experts", 384}, {"n_shared_experts", 1}, {"num_experts_per_tok", 6},
               {"scoring_func", "sqrtsoftplus"}, {"topk_method", "noaux_tc"}, {"norm_topk_prob", true},
               {"routed_scaling_factor", 1.5}, {"sliding_window", 128}, {"compress_ratios", ratios},
               {"compress_rope_theta", 160000}, {"kv_source_layer_ids", {2, 8, 14, 20}},
               {"index_source_layer_ids", {2, 8, 14, 20, 24, 28, 32, 36}}, {"index_n_heads", 32},
               {"index_head_dim", 128}, {"index_topk", 512}, {"candidate_source_layer_id", 20},
               {"candidate_topk_blocks", 2048}, {"candidate_block_size", 8}, {"hc_mult", 4},
               {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6}, {"engram_layer_ids", {1, 14}},
               {"engram_num_embeddings", {384006168, 384016682}}, {"engram_max_ngram_size", 4},
               {"engram_vocab_size", 16000000}, {"engram_n_heads", 8}, {"engram_head_dim", 256},
               {"engram_pad_token_id", 2}, {"engram_compressed_vocab_size", 99092},
               {"num_nextn_predict_layers", 3}, {"dspark_block_size", 5}, {"dspark_noise_token_id", 128799},
               {"dspark_target_layer_ids", {37, 38, 39}}, {"dspark_markov_rank", 256},
               {"dspark_n_routed_experts", 128}, {"dspark_num_experts_per_tok", 3}};
  return json{{"architectures", {"DeepseekV41ForCausalLM"}}, {"model_type", "deepseek_v41"}, {"dtype", "bfloat16"},
              {"bos_token_id", 0}, {"eos_token_id", 1}, {"pad_token_id", 2}, {"image_token_id", 129264},
              {"quantization_config",
               {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 32}},
                {"scale_fmt", "ue8m0"}, {"expert_dtype", "fp4"}}},
              {"text_config", text},
              {"vision_config", {{"model_type", "deepseek_v41_vision"}, {"num_hidden_layers", 32}}}};
}

Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump(), "test/config.json"); }

// Expects a rejection whose message contains the source and every fragment (field, value).
void expect_rejected(const json& j, const std::vector<std::string>& fragments) {
  auto r = parse(j);
  ASSERT_FALSE(r.ok()) << "accepted: " << j.dump().substr(0, 200);
  const std::string& msg = r.error().message;
  EXPECT_NE(msg.find("test/config.json"), std::string::npos) << msg;
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

struct ExpectedPlan {
  AttnKind attn;
  int ratio;
  bool kv_source = false, index_source = false, candidate_source = false, hash_routed = false, engram = false;
};

void expect_plan(const ModelConfig& c, int l, const ExpectedPlan& e) {
  SCOPED_TRACE(::testing::Message() << "layer " << l);
  ASSERT_LT(size_t(l), c.layers.size());
  const LayerPlan& p = c.layers[l];
  EXPECT_EQ(p.attn, e.attn) << attn_kind_name(p.attn) << " vs " << attn_kind_name(e.attn);
  EXPECT_EQ(p.compress_ratio, e.ratio);
  EXPECT_EQ(p.kv_source, e.kv_source);
  EXPECT_EQ(p.index_source, e.index_source);
  EXPECT_EQ(p.candidate_source, e.candidate_source);
  EXPECT_EQ(p.hash_routed, e.hash_routed);
  EXPECT_EQ(p.engram, e.engram);
}

TEST(Config, V4FixturePlan) {
  auto r = read_model_config(fixture_model("v4"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Arch::V4);
  EXPECT_EQ(c.d_model, 256);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.weight_block, 128);
  EXPECT_EQ(c.act_block, 128);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  ASSERT_EQ(c.layers.size(), 5u);
  // README: compress_ratios [0,4,128,4,128,(MTP 0)], num_hash_layers 2.
  expect_plan(c, 0, {AttnKind::Window, 0, false, false, false, true, false});
  expect_plan(c, 1, {AttnKind::Csa, 4, false, false, false, true, false});
  expect_plan(c, 2, {AttnKind::Hca, 128});
  expect_plan(c, 3, {AttnKind::Csa, 4});
  expect_plan(c, 4, {AttnKind::Hca, 128});
}

TEST(Config, V41FixturePlan) {
  auto r = read_model_config(fixture_model("v41") + "/config.json");  // a config.json path works too
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Arch::V41);
  EXPECT_EQ(c.n_layers, 10);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.weight_block, 32);
  EXPECT_EQ(c.pad_id, 2);
  EXPECT_EQ(c.image_token_id, 1023);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-20f);
  EXPECT_EQ(c.engram_layers, (std::vector<int>{1, 4}));
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{6126, 6332}));
  EXPECT_EQ(c.candidate_source_layer, 6);
  // tools/golden/gen_v41.py config: ratios [0,0,2,2,2,2,1,1,1,1], kv sources 2,4,6, index sources
  // 2,4,6,8, candidate 6, Engram 1,4 → the §1.3 roles scaled down:
  expect_plan(c, 0, {AttnKind::Window, 0});
  expect_plan(c, 1, {AttnKind::Window, 0, false, false, false, false, true});
  expect_plan(c, 2, {AttnKind::Source, 2, true, true});
  expect_plan(c, 3, {AttnKind::Reuse, 2});
  expect_plan(c, 4, {AttnKind::Source, 2, true, true, false, false, true});
  expect_plan(c, 5, {AttnKind::Reuse, 2});
  expect_plan(c, 6, {AttnKind::Source, 1, true, true, true});
  expect_plan(c, 7, {AttnKind::Reuse, 1});
  expect_plan(c, 8, {AttnKind::Reindex, 1, false, true});
  expect_plan(c, 9, {AttnKind::Reuse, 1});
}

TEST(Config, RealV4PlanMatchesSpecTable) {
  auto r = parse(real_v4_json());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ModelConfig& c = *r;
  ASSERT_EQ(c.layers.size(), 43u);
  // specs §1.3 (V4): 0,1 window + hash; 2 CSA + hash; even 4..42 CSA; odd 3..41 HCA.
  for (int l = 0; l < 43; ++l) {
    const bool hash = l < 3;
    if (l < 2) expect_plan(c, l, {AttnKind::Window, 0, false, false, false, hash});
    else if (l % 2 == 0) expect_plan(c, l, {AttnKind::Csa, 4, false, false, false, hash});
    else expect_plan(c, l, {AttnKind::Hca, 128});
  }
}

TEST(Config, RealV41PlanMatchesSpecTable) {
  auto r = parse(real_v41_json());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ModelConfig& c = *r;
  EXPECT_EQ(c.d_model, 5120);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.engram_compressed_vocab_size, 99092);
  EXPECT_EQ(c.candidate_topk_blocks, 2048);
  ASSERT_EQ(c.layers.size(), 40u);
  // specs §1.3 (V4.1), row by row.
  for (int l = 0; l < 40; ++l) {
    const bool engram = l == 1 || l == 14;
    if (l <= 1) {
      expect_plan(c, l, {AttnKind::Window, 0, false, false, false, false, engram});
    } else if (l == 2 || l == 8 || l == 14) {
      expect_plan(c, l, {AttnKind::Source, 2, true, true, false, false, engram});
    } else if (l <= 19) {
      expect_plan(c, l, {AttnKind::Reuse, 2});
    } else if (l == 20) {
      expect_plan(c, l, {AttnKind::Source, 1, true, true, true});
    } else if (l == 24 || l == 28 || l == 32 || l == 36) {
      expect_plan(c, l, {AttnKind::Reindex, 1, false, true});
    } else {
      expect_plan(c, l, {AttnKind::Reuse, 1});
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Rejections

// An EXL3 pack (`spillway quantize`, specs/exl3.md §1.5): the released FP8 settings move under
// original_quantization_config and the pack's bits per expert weight are what the memory planner counts.
json as_exl3_pack(json j, const json& bits) {
  json& t = j.contains("text_config") ? j["text_config"] : j;
  json& qc = j.contains("quantization_config") ? j["quantization_config"] : t["quantization_config"];
  qc = json{{"quant_method", "exl3"}, {"bits", bits}, {"codebook", "mul1"}, {"original_quantization_config", qc}};
  return j;
}

TEST(Config, Exl3PackRecordsItsExpertBits) {
  auto released = parse(real_v41_json());
  ASSERT_TRUE(released.ok()) << released.error().message;
  EXPECT_EQ(released->exl3_expert_bits, 0.0);  // MXFP4 experts as released
  auto pack = parse(as_exl3_pack(real_v41_json(), 3.0));
  ASSERT_TRUE(pack.ok()) << pack.error().message;
  EXPECT_EQ(pack->exl3_expert_bits, 3.0);
  EXPECT_EQ(pack->weight_block, released->weight_block);  // the FP8 settings still come from the original
  auto half = parse(as_exl3_pack(real_v4_json(), 2.5));
  ASSERT_TRUE(half.ok()) << half.error().message;
  EXPECT_EQ(half->exl3_expert_bits, 2.5);
}

TEST(ConfigReject, Exl3PackWithoutBits) {
  expect_rejected(as_exl3_pack(real_v41_json(), "three"), {"quantization_config.bits", "\"three\""});
  expect_rejected(as_exl3_pack(real_v4_json(), 0), {"quantization_config.bits", "0"});
  expect_rejected(as_exl3_pack(real_v4_json(), nullptr), {"quantization_config.bits", "null"});
}

// Numbers that do not fit the field's type are errors, not casts (a float beyond int64 for an integer field
// was undefined behaviour in the JSON library's conversion: found by fuzz/fuzz_model_config).
TEST(ConfigReject, NumbersOutsideTheFieldType) {
  json j = real_v41_json();
  j["text_config"]["engram_compressed_vocab_size"] = 1.1e26;
  expect_rejected(j, {"engram_compressed_vocab_size", "out of range"});
  json k = real_v4_json();
  k["num_hidden_layers"] = 43.0;  // a float for an integer field
  expect_rejected(k, {"num_hidden_layers", "43.0"});
  json m = real_v4_json();
  m["num_hidden_layers"] = 4294967296;  // beyond int
  expect_rejected(m, {"num_hidden_layers", "4294967296"});
  json f = real_v4_json();
  f["routed_scaling_factor"] = 1e300;  // beyond float
  expect_rejected(f, {"routed_scaling_factor", "out of range"});
}

TEST(ConfigReject, UnknownModelType) {
  json j = real_v4_json();
  j["model_type"] = "llama";
  expect_rejected(j, {"model_type", "\"llama\""});
}

TEST(ConfigReject, V41WithoutTextConfig) {
  json j = real_v41_json();
  j.erase("text_config");
  expect_rejected(j, {"text_config"});
  j["text_config"] = "not an object";
  expect_rejected(j, {"text_config"});
}

TEST(ConfigReject, MissingHiddenSize) {
  json j = real_v4_json();
  j.erase("hidden_size");
  expect_rejected(j, {"missing field 'hidden_size'"});
  json k = real_v41_json();
  k["text_config"].erase("hidden_size");
  expect_rejected(k, {"text_config", "'hidden_size'"});
}

TEST(ConfigReject, WrongType) {
  json j = real_v4_json();
  j["hidden_size"] = "4096";
  expect_rejected(j, {"'hidden_size'", "wrong type", "\"4096\""});
  j = real_v4_json();
  j["compress_ratios"] = 4;
  expect_rejected(j, {"'compress_ratios'", "wrong type"});
}

TEST(ConfigReject, TwoKvHeads) {
  json j = real_v4_json();
  j["num_key_value_heads"] = 2;
  expect_rejected(j, {"'num_key_value_heads'", "value 2"});
}

TEST(ConfigReject, GeluActivation) {
  json j = real_v41_json();
  j["text_config"]["hidden_act"] = "gelu";
  expect_rejected(j, {"'hidden_act'", "\"gelu\""});
}

TEST(ConfigReject, SoftmaxScoring) {
  json j = real_v4_json();
  j["scoring_func"] = "softmax";
  expect_rejected(j, {"'scoring_func'", "\"softmax\""});
}

TEST(ConfigReject, V4CompressRatioThree) {
  json j = real_v4_json();
  j["compress_ratios"][5] = 3;
  expect_rejected(j, {"compress_ratios[5]", "value 3"});
}

TEST(ConfigReject, V41CompressRatioFour) {
  json j = real_v41_json();
  j["text_config"]["compress_ratios"][30] = 4;
  expect_rejected(j, {"compress_ratios[30]", "value 4"});
}

TEST(ConfigReject, WeightBlock64) {
  json j = real_v4_json();
  j["quantization_config"]["weight_block_size"] = {64, 64};
  expect_rejected(j, {"weight_block_size", "[64,64]"});
  // V4.1 must have 32×32; V4's 128 is wrong there.
  json k = real_v41_json();
  k["quantization_config"]["weight_block_size"] = {128, 128};
  expect_rejected(k, {"weight_block_size", "[128,128]"});
}

TEST(ConfigReject, HiddenSizeNotAMultipleOfTheBlock) {
  json j = real_v4_json();
  j["hidden_size"] = 4000;  // 4000 % 128 = 32
  expect_rejected(j, {"'hidden_size'", "4000", "128"});
  json k = real_v41_json();
  k["text_config"]["hidden_size"] = 5100;  // 5100 % 32 = 12
  expect_rejected(k, {"'hidden_size'", "5100", "32"});
}

TEST(ConfigReject, InvalidJson) {
  for (const std::string text : {"{\"model_type\": \"deepseek_v4\",", "", "[1, 2]", "not json at all"}) {
    auto r = parse_model_config(text, "test/config.json");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.error().message.find("test/config.json"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("JSON"), std::string::npos) << r.error().message;
  }
}

TEST(ConfigReject, MissingFileNamesThePath) {
  auto r = read_model_config("/nonexistent/spw_model_dir");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("/nonexistent/spw_model_dir/config.json"), std::string::npos) << r.error().message;
}

TEST(ConfigReject, FewerCompressRatiosThanLayers) {
  json j = real_v4_json();
  j["compress_ratios"] = {0, 0, 4};
  expect_rejected(j, {"compress_ratios", "length 3", "43"});
}

TEST(ConfigReject, V41ReuseBeforeAnySource) {
  json j = real_v41_json();
  j["text_config"]["kv_source_layer_ids"] = {8, 14, 20};
  j["text_config"]["index_source_layer_ids"] = {8, 14, 20, 24, 28, 32, 36};
  expect_rejected(j, {"compress_ratios", "layer 2"});
}

}  // namespace
}  // namespace spw
