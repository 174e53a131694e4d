#include "engine/memory_plan.h"

#include "cuda/ops/sampling.h"

#include <algorithm>

#include "cpu/host_moe_mailbox.h"
#include "engine/expert_staging.h"
#include "cuda/attn/kv_pages.h"
#include "cuda/attn/sparse_attn.h"
#include "cuda/exl3_gemm.h"
#include "cuda/exl3_moe.h"
#include "engine/token_picks.h"

namespace spw::engine {
namespace {

size_t ceil_div(int64_t a, int64_t b) { return size_t((a + b - 1) / b); }

size_t fp8_nbytes(int64_t n_out, int64_t n_in, int block) {
  return size_t(n_out * n_in) + ceil_div(n_out, block) * ceil_div(n_in, block);
}
size_t fp4_nbytes(int64_t n_out, int64_t n_in) { return size_t(n_out * n_in / 2 + n_out * n_in / 32); }
// An EXL3 linear: the trellis (bits per weight) and its fp16 sign/scale vectors suh [n_in], svh [n_out].
size_t exl3_nbytes(int64_t n_out, int64_t n_in, double bits) {
  return size_t(double(n_out) * double(n_in) * bits / 8) + 2 * size_t(n_out + n_in);
}
size_t bf16_nbytes(int64_t n) { return size_t(2 * n); }
size_t f32_nbytes(int64_t n) { return size_t(4 * n); }

}  // namespace

KvFormats kv_formats(const ModelConfig& c, bool quantized_kv) {
  if (!quantized_kv)
    return {cuda::kv_format_exact(c.d_head), cuda::kv_format_exact(c.d_head), cuda::kv_format_exact(c.index_head_dim)};
  if (c.is_v41())
    return {cuda::kv_format_window_v41(c.d_head), cuda::kv_format_compressed_v41(c.d_head),
            cuda::kv_format_index_key(c.index_head_dim)};
  return {cuda::kv_format_window_v4(c.d_head, c.d_rope), cuda::kv_format_compressed_v4(c.d_head, c.d_rope),
          cuda::kv_format_index_key(c.index_head_dim)};
}

bool layer_has_compressed(const ModelConfig& c, int layer) {
  const LayerPlan& p = c.layers[layer];
  return c.is_v41() ? p.kv_source : (p.attn == AttnKind::Csa || p.attn == AttnKind::Hca);
}

bool layer_has_index_keys(const ModelConfig& c, int layer) {
  const LayerPlan& p = c.layers[layer];
  return c.is_v41() ? p.kv_source : p.attn == AttnKind::Csa;
}

int max_linear_in(const ModelConfig& c) {
  // The grouped output projection reads the whole attention output [n, H·D] through the workspace.
  int m = std::max({c.d_model, c.q_lora_rank, c.o_groups * c.o_lora_rank, c.d_expert, c.d_head, c.n_heads * c.d_head});
  if (c.is_v41() && !c.engram_layers.empty())
    m = std::max(m, (c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim);
  return m;
}

size_t step_arena_nbytes(const ModelConfig& c, int64_t n, int64_t T) {
  const int64_t d = c.d_model, H = c.n_heads, D = c.d_head, hc = c.hc_mult, E = c.n_experts, F = c.d_expert;
  const int64_t Hi = c.index_n_heads, Di = c.index_head_dim, K = c.top_k, n_mix = (2 + hc) * hc;
  // f32 values (or int32 / int64 counted as one / two) per row of the step.
  const int64_t step = 8                                   // token, slot, row0, position, chunk position
                       + 12                                // per-chunk arrays (at most one chunk per row)
                       + c.index_topk + T / 4              // V4.1 selection, candidate mask (bytes)
                       + hc * d + 2 * d + n_mix            // streams, x, y, mixes
                       + 4 * hc + 2 * hc * hc + hc         // pre/post/comb of both sites, the one-hot
                       + c.vocab_size + 1;                 // logits, next token
  int64_t min_ratio = T;
  for (const LayerPlan& p : c.layers)
    if (p.compress_ratio > 0) min_ratio = std::min<int64_t>(min_ratio, p.compress_ratio);
  const int64_t attn = c.q_lora_rank + 3 * H * D           // cq, q, o
                       + 2 * D + 4 * D + 2 * D + 40       // kv, compressor kv/score (2D wide), entries, their ids
                       + 4 * Di + 2 * Di + Di             // indexer compressor rows, entries, keys
                       + Hi * Di + Hi + 4                 // index queries, weights, score inputs
                       + 2 * T + T / std::max(1, c.candidate_block_size) + 4 + c.candidate_topk_blocks  // scores
                       + std::max<int64_t>(c.index_topk, T / std::max<int64_t>(1, min_ratio) + 1)        // sel
                       + 2 + int64_t(c.o_groups) * c.o_lora_rank;  // ring rows, z
  const int64_t W = exl3_workspace_width(c);
  const int64_t moe = E + 3 * K + d                        // router logits, weights, experts, acc
                      + 2 * d + 3 * F + 3 + 2 * K          // one routed expert's rows; all experts' row lists (host dispatch)
                      // every (row, slot) pair: device dispatch (g, u, h, ys), or grouped EXL3 launches
                      // (g, u, ys, fp16 rotated rows, row lists and items, arrival counters)
                      + K * std::max(3 * F + d + 4, 2 * F + d + W / 2 + W / 128 + 6)
                      + 3 * F + d;                         // shared expert
  const int64_t n_in = int64_t(c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim;
  const int64_t engram = c.engram_layers.empty() ? 0 : n_in + (hc + 1) * d + 2 * c.engram_n_heads * c.engram_max_ngram;
  const int64_t per_row = step + std::max({attn, moe, engram});
  // Decode-sized attention calls take scratch for the split path (cuda/attn/sparse_attn.h), at most
  // kSparseAttnSplitMaxBlocks (query, head) pairs; a step of more rows does not use it.
  const int64_t split_q = std::min<int64_t>(n, std::max<int64_t>(1, cuda::kSparseAttnSplitMaxBlocks / H));
  // Rows per query: the kernel refuses more than kSparseAttnMaxRows (window + selection).
  const int64_t max_sel = std::min<int64_t>(std::max<int64_t>(c.index_topk, T / std::max<int64_t>(1, min_ratio) + 1),
                                            cuda::kSparseAttnMaxRows - c.window);
  const size_t attn_split = sizeof(float) * cuda::sparse_attn_split_scratch_floats(int(split_q), int(H), int(D),
                                                                                   c.window + max_sel);
  // Every allocation is rounded up to 256 B: 1 MiB covers the few hundred of one scope.
  return f32_nbytes(n * per_row) + attn_split + (size_t(1) << 20);
}

int64_t exl3_workspace_width(const ModelConfig& c) {
  return (std::max<int64_t>(c.d_model, c.d_expert) + 127) / 128 * 128;
}

size_t sample_rows_workspace_nbytes(const ModelConfig& c, const KvBudget& budget) {
  auto n = cuda::sample_workspace_nbytes(std::min(kSampleRows, budget.max_seqs), c.vocab_size);
  return n.ok() ? *n : 0;
}

LayerCompressors layer_compressors(const ModelConfig& c, int layer) {
  const LayerPlan& p = c.layers[size_t(layer)];
  LayerCompressors out;
  if (p.attn == AttnKind::Csa || p.attn == AttnKind::Hca) {
    const bool csa = p.attn == AttnKind::Csa;
    out.comp = {p.compress_ratio, csa ? 2 * c.d_head : c.d_head, csa};
    if (csa) out.idx_comp = {p.compress_ratio, 2 * c.index_head_dim, true};
  } else if (p.kv_source && p.compress_ratio > 1) {
    out.comp = {p.compress_ratio, c.d_head, false};
  }
  return out;
}

RollbackLayout rollback_layout(const ModelConfig& c, int max_tokens, size_t ring_row_nbytes) {
  RollbackLayout out;
  out.max_tokens = max_tokens;
  out.layers.resize(size_t(c.n_layers));
  size_t at = 0;
  const auto place = [&](const cuda::CompressorShape& sh, RollbackLayout::Compressor& where) {
    if (sh.ratio == 0) return;
    const size_t w = size_t(sh.width), touched = size_t(std::min(max_tokens, sh.ratio));
    where.before = at;
    at += 2 * touched * w + (sh.overlap ? 2 * size_t(sh.ratio) * w : 0);
    where.pushed = at;
    at += 2 * size_t(max_tokens) * w;
  };
  for (int l = 0; l < c.n_layers; ++l) {
    RollbackLayout::Layer& ll = out.layers[size_t(l)];
    ll.ring = at;
    at += (size_t(max_tokens) * ring_row_nbytes + sizeof(float) - 1) / sizeof(float);
    const LayerCompressors lc = layer_compressors(c, l);
    place(lc.comp, ll.comp);
    place(lc.idx_comp, ll.idx_comp);
  }
  out.slot_floats = at;
  return out;
}

MemoryPlan plan_memory(const ModelConfig& c, const KvBudget& budget, bool quantized_kv, const ExpertTiers& tiers) {
  MemoryPlan plan;
  WeightBytes& w = plan.weights;
  const int64_t d = c.d_model, H = c.n_heads, D = c.d_head, B = c.weight_block, hc = c.hc_mult;
  const int64_t Hi = c.index_n_heads, Di = c.index_head_dim, E = c.n_experts, F = c.d_expert;
  const int64_t n_mix = (2 + hc) * hc;
  w.embed = f32_nbytes(c.vocab_size * d);
  w.head = f32_nbytes(c.vocab_size * d) + f32_nbytes(d);
  if (!c.is_v41()) w.hyper_connections += f32_nbytes(hc * hc * d + hc + 1);
  int engram_slot = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerPlan& p = c.layers[l];
    w.attention += fp8_nbytes(c.q_lora_rank, d, B) + fp8_nbytes(H * D, c.q_lora_rank, B) + fp8_nbytes(D, d, B) +
                   bf16_nbytes(int64_t(c.o_groups) * c.o_lora_rank * (H * D / c.o_groups)) +
                   fp8_nbytes(d, int64_t(c.o_groups) * c.o_lora_rank, B) + f32_nbytes(c.q_lora_rank + D + H + 2 * d);
    w.hyper_connections += 2 * f32_nbytes(n_mix * hc * d + n_mix + 3);
    if (p.attn == AttnKind::Csa || p.attn == AttnKind::Hca) {
      const int64_t coff = p.attn == AttnKind::Csa ? 2 : 1, r = p.compress_ratio;
      w.compressor += 2 * f32_nbytes(coff * D * d) + f32_nbytes(r * coff * D + D);
      if (p.attn == AttnKind::Csa)
        w.compressor += fp8_nbytes(Hi * Di, c.q_lora_rank, B) + bf16_nbytes(Hi * d) + 2 * f32_nbytes(2 * Di * d) +
                        f32_nbytes(r * 2 * Di + Di);
    }
    if (p.kv_source) {
      const bool gated = p.compress_ratio == 2;
      w.compressor += (gated ? 2 * f32_nbytes(D * d) : bf16_nbytes(D * d)) + f32_nbytes(D) + bf16_nbytes(Di * D) +
                      f32_nbytes(Di);
    }
    if (p.index_source) w.compressor += fp8_nbytes(Hi * Di, c.q_lora_rank, B) + bf16_nbytes(Hi * d);
    w.router += f32_nbytes(E * d) + (p.hash_routed ? size_t(4 * c.vocab_size * c.top_k) : f32_nbytes(E));
    const size_t expert_nbytes = 3 * (c.exl3_expert_bits > 0 ? exl3_nbytes(F, d, c.exl3_expert_bits) : fp4_nbytes(F, d));
    int64_t in_tier[kNumExpertTiers] = {E, 0, 0};
    if (!tiers.empty() && size_t(l) < tiers.size()) {
      in_tier[0] = 0;
      for (ExpertTier t : tiers[l]) ++in_tier[int(t)];
    }
    w.routed_experts += size_t(in_tier[int(ExpertTier::Gpu)]) * expert_nbytes;
    plan.host_gpu_experts_nbytes += size_t(in_tier[int(ExpertTier::HostGpu)]) * expert_nbytes;
    plan.host_cpu_experts_nbytes += size_t(in_tier[int(ExpertTier::HostCpu)]) * expert_nbytes;
    w.shared_experts += 2 * fp8_nbytes(F, d, B) + fp8_nbytes(d, F, B);
    if (p.engram) {
      const int64_t n_in = int64_t(c.engram_max_ngram - 1) * c.engram_n_heads * c.engram_head_dim;
      w.engram_dense += fp8_nbytes((hc + 1) * d, n_in, B) + f32_nbytes(2 * hc * d);
      const int64_t rows = c.engram_num_embeddings[engram_slot++];
      plan.engram_tables_host_nbytes += size_t(rows * c.engram_head_dim + rows * (c.engram_head_dim / 32));
    }
  }

  // KV pools: whole pages per (sequence, layer).
  KvPlan& kv = plan.kv;
  const int64_t T = budget.max_context, S = budget.max_seqs;
  // A page-table row holds a sequence's ring (window rows, however short the context) or its entries.
  plan.max_pages_per_seq = int(std::max(ceil_div(T, cuda::kKvPageRows), ceil_div(c.window, cuda::kKvPageRows)));
  const KvFormats formats = kv_formats(c, quantized_kv);
  const size_t ring_row = cuda::kv_row_nbytes(formats.ring), comp_row = cuda::kv_row_nbytes(formats.compressed);
  const size_t key_row = cuda::kv_row_nbytes(formats.index_key);
  kv.ring_page_nbytes = ring_row * cuda::kKvPageRows;
  kv.compressed_page_nbytes = comp_row * cuda::kKvPageRows;
  kv.index_key_page_nbytes = key_row * cuda::kKvPageRows;
  const int64_t ring_pages_per_layer = int64_t(ceil_div(c.window, cuda::kKvPageRows));
  kv.ring_pages = S * c.n_layers * ring_pages_per_layer;
  kv.ring_nbytes_per_seq = size_t(c.n_layers * ring_pages_per_layer) * kv.ring_page_nbytes;
  size_t comp_states = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int64_t r = c.layers[l].compress_ratio;
    if (r == 0) continue;
    // Every sequence at T, or pool_tokens in all plus each sequence's partly filled last page.
    int64_t pages = S * int64_t(ceil_div(int64_t(ceil_div(T, r)), cuda::kKvPageRows));
    if (budget.pool_tokens > 0)
      pages = std::min(pages, int64_t(ceil_div(int64_t(ceil_div(budget.pool_tokens, r)), cuda::kKvPageRows)) + S);
    if (layer_has_compressed(c, l)) {
      kv.compressed_pages += pages;
      kv.nbytes_per_token += double(comp_row) / double(r);
      const int64_t width = c.layers[l].attn == AttnKind::Csa ? 2 * D : D;
      const int64_t copies = c.layers[l].attn == AttnKind::Csa ? 4 : 2;  // kv, score (+ previous group)
      if (!c.is_v41() || r > 1) comp_states += f32_nbytes(copies * r * width);
    }
    if (layer_has_index_keys(c, l)) {
      kv.index_key_pages += pages;
      kv.nbytes_per_token += double(key_row) / double(r);
      if (!c.is_v41()) comp_states += f32_nbytes(4 * r * 2 * Di);
    }
  }
  plan.state_nbytes = size_t(S) * comp_states + 3 * size_t(S) * c.n_layers * plan.max_pages_per_seq * sizeof(int32_t);
  if (budget.max_rollback_tokens > 0)
    plan.rollback_nbytes = size_t(S) * rollback_layout(c, budget.max_rollback_tokens, ring_row).slot_floats * sizeof(float);

  // Workspace: the dense-linear workspace (activations + 128 dequantized weight rows, at least the
  // 64 MiB the dense library defaults to), the step arena and the EXL3 GEMM workspace (always allocated).
  const int64_t n = step_max_rows(budget), max_in = max_linear_in(c);
  const size_t linear_ws = f32_nbytes(n * max_in) + std::max(size_t(64) << 20, f32_nbytes(128 * max_in));
  plan.step_arena_nbytes = step_arena_nbytes(c, n, T);
  const int64_t exl3_w = exl3_workspace_width(c);
  plan.sample_nbytes = sample_rows_workspace_nbytes(c, budget);
  plan.pick_nbytes = pick_workspace_nbytes(budget.max_seqs, c.vocab_size);
  plan.workspace_nbytes = linear_ws + plan.step_arena_nbytes + exl3_cuda_workspace_nbytes(exl3_w, exl3_w) +
                          plan.sample_nbytes + plan.pick_nbytes;
  if (c.exl3_expert_bits > 0)
    plan.workspace_nbytes += exl3_cuda_moe_workspace_nbytes(fused_moe_tokens(budget) * c.top_k, d, F);
  // Staging: the per-row arrays of a step and the page-table rows of a decode batch; larger copies
  // (all-logits downloads, test hooks) synchronise and reuse it.
  plan.staging_host_nbytes = size_t(4) << 20;
  if (plan.host_cpu_experts_nbytes > 0) plan.host_mailbox_nbytes = HostMoeMailboxLayout{n, d, c.top_k}.nbytes();
  // HostGpu EXL3 experts of decode steps are staged into HBM slots (engine/expert_staging.h).
  if (plan.host_gpu_experts_nbytes > 0 && c.exl3_expert_bits > 0) {
    plan.expert_staging_nbytes = size_t(kStagingSlots) * 3 * exl3_nbytes(F, d, c.exl3_expert_bits);
    plan.workspace_nbytes += plan.expert_staging_nbytes;
  }
  return plan;
}

}  // namespace spw::engine
