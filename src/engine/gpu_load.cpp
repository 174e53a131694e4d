// Loading a GpuModel: the memory plan, the weights' upload, the KV pools, compressor state and workspaces.
#include <algorithm>
#include <cmath>
#include <string>

#include "base/host_memory.h"
#include "engine/gpu_model.h"
#include "engine/gpu_step.h"
#include "ops/ref/rope.h"

namespace spw::engine {

namespace {

template <class T>
Status fill(DeviceBuffer<T>& buf, size_t n, T value) {
  return upload(std::vector<T>(n, value), buf);
}

Status alloc_pool(KvPool& pool, const cuda::KvRowFormat& fmt, int64_t n_pages, const ModelConfig& c,
                  const MemoryPlan& plan, int max_seqs) {
  pool.fmt = fmt;
  pool.max_seqs = max_seqs;
  pool.max_pages_per_seq = plan.max_pages_per_seq;
  pool.alloc = cuda::KvPageAllocator(int32_t(n_pages));
  SPW_TRY(pool.pages.alloc(size_t(n_pages) * cuda::kv_page_nbytes(fmt)));
  // Unused page-table entries point at page 0 (never read: rows beyond a sequence's count are not
  // addressed), so a stray read stays in bounds.
  return fill(pool.page_table, size_t(c.n_layers) * max_seqs * plan.max_pages_per_seq, int32_t(0));
}

Status alloc_compressor(CompressorBuffers& cb, const cuda::CompressorShape& shape, int max_seqs) {
  cb.shape = shape;
  const size_t n = size_t(max_seqs) * shape.ratio * shape.width;
  SPW_TRY(cb.kv.alloc(n));
  SPW_TRY(cb.score.alloc(n));
  if (shape.overlap) {
    SPW_TRY(cb.prev_kv.alloc(n));
    SPW_TRY(cb.prev_score.alloc(n));
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<GpuModel>> load_gpu_model(const std::string& model_dir, const Numerics& numerics,
                                                 const GpuModelOptions& options) {
  auto config = read_model_config(model_dir);
  if (!config.ok()) return config.error();
  auto ckpt = Checkpoint::open(model_dir);
  if (!ckpt.ok()) return ckpt.error();
  return load_gpu_model(std::move(config.value()), std::move(ckpt.value()), numerics, options);
}

Result<std::unique_ptr<GpuModel>> load_gpu_model(ModelConfig model_config, Checkpoint checkpoint,
                                                 const Numerics& numerics, const GpuModelOptions& options) {
  const ModelConfig* config = &model_config;
  if (!config->is_v41() && numerics.fake_quant && !numerics.bf16_activations)
    return make_error("load_gpu_model: V4 with fake quant but without bf16 activations is not supported on the GPU: "
                      "its quantized KV rows keep the RoPE channels in bf16, where this CPU mode keeps f32 (use "
                      "Numerics::reference() or Numerics::exact())");
  // The GPU uploads the routed experts' stored bytes (MXFP4 or EXL3 trellis): no f32 host copy of
  // them, which at full width would be ~54 GB per layer (and an EXL3 decode of ~37 min per layer).
  LoadOptions load;
  load.routed_expert_values = false;
  load.dense_values = false;
  load.on_progress = options.on_progress;
  auto weights = load_weights(std::move(checkpoint), *config, load);
  if (!weights.ok()) return weights.error();

  std::unique_ptr<GpuModel> m(new GpuModel());
  m->config_ = std::move(model_config);
  m->numerics_ = numerics;
  m->options_ = options;
  m->host_weights_ = std::move(weights.value());
  const ModelConfig& c = m->config_;
  m->plan_ = plan_memory(c, options.budget, numerics.fake_quant, options.expert_tiers);
  m->state_ = std::make_unique<GpuState>();
  GpuState& st = *m->state_;

  auto w = upload_weights(c, *m->host_weights_, numerics, options.expert_tiers);
  if (!w.ok()) return w.error();
  st.w = std::move(w.value());
  HostExpertOptions host_options;
  host_options.n_threads = options.host_expert_threads;
  host_options.int16_activations = options.host_expert_int16;
  auto host_experts = HostExperts::create(c, *st.w, int(step_max_rows(options.budget)), host_options);
  if (!host_experts.ok()) return host_experts.error();
  st.host_experts = std::move(host_experts.value());

  const int S = options.budget.max_seqs;
  const KvPlan& kv = m->plan_.kv;
  const KvFormats formats = kv_formats(c, numerics.fake_quant);
  SPW_TRY(alloc_pool(st.ring, formats.ring, kv.ring_pages, c, m->plan_, S));
  SPW_TRY(alloc_pool(st.comp, formats.compressed, kv.compressed_pages, c, m->plan_, S));
  SPW_TRY(alloc_pool(st.keys, formats.index_key, kv.index_key_pages, c, m->plan_, S));

  st.comp_state.resize(c.n_layers);
  st.idx_comp_state.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerCompressors lc = layer_compressors(c, l);
    if (lc.comp.ratio > 0) SPW_TRY(alloc_compressor(st.comp_state[l], lc.comp, S));
    if (lc.idx_comp.ratio > 0) SPW_TRY(alloc_compressor(st.idx_comp_state[l], lc.idx_comp, S));
  }
  if (options.budget.max_rollback_tokens > 0) {
    st.rollback = rollback_layout(c, options.budget.max_rollback_tokens, cuda::kv_row_nbytes(formats.ring));
    SPW_TRY(st.rollback_area.alloc(size_t(S) * st.rollback.slot_floats));
  }

  SPW_TRY(upload(ref::rope_frequencies({c.rope_theta, c.d_rope, false}), st.rope_main));
  SPW_TRY(upload(ref::rope_frequencies({c.compress_rope_theta, c.d_rope, true, c.yarn_factor, c.yarn_original_len,
                                        c.yarn_beta_fast, c.yarn_beta_slow}),
                 st.rope_compress));
  if (c.is_v41() && !c.engram_layers.empty()) {
    st.engram_params = ref::engram_hash_params(c.engram_layers, c.engram_vocab_size, c.engram_compressed_vocab_size,
                                               c.engram_max_ngram, c.engram_n_heads);
    for (auto& p : st.engram_params) p.pad_id = m->host_weights_->engram_token_map[c.engram_pad_token_id];
    size_t table_nbytes = 0;
    for (int layer : c.engram_layers) {
      const EngramWeights& ew = m->host_weights_->layers[layer].engram;
      table_nbytes += ew.table->nbytes + ew.table_scale->nbytes;
    }
    m->engram_on_disk_ = options.engram_tables == EngramTablePlace::kDisk ||
                         (options.engram_tables == EngramTablePlace::kAuto && 2 * table_nbytes > spw::host_available_nbytes());
    for (int layer : c.engram_layers) {
      const EngramWeights& ew = m->host_weights_->layers[layer].engram;
      EngramTables& t = st.engram_tables.emplace_back();
      if (m->engram_on_disk_) {
        t.disk_table = ew.table->data;
        t.disk_scale = ew.table_scale->data;
      } else {
        SPW_TRY(t.table.alloc_copy(ew.table->data, ew.table->nbytes));
        SPW_TRY(t.scale.alloc_copy(ew.table_scale->data, ew.table_scale->nbytes));
      }
      std::vector<float> qk(ew.q_weight.size());
      for (size_t i = 0; i < qk.size(); ++i) qk[i] = ew.q_weight[i] * ew.k_weight[i];
      SPW_TRY(upload(qk, t.qk));
    }
  }
  const int max_in = max_linear_in(c);
  SPW_TRY(linear_workspace_alloc(st.ws, step_max_rows(options.budget), max_in,
                                 std::max(size_t(64) << 20, size_t(128) * max_in * sizeof(float))));
  const int64_t exl3_width = exl3_workspace_width(c);  // the plan counts this workspace
  SPW_TRY(exl3_cuda_workspace_alloc(st.exl3_ws, exl3_width, exl3_width));
  st.expert_tables.resize(c.n_layers);
  st.exl3_moe.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    // EXL3 experts compute x·Ŵ from fp16 operands (cuda/exl3_gemm.h): not an f32 product.
    const DeviceLayer& dl = st.w->layers[l];
    if (!numerics.bf16_activations && (dl.shared.is_exl3() || (!dl.experts.empty() && dl.experts[0].is_exl3())))
      return make_error("load_gpu_model: numerics without bf16 activations (Numerics::exact()) need dense routed "
                        "experts; layer ", l, " has EXL3 experts, which the GPU multiplies in fp16");
    SPW_TRY(expert_table_build(st.w->layers[l].experts, st.expert_tables[l]));
    SPW_TRY(exl3_moe_table_build(st.w->layers[l].experts, c.swiglu_limit, st.exl3_moe[l]));
    if (st.exl3_moe[l].ready() && !st.exl3_moe_ws.buf)
      SPW_TRY(exl3_cuda_moe_workspace_alloc(st.exl3_moe_ws, fused_moe_tokens(options.budget) * c.top_k, st.exl3_moe[l].layer.d,
                                            st.exl3_moe[l].layer.f));
    // HostGpu EXL3 experts: staged into HBM for decode steps (expert_staging.h).
    std::vector<uint8_t> mapped(dl.experts.size(), 0);
    bool any_mapped = false;
    for (size_t e = 0; e < dl.experts.size(); ++e)
      if (dl.experts[e].tier == ExpertTier::HostGpu) mapped[e] = 1, any_mapped = true;
    if (any_mapped && st.exl3_moe[l].ready() && options.stage_host_experts) {
      if (st.on_host_gpu.empty()) st.on_host_gpu.resize(c.n_layers);
      SPW_TRY(upload(mapped, st.on_host_gpu[l]));
      if (!st.expert_staging.ready())
        SPW_TRY(expert_staging_alloc(st.expert_staging, st.exl3_moe[l].layer, int(dl.experts.size())));
    }
  }
  if (m->plan_.sample_nbytes > 0) SPW_TRY(st.sample_ws.alloc(m->plan_.sample_nbytes));
  SPW_TRY(st.pick_ws.alloc(m->plan_.pick_nbytes));
  SPW_TRY(st.arena.init(m->plan_.step_arena_nbytes));
  SPW_TRY(st.staging.init(m->plan_.staging_host_nbytes));
  st.cuda_graphs = options.cuda_graphs;
  SPW_CUDA_TRY(cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking));
  st.slot_used.assign(S, false);
  // The uploads above ran on the legacy stream; the model's stream does not wait for it.
  SPW_CUDA_TRY(cudaDeviceSynchronize());
  // Every weight lives on the device (or, for Engram's tables, in mapped host buffers) now: drop the host
  // copies and the checkpoint's maps, keeping only the token map the host-side Engram hashing reads.
  auto kept = std::make_unique<ModelWeights>();
  kept->engram_token_map = std::move(m->host_weights_->engram_token_map);
  // Tables left on disk are read through the checkpoint's maps (their files stay mapped, nothing is resident).
  if (m->engram_on_disk_) kept->checkpoint = std::move(m->host_weights_->checkpoint);
  m->host_weights_ = std::move(kept);
  return m;
}

}  // namespace spw::engine
