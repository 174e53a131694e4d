#include "model/weights.h"

#include <cstring>
#include <filesystem>

#include "base/thread_pool.h"
#include "formats/dtypes.h"
#include "formats/quant.h"
#include "model/exl3_experts.h"

namespace spw {
namespace {

// Looks tensors up by released name (with or without the "model." prefix) and checks them.
class TensorSource {
 public:
  // dense_values = false: linears are checked but hold no values (LoadOptions::dense_values).
  explicit TensorSource(const Checkpoint& ckpt, bool dense_values = true) : ckpt_(ckpt), dense_values_(dense_values) {}

  const std::optional<Error>& error() const { return error_; }
  void fail(Error e) {
    if (!error_) error_ = std::move(e);
  }

  const TensorInfo* find(const std::string& name) const {
    if (auto* t = ckpt_.find(name)) return t;
    return ckpt_.find("model." + name);
  }
  bool has(const std::string& name) const { return find(name) != nullptr; }

  // The tensor, or nullptr after recording an error naming what was expected.
  const TensorInfo* require(const std::string& name, std::initializer_list<DType> dtypes,
                            const std::vector<int64_t>& shape) {
    const TensorInfo* t = find(name);
    if (!t) {
      fail(make_error(ckpt_.root(), ": missing tensor '", name, "' (expected ", shape_text(shape),
                      "); is the checkpoint complete and does config.json match it?"));
      return nullptr;
    }
    bool dtype_ok = false;
    std::string allowed;
    for (DType d : dtypes) {
      dtype_ok |= t->dtype == d;
      allowed += (allowed.empty() ? "" : " or ") + std::string(dtype_name(d));
    }
    if (!dtype_ok) {
      fail(make_error(t->file, ": tensor '", t->name, "' has dtype ", dtype_name(t->dtype), ", expected ", allowed));
      return nullptr;
    }
    if (t->shape != shape) {
      fail(make_error(t->file, ": tensor '", t->name, "' has shape ", shape_text(t->shape), ", expected ",
                      shape_text(shape), " from config.json"));
      return nullptr;
    }
    if (!t->data) {
      fail(make_error(t->file, ": tensor '", t->name, "' has no data (header-only checkpoint?)"));
      return nullptr;
    }
    return t;
  }

  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* t = require(name, {DType::BF16, DType::F32}, shape);
    if (!t) return {};
    return tensor_floats(*t);
  }

  // A weight stored as BF16/F32 and used with product precision `use` (Bf16 or F32).
  Linear plain(const std::string& name, int n_out, int n_in, LinearKind use) {
    Linear l{{}, n_out, n_in, use, {}};
    if (dense_values_)
      l.w = floats(name, {n_out, n_in});
    else
      require(name, {DType::BF16, DType::F32}, {n_out, n_in});
    l.stem = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
    return l;
  }

  // An FP8 e4m3 weight with ue8m0 block scales in "<stem>.scale".
  Linear fp8(const std::string& stem, int n_out, int n_in, int block, LinearKind use = LinearKind::Fp8) {
    const std::string wname = stem + ".weight";
    const TensorInfo* w = require(wname, {DType::F8_E4M3}, {n_out, n_in});
    const int64_t sr = (n_out + block - 1) / block, sc = (n_in + block - 1) / block;
    const TensorInfo* s = require(stem + ".scale", {DType::F8_E8M0}, {sr, sc});
    if (!w || !s) return {};
    // Used as BF16 (wo_a) its values are what the GPU uploads too, so they are always dequantized.
    if (!dense_values_ && use == LinearKind::Fp8) return Linear{{}, n_out, n_in, use, stem};
    std::vector<uint16_t> bf(size_t(n_out) * n_in);
    dequant_fp8_blocks(w->data, s->data, n_out, n_in, block, bf.data());
    return Linear{widen(bf), n_out, n_in, use, stem};
  }

  // An MXFP4 routed-expert weight: I8 [n_out, n_in/2] + ue8m0 [n_out, n_in/32].
  Linear fp4(const std::string& stem, int n_out, int n_in) {
    const TensorInfo* w = require(stem + ".weight", {DType::I8}, {n_out, n_in / 2});
    const TensorInfo* s = require(stem + ".scale", {DType::F8_E8M0}, {n_out, n_in / 32});
    if (!w || !s) return {};
    Linear l = fp4_values(*w, *s, n_out, n_in);
    l.stem = stem;
    return l;
  }

  // The values of a validated MXFP4 weight (thread-safe: touches no state of the source).
  static Linear fp4_values(const TensorInfo& w, const TensorInfo& s, int n_out, int n_in) {
    std::vector<uint16_t> bf(size_t(n_out) * n_in);
    dequant_mxfp4(w.data, s.data, n_out, n_in, bf.data());
    return Linear{widen(bf), n_out, n_in, LinearKind::Fp4, {}};
  }

  HcWeights hc(const std::string& prefix, int hc_mult, int d) {
    const int n_mix = (2 + hc_mult) * hc_mult;
    return HcWeights{f32(prefix + "_fn", {n_mix, int64_t(hc_mult) * d}), f32(prefix + "_base", {n_mix}),
                     f32(prefix + "_scale", {3})};
  }

  std::vector<float> f32(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* t = require(name, {DType::F32}, shape);
    return t ? tensor_floats(*t) : std::vector<float>{};
  }

 private:
  static std::vector<float> widen(const std::vector<uint16_t>& bf) {
    std::vector<float> out(bf.size());
    for (size_t i = 0; i < bf.size(); ++i) out[i] = bf16_to_f32(bf[i]);
    return out;
  }

  const Checkpoint& ckpt_;
  bool dense_values_ = true;
  std::optional<Error> error_;
};

void load_attention(TensorSource& src, const ModelConfig& c, const LayerPlan& plan, const std::string& p,
                    LayerWeights& lw) {
  const int d = c.d_model, D = c.d_head, H = c.n_heads, B = c.weight_block;
  lw.wq_a = src.fp8(p + "attn.wq_a", c.q_lora_rank, d, B);
  lw.q_norm = src.floats(p + "attn.q_norm.weight", {c.q_lora_rank});
  lw.wq_b = src.fp8(p + "attn.wq_b", H * D, c.q_lora_rank, B);
  lw.wkv = src.fp8(p + "attn.wkv", D, d, B);
  lw.kv_norm = src.floats(p + "attn.kv_norm.weight", {D});
  // wo_a is dequantized to BF16 at load and used unquantized (convert.py).
  lw.wo_a = src.fp8(p + "attn.wo_a", c.o_groups * c.o_lora_rank, H * D / c.o_groups, B, LinearKind::Bf16);
  lw.wo_b = src.fp8(p + "attn.wo_b", d, c.o_groups * c.o_lora_rank, B);
  lw.attn_sink = src.f32(p + "attn.attn_sink", {H});

  const int Hi = c.index_n_heads, Di = c.index_head_dim;
  if (plan.attn == AttnKind::Csa || plan.attn == AttnKind::Hca) {
    const int r = plan.compress_ratio, coff = plan.attn == AttnKind::Csa ? 2 : 1;
    lw.comp_wkv = src.plain(p + "attn.compressor.wkv.weight", coff * D, d, LinearKind::F32);
    lw.comp_wgate = src.plain(p + "attn.compressor.wgate.weight", coff * D, d, LinearKind::F32);
    lw.comp_ape = src.f32(p + "attn.compressor.ape", {r, coff * D});
    lw.comp_norm = src.floats(p + "attn.compressor.norm.weight", {D});
    if (plan.attn == AttnKind::Csa) {
      lw.idx_wq_b = src.fp8(p + "attn.indexer.wq_b", Hi * Di, c.q_lora_rank, B);
      lw.idx_weights_proj = src.plain(p + "attn.indexer.weights_proj.weight", Hi, d, LinearKind::Bf16);
      lw.idx_comp_wkv = src.plain(p + "attn.indexer.compressor.wkv.weight", 2 * Di, d, LinearKind::F32);
      lw.idx_comp_wgate = src.plain(p + "attn.indexer.compressor.wgate.weight", 2 * Di, d, LinearKind::F32);
      lw.idx_comp_ape = src.f32(p + "attn.indexer.compressor.ape", {r, 2 * Di});
      lw.idx_comp_norm = src.floats(p + "attn.indexer.compressor.norm.weight", {Di});
    }
  }
  if (plan.kv_source) {
    const bool gated = plan.compress_ratio == 2;
    // Ratio-2 compressors run in FP32; ratio 1 is a plain BF16 projection (specs §5.2).
    lw.comp_wkv = src.plain(p + "attn.compressor.wkv.weight", D, d, gated ? LinearKind::F32 : LinearKind::Bf16);
    if (gated) lw.comp_wgate = src.plain(p + "attn.compressor.wgate.weight", D, d, LinearKind::F32);
    lw.comp_norm = src.floats(p + "attn.compressor.norm.weight", {D});
    lw.idx_wk = src.plain(p + "attn.indexer.wk.weight", Di, D, LinearKind::Bf16);
    lw.idx_k_norm = src.floats(p + "attn.indexer.k_norm.weight", {Di});
  }
  if (plan.index_source) {
    lw.idx_wq_b = src.fp8(p + "attn.indexer.wq_b", Hi * Di, c.q_lora_rank, B);
    lw.idx_weights_proj = src.plain(p + "attn.indexer.weights_proj.weight", Hi, d, LinearKind::Bf16);
  }
}

// A routed expert projection: MXFP4 as released, or EXL3 after `spillway quantize` (model/exl3_experts.h). Without
// values, only checked (names, dtypes, shapes): n_out, n_in and kind are set, w stays empty.
Linear routed_expert_values(TensorSource& src, const std::string& stem, int n_out, int n_in, bool values);

Linear routed_expert_linear(TensorSource& src, const std::string& stem, int n_out, int n_in, bool values) {
  Linear l = routed_expert_values(src, stem, n_out, n_in, values);
  l.stem = stem;
  return l;
}

Linear routed_expert_values(TensorSource& src, const std::string& stem, int n_out, int n_in, bool values) {
  const Exl3Lookup lookup = [&src](const std::string& n) { return src.find(n); };
  if (!exl3_is_stored(lookup, stem)) {
    if (values) return src.fp4(stem, n_out, n_in);
    src.require(stem + ".weight", {DType::I8}, {n_out, n_in / 2});
    src.require(stem + ".scale", {DType::F8_E8M0}, {n_out, n_in / 32});
    return Linear{{}, n_out, n_in, LinearKind::Fp4, {}};
  }
  if (!values) {
    auto t = exl3_load(lookup, stem);  // validates; copies only suh/svh
    if (!t.ok()) src.fail(t.error());
    return Linear{{}, n_out, n_in, LinearKind::Bf16, {}};
  }
  auto l = load_exl3_expert_linear(lookup, stem, n_out, n_in);
  if (!l.ok()) src.fail(l.error());
  return l.ok() ? std::move(l.value()) : Linear{};
}

void load_moe(TensorSource& src, const ModelConfig& c, const LayerPlan& plan, const std::string& p, LayerWeights& lw,
              bool expert_values) {
  const int d = c.d_model, E = c.n_experts, F = c.d_expert;
  lw.gate = src.plain(p + "ffn.gate.weight", E, d, LinearKind::F32);
  if (plan.hash_routed) {
    const TensorInfo* t = src.require(p + "ffn.gate.tid2eid", {DType::I64, DType::I32}, {c.vocab_size, c.top_k});
    if (t) {
      lw.tid2eid.resize(t->numel());
      for (size_t i = 0; i < lw.tid2eid.size(); ++i) {
        int64_t v = 0;
        if (t->dtype == DType::I64) std::memcpy(&v, t->data + 8 * i, 8);
        else { int32_t v32; std::memcpy(&v32, t->data + 4 * i, 4); v = v32; }
        if (v < 0 || v >= E) {
          src.fail(make_error(t->file, ": tensor '", t->name, "' routes to expert ", v, ", outside 0..", E - 1));
          break;
        }
        lw.tid2eid[i] = int32_t(v);
      }
    }
  } else {
    lw.gate_bias = src.f32(p + "ffn.gate.bias", {E});
    if (c.is_v41()) lw.gate_bias_vl = src.f32(p + "ffn.gate.bias_vl", {E});
  }
  lw.experts.resize(E);
  auto expert = [&src, expert_values](const std::string& stem, int n_out, int n_in) {
    return routed_expert_linear(src, stem, n_out, n_in, expert_values);
  };
  const Exl3Lookup lookup = [&src](const std::string& n) { return src.find(n); };
  bool all_mxfp4 = expert_values;
  for (int e = 0; all_mxfp4 && e < E; ++e)
    for (const char* k : {"w1", "w2", "w3"})
      all_mxfp4 = all_mxfp4 && !exl3_is_stored(lookup, p + "ffn.experts." + std::to_string(e) + "." + k);
  if (all_mxfp4) {
    // MXFP4 values for the CPU reference: validate in order, dequantize on every core (a full-width
    // layer's 1,152 tensors took ~290 s on one thread; the results do not depend on the thread count).
    struct Job {
      Linear* out;
      const TensorInfo *w, *s;
      int n_out, n_in;
      std::string stem;
    };
    std::vector<Job> jobs;
    for (int e = 0; e < E; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      Linear* outs[3] = {&lw.experts[e].w1, &lw.experts[e].w2, &lw.experts[e].w3};
      const char* names[3] = {"w1", "w2", "w3"};
      const int n_outs[3] = {F, d, F}, n_ins[3] = {d, F, d};
      for (int k = 0; k < 3; ++k) {
        const std::string stem = ep + names[k];
        const TensorInfo* w = src.require(stem + ".weight", {DType::I8}, {n_outs[k], n_ins[k] / 2});
        const TensorInfo* s = src.require(stem + ".scale", {DType::F8_E8M0}, {n_outs[k], n_ins[k] / 32});
        if (src.error()) return;
        jobs.push_back({outs[k], w, s, n_outs[k], n_ins[k], stem});
      }
    }
    global_pool().parallel_for(jobs.size(), [&jobs](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        *jobs[i].out = TensorSource::fp4_values(*jobs[i].w, *jobs[i].s, jobs[i].n_out, jobs[i].n_in);
        jobs[i].out->stem = jobs[i].stem;
      }
    });
  } else {
    for (int e = 0; e < E; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      lw.experts[e].w1 = expert(ep + "w1", F, d);
      lw.experts[e].w2 = expert(ep + "w2", d, F);
      lw.experts[e].w3 = expert(ep + "w3", F, d);
      if (src.error()) return;
    }
  }
  const std::string sp = p + "ffn.shared_experts.";
  lw.shared.w1 = src.fp8(sp + "w1", F, d, c.weight_block);
  lw.shared.w2 = src.fp8(sp + "w2", d, F, c.weight_block);
  lw.shared.w3 = src.fp8(sp + "w3", F, d, c.weight_block);
}

void load_engram(TensorSource& src, const ModelConfig& c, int slot, const std::string& p, LayerWeights& lw) {
  const int hd = c.engram_head_dim, hc = c.hc_mult, d = c.d_model;
  const int64_t rows = c.engram_num_embeddings[slot];
  EngramWeights& ew = lw.engram;
  ew.table = src.require(p + "engram.embed.weight", {DType::F8_E4M3}, {rows, hd});
  ew.table_scale = src.require(p + "engram.embed.scale", {DType::F8_E8M0}, {rows, hd / 32});
  const int n_in = (c.engram_max_ngram - 1) * c.engram_n_heads * hd;
  ew.wkv = src.fp8(p + "engram.wkv", (hc + 1) * d, n_in, c.weight_block);
  ew.q_weight = src.floats(p + "engram.q_weight", {hc, d});
  ew.k_weight = src.floats(p + "engram.k_weight", {hc, d});
}

Status check_engram_token_map(const TensorInfo* t, const std::string& where, const ModelConfig& c, ModelWeights& w) {
  if (!t || t->dtype != DType::I32 || t->shape != std::vector<int64_t>{c.vocab_size})
    return make_error(where, ": expected tensor 'engram_token_map' I32 [", c.vocab_size, "]");
  w.engram_token_map.resize(c.vocab_size);
  std::memcpy(w.engram_token_map.data(), t->data, t->nbytes);
  for (int32_t v : w.engram_token_map)
    if (v < 0 || v >= c.engram_compressed_vocab_size)
      return make_error(where, ": class id ", v, " outside 0..", c.engram_compressed_vocab_size - 1,
                        " (engram_compressed_vocab_size)");
  return {};
}

// The compressed-token map: a tensor of the checkpoint (a synthetic model in memory), else the file beside it.
Status load_engram_token_map(const Checkpoint& ckpt, const ModelConfig& c, ModelWeights& w) {
  if (const TensorInfo* t = ckpt.find("engram_token_map")) return check_engram_token_map(t, t->file, c, w);
  const std::string path = ckpt.root() + "/engram_token_map.safetensors";
  if (!std::filesystem::exists(path))
    return make_error(path, ": missing; deepseek_v41's Engram layers need the compressed-token map "
                            "(token id → class) that the tokenizer defines");
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return file.error();
  return check_engram_token_map((*file)->find("engram_token_map"), path, c, w);
}

// Layer l's tensors into lw (lw untouched on error).
Status load_layer(TensorSource& src, const ModelConfig& c, int l, const LoadOptions& options, LayerWeights& out) {
  const int d = c.d_model;
  const std::string p = "layers." + std::to_string(l) + ".";
  const LayerPlan& plan = c.layers[l];
  LayerWeights lw;
  lw.attn_norm = src.floats(p + "attn_norm.weight", {d});
  lw.ffn_norm = src.floats(p + "ffn_norm.weight", {d});
  lw.hc_attn = src.hc(p + "hc_attn", c.hc_mult, d);
  lw.hc_ffn = src.hc(p + "hc_ffn", c.hc_mult, d);
  load_attention(src, c, plan, p, lw);
  load_moe(src, c, plan, p, lw, options.routed_expert_values);
  if (plan.engram) {
    int slot = 0;  // the Engram tables are numbered over the Engram layers in order
    for (int j = 0; j < l; ++j) slot += c.layers[j].engram ? 1 : 0;
    load_engram(src, c, slot, p, lw);
  }
  if (src.error()) return *src.error();
  out = std::move(lw);
  return {};
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> load_weights(const std::string& model_dir, const ModelConfig& c,
                                                   const LoadOptions& options) {
  auto ckpt = Checkpoint::open(model_dir);
  if (!ckpt.ok()) return ckpt.error();
  return load_weights(std::move(ckpt.value()), c, options);
}

Result<std::unique_ptr<ModelWeights>> load_weights(Checkpoint checkpoint, const ModelConfig& c,
                                                   const LoadOptions& options) {
  auto w = std::make_unique<ModelWeights>();
  w->checkpoint = std::move(checkpoint);
  TensorSource src(w->checkpoint, options.dense_values);

  const int d = c.d_model;
  w->embed = src.floats("embed.weight", {c.vocab_size, d});
  w->head = src.plain("head.weight", int(c.vocab_size), d, LinearKind::F32);
  w->norm = src.floats("norm.weight", {d});
  if (!c.is_v41()) {
    w->hc_head = HcWeights{src.f32("hc_head_fn", {c.hc_mult, int64_t(c.hc_mult) * d}),
                           src.f32("hc_head_base", {c.hc_mult}), src.f32("hc_head_scale", {1})};
  }
  if (src.error()) return *src.error();

  w->layers.resize(c.n_layers);
  if (options.layer_weights) {
    for (int l = 0; l < c.n_layers; ++l) {
      SPW_TRY(load_layer(src, c, l, options, w->layers[l]));
      if (options.on_progress) options.on_progress(l + 1, c.n_layers);
    }
  }
  if (c.is_v41() && !c.engram_layers.empty()) SPW_TRY(load_engram_token_map(w->checkpoint, c, *w));
  return w;
}

Result<Expert> load_routed_expert(const ModelWeights& w, const ModelConfig& c, int layer, int expert) {
  if (layer < 0 || layer >= c.n_layers || expert < 0 || expert >= c.n_experts)
    return make_error("load_routed_expert: layer ", layer, " expert ", expert, " outside the model");
  TensorSource src(w.checkpoint);
  const std::string ep = "layers." + std::to_string(layer) + ".ffn.experts." + std::to_string(expert) + ".";
  const int d = c.d_model, F = c.d_expert;
  Expert e;
  e.w1 = routed_expert_linear(src, ep + "w1", F, d, true);
  e.w2 = routed_expert_linear(src, ep + "w2", d, F, true);
  e.w3 = routed_expert_linear(src, ep + "w3", F, d, true);
  if (src.error()) return *src.error();
  return e;
}

Status load_layer_weights(ModelWeights& w, const ModelConfig& c, int layer, const LoadOptions& options) {
  if (layer < 0 || layer >= c.n_layers || w.layers.size() != size_t(c.n_layers))
    return make_error("load_layer_weights: layer ", layer, " outside 0..", c.n_layers - 1);
  TensorSource src(w.checkpoint, options.dense_values);
  return load_layer(src, c, layer, options, w.layers[size_t(layer)]);
}

}  // namespace spw

