// Loads the vision tensors by the name table in vision_weights.h. Read-only use of the safetensors
// reader; the text model's loader is not involved.
#include "vision/vision_weights.h"

#include <cstring>
#include <utility>

#include "formats/dtypes.h"

namespace spw::vision {
namespace {

class VisionTensors {
 public:
  explicit VisionTensors(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  const TensorInfo* find(const std::string& name) const {
    if (const TensorInfo* t = ckpt_.find(name)) return t;
    return ckpt_.find("model." + name);
  }

  const std::optional<Error>& error() const { return error_; }

  // The tensor widened to f32, or empty after recording the first error.
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) {
    if (error_) return {};
    const TensorInfo* t = find(name);
    if (!t) {
      error_ = make_error(ckpt_.root(), ": missing vision tensor '", name, "' (expected ", shape_text(shape),
                          "); the checkpoint has other vision tensors, so it is incomplete or does not match "
                          "vision_config");
      return {};
    }
    if (t->dtype != DType::BF16 && t->dtype != DType::F32) {
      error_ = make_error(t->file, ": vision tensor '", t->name, "' has dtype ", dtype_name(t->dtype),
                          ", expected BF16 or F32");
      return {};
    }
    if (t->shape != shape) {
      error_ = make_error(t->file, ": vision tensor '", t->name, "' has shape ", shape_text(t->shape), ", expected ",
                          shape_text(shape), " from vision_config");
      return {};
    }
    if (!t->data) {
      error_ = make_error(t->file, ": vision tensor '", t->name, "' has no data (header-only checkpoint?)");
      return {};
    }
    return tensor_floats(*t);
  }

 private:
  const Checkpoint& ckpt_;
  std::optional<Error> error_;
};

bool has_vision_tensors(const Checkpoint& ckpt) {
  for (const auto& [name, info] : ckpt.tensors()) {
    const std::string_view n = name.starts_with("model.") ? std::string_view(name).substr(6) : std::string_view(name);
    if (n.starts_with("vision.") || n.starts_with("aligner.")) return true;
  }
  return false;
}

}  // namespace

Status check_vision_shapes(const VisionConfig& c) {
  if (c.n_layers <= 0 || c.d_model <= 0 || c.n_heads <= 0 || c.d_inter <= 0 || c.patch_size <= 0 ||
      c.downsample_ratio <= 0)
    return make_error("vision_config: layers, hidden_size, heads, intermediate_size, patch_size and "
                      "downsample_ratio must all be positive");
  if (c.d_model % c.n_heads != 0)
    return make_error("vision_config: hidden_size ", c.d_model, " is not a multiple of num_attention_heads ",
                      c.n_heads);
  if ((c.d_model / c.n_heads) % 4 != 0)
    return make_error("vision_config: head size ", c.d_model / c.n_heads,
                      " is not a multiple of 4, which the 2-D rotary embedding needs");
  return {};
}

Result<std::optional<VisionWeights>> load_vision_weights(const Checkpoint& checkpoint, const VisionConfig& config,
                                                         int d_llm) {
  if (!has_vision_tensors(checkpoint)) return std::optional<VisionWeights>{};
  SPW_TRY(check_vision_shapes(config));
  if (d_llm <= 0) return make_error("load_vision_weights: the LLM hidden size must be positive, got ", d_llm);

  const int64_t d = config.d_model, di = config.d_inter, D = d_llm;
  const int64_t n_patch_in = 3LL * config.patch_size * config.patch_size;
  const int64_t n_cell_in = int64_t(config.downsample_ratio) * config.downsample_ratio * d;
  VisionTensors src(checkpoint);
  VisionWeights w;
  w.config = config;
  w.d_llm = d_llm;
  w.patch_embed = src.floats("vision.patch_embed.proj.weight", {d, n_patch_in});
  w.patch_embed_bias = src.floats("vision.patch_embed.proj.bias", {d});
  w.blocks.resize(config.n_layers);
  for (int b = 0; b < config.n_layers; ++b) {
    const std::string p = "vision.blocks." + std::to_string(b) + ".";
    VitBlockWeights& blk = w.blocks[b];
    blk.norm1 = src.floats(p + "norm1.weight", {d});
    blk.norm2 = src.floats(p + "norm2.weight", {d});
    blk.wqkv = src.floats(p + "attn.wqkv.weight", {3 * d, d});
    blk.wqkv_bias = src.floats(p + "attn.wqkv.bias", {3 * d});
    blk.wo = src.floats(p + "attn.wo.weight", {d, d});
    blk.wo_bias = src.floats(p + "attn.wo.bias", {d});
    blk.w1 = src.floats(p + "mlp.w1.weight", {2 * di, d});
    blk.w2 = src.floats(p + "mlp.w2.weight", {d, di});
  }
  w.norm = src.floats("vision.norm.weight", {d});
  w.aligner_w1 = src.floats("aligner.w1.weight", {D, n_cell_in});
  w.aligner_w1_bias = src.floats("aligner.w1.bias", {D});
  w.aligner_w2 = src.floats("aligner.w2.weight", {D, D});
  w.aligner_w2_bias = src.floats("aligner.w2.bias", {D});
  w.image_start = src.floats("image_start", {D});
  w.image_end = src.floats("image_end", {D});
  w.image_newline = src.floats("image_newline", {D});
  if (src.error()) return *src.error();
  if (const TensorInfo* extra = src.find("vision.blocks." + std::to_string(config.n_layers) + ".norm1.weight"))
    return make_error(extra->file, ": the checkpoint has vision block ", config.n_layers, " ('", extra->name,
                      "') but vision_config says num_hidden_layers = ", config.n_layers);
  return std::optional<VisionWeights>(std::move(w));
}

Result<std::optional<VisionWeights>> load_vision_weights(const std::string& model_dir, const VisionConfig& config,
                                                         int d_llm) {
  auto ckpt = Checkpoint::open(model_dir);
  if (!ckpt) return ckpt.error();
  return load_vision_weights(*ckpt, config, d_llm);
}

}  // namespace spw::vision
