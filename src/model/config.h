// Model configuration for DeepSeek-V4-Flash (`deepseek_v4`) and DeepSeek-V4.1-Flash
// (`deepseek_v41`, text part nested in `text_config`), read from a released config.json.
// Every field we depend on is validated at load: a value outside what the engine supports is
// rejected with an error naming the field and the value (specs/deepseek-v4.md §1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace spw {

enum class Arch { V4, V41 };

// What a layer's attention does beyond the 128-token window (specs §1.3).
enum class AttnKind {
  Window,      // window only (ratio 0)
  Csa,         // V4 ratio 4: overlapping compressor + Lightning Indexer top-k
  Hca,         // V4 ratio 128: compressor, attend to every visible entry
  Source,      // V4.1: own compressor (KV source) and own indexer (index source)
  Reindex,     // V4.1: own indexer queries over the latest keys, masked by candidate blocks
  Reuse,       // V4.1: latest source's compressed KV and latest index source's top-k
};

struct LayerPlan {
  AttnKind attn = AttnKind::Window;
  int compress_ratio = 0;
  bool kv_source = false;         // V4.1: owns a compressor and index keys
  bool index_source = false;      // V4.1: runs an indexer and publishes top-k
  bool candidate_source = false;  // V4.1: publishes candidate blocks
  bool hash_routed = false;       // V4: tid2eid routing
  bool engram = false;            // V4.1: Engram before the block
};

struct ModelConfig {
  Arch arch = Arch::V4;
  std::string model_type;
  int64_t vocab_size = 0;
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;
  int d_head = 0;
  int d_rope = 0;
  int q_lora_rank = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int window = 0;
  int d_expert = 0;
  int n_experts = 0;
  int top_k = 0;
  int n_hash_layers = 0;
  float route_scale = 1.f;
  float swiglu_limit = 0.f;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int hc_mult = 0;
  int hc_sinkhorn_iters = 0;
  float hc_eps = 0.f;
  float norm_eps = 0.f;
  float rope_theta = 0.f;
  float compress_rope_theta = 0.f;
  float yarn_factor = 1.f;
  int64_t yarn_original_len = 0;
  float yarn_beta_fast = 32.f;
  float yarn_beta_slow = 1.f;
  int weight_block = 0;      // FP8 weight block (128 in V4, 32 in V4.1)
  int act_block = 0;         // activation quant block before FP8/FP4 GEMMs
  // > 0: the routed experts are EXL3 trellis tensors of this many bits per weight (quantization_config.bits of a
  // `spillway quantize` pack); 0: MXFP4 as released. What the memory planner counts before loading.
  double exl3_expert_bits = 0;
  std::vector<int> compress_ratios;  // per backbone layer
  int64_t bos_id = 0, eos_id = 1, pad_id = -1;
  // V4.1 only.
  std::vector<int> kv_source_layers, index_source_layers;
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  std::vector<int> engram_layers;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram = 0;
  int64_t engram_vocab_size = 0;
  int engram_n_heads = 0;
  int engram_head_dim = 0;
  int64_t engram_pad_token_id = 0;
  int64_t engram_compressed_vocab_size = 0;
  int64_t image_token_id = -1;

  std::vector<LayerPlan> layers;  // derived, one per backbone layer

  bool is_v41() const { return arch == Arch::V41; }
};

// Reads <dir>/config.json (or a config.json path).
Result<ModelConfig> read_model_config(const std::string& path);
// Parses config JSON text; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);

const char* attn_kind_name(AttnKind kind);

}  // namespace spw
