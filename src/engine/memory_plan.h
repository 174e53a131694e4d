// The GPU memory planner: from a ModelConfig and a KV budget, the bytes the GPU forward
// needs, per component, before anything is allocated. Pure host arithmetic; GpuModel sizes its KV
// pools from the same numbers, so the plan is what gets allocated.
//
// Weights are counted in the form device_weights.h uploads them: FP8 e4m3 + ue8m0 block scales,
// MXFP4 nibbles + ue8m0 per 32 (routed experts as released) or EXL3 trellis at the pack's bits plus fp16
// suh/svh (ModelConfig::exl3_expert_bits), BF16 (wo_a, BF16 products), F32 for FP32 products (router, head,
// V4 compressors) and for small vectors (norms, mHC, sinks, biases) and the embedding table.
// A checkpoint that stores an FP32-product weight in BF16 uploads it as BF16, so those entries are
// upper bounds. Engram tables stay in host memory (engram_tables_host_nbytes).
// KV rows use the compact formats of cuda/attn/kv_pages.h (f32 rows for numerics without fake quant);
// pools are whole pages of kKvPageRows rows.
// Tests: tests/gpu/test_engine_plan.cpp; the routed-expert bytes against a checkpoint's tensors:
// tests/python/test_synth_model.py (test_bench_plan_only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/attn/compressor.h"
#include "cuda/attn/kv_pages.h"
#include "model/config.h"
#include "model/expert_tier.h"

namespace spw::engine {

struct KvBudget {
  int max_seqs = 1;            // sequences alive at once
  int64_t max_context = 4096;  // positions per sequence
  int max_step_tokens = 512;   // tokens of one forward call (prefill chunk)
  int max_step_rows = 0;       // rows of one multi-sequence step (GpuModel::forward_chunks); see step_max_rows
  // Positions all sequences hold together (their compressed entries and index keys; the window rings
  // are per sequence); 0: every sequence at max_context. Smaller pools rely on the scheduler's
  // admission and preemption (ModelRunner::kv_can_hold).
  int64_t pool_tokens = 0;
  // Tokens of one forward that GpuModel::truncate may take back (speculative decoding's verified drafts);
  // 0: no forward keeps a rollback log, and no memory is set aside for one.
  int max_rollback_tokens = 0;
};

// Where V4.1's Engram tables live (GpuModelOptions::engram_tables says what each means).
enum class EngramTablePlace { kAuto, kPinned, kDisk };

struct WeightBytes {
  size_t embed = 0, head = 0;  // f32 embedding table; head as stored for an FP32 product
  size_t attention = 0;        // q LoRA, window KV, output projection, norms, sinks
  size_t compressor = 0;       // compressors and the indexers
  size_t routed_experts = 0, shared_experts = 0, router = 0;
  size_t hyper_connections = 0;  // mHC weights of every layer and the V4 head
  size_t engram_dense = 0;       // Engram projections and gates (device)
  size_t total() const {
    return embed + head + attention + compressor + routed_experts + shared_experts + router + hyper_connections +
           engram_dense;
  }
};

struct KvPlan {
  // Pages of each pool for the whole budget, and bytes per page.
  int64_t ring_pages = 0, compressed_pages = 0, index_key_pages = 0;
  size_t ring_page_nbytes = 0, compressed_page_nbytes = 0, index_key_page_nbytes = 0;
  // Bytes one sequence adds per token of context once its window is full (compressed entries and
  // index keys of every layer, amortised over their ratio), and the fixed window rings per sequence.
  double nbytes_per_token = 0;
  size_t ring_nbytes_per_seq = 0;
  size_t pool_nbytes() const {
    return size_t(ring_pages) * ring_page_nbytes + size_t(compressed_pages) * compressed_page_nbytes +
           size_t(index_key_pages) * index_key_page_nbytes;
  }
};

struct MemoryPlan {
  WeightBytes weights;
  KvPlan kv;
  size_t state_nbytes = 0;        // compressor states and page tables of max_seqs sequences
  size_t rollback_nbytes = 0;     // rollback logs of max_seqs sequences (KvBudget::max_rollback_tokens)
  size_t sample_nbytes = 0;       // token sampling of up to kSampleRows decode rows (cuda/ops/sampling.h)
  size_t pick_nbytes = 0;         // the draws' edits of a decode call of max_seqs rows (engine/token_picks.h)
  size_t workspace_nbytes = 0;    // linear workspace + step arena + EXL3 GEMM workspace + sampling + picks (not the fused
                                  // EXL3 MoE's, ~6 MB at V4.1 width, allocated only for EXL3 experts)
  size_t step_arena_nbytes = 0;   // the step's activations at step_max_rows rows (GpuModel's arena)
  size_t staging_host_nbytes = 0;  // pinned host staging of the step's copies (host memory)
  // Routed experts off the GPU (GpuModelOptions::expert_tiers; weights.routed_experts counts only the GPU's): in
  // pinned mapped host memory read by the GPU, in pinned mapped host memory for the CPU worker (which the GPU reads
  // in large steps), and the CPU worker's mailbox (pinned).
  size_t host_gpu_experts_nbytes = 0, host_cpu_experts_nbytes = 0, host_mailbox_nbytes = 0;
  size_t expert_staging_nbytes = 0;  // HBM slots for staged HostGpu experts (counted in workspace_nbytes)
  size_t engram_tables_host_nbytes = 0;
  int max_pages_per_seq = 0;  // page-table width: ceil(max_context / kKvPageRows)
  size_t device_total() const {
    return weights.total() + kv.pool_nbytes() + state_nbytes + rollback_nbytes + workspace_nbytes;
  }
};

// Layers that own compressed entries (V4: every compressed layer; V4.1: the KV sources) and index
// keys (V4: CSA layers; V4.1: the KV sources).
bool layer_has_compressed(const ModelConfig& c, int layer);
bool layer_has_index_keys(const ModelConfig& c, int layer);

// A layer's compressors: its main one and the V4 indexer's (ratio 0: the layer has no such compressor).
struct LayerCompressors {
  cuda::CompressorShape comp, idx_comp;
};
LayerCompressors layer_compressors(const ModelConfig& c, int layer);

// Where a sequence slot's rollback log keeps, per layer, what GpuModel::truncate puts back (float
// offsets within the slot's area of slot_floats): the window-ring rows a forward of at most max_tokens
// tokens replaced (ring_row_nbytes each), and per compressor the rows of the state slots it touched
// before it touched them (kv then score, min(max_tokens, ratio) rows each; with overlap then the previous
// group's kv and score) and the rows it pushed (kv then score, max_tokens rows each).
struct RollbackLayout {
  struct Compressor {
    size_t before = 0, pushed = 0;
  };
  struct Layer {
    size_t ring = 0;
    Compressor comp, idx_comp;
  };
  int max_tokens = 0;
  std::vector<Layer> layers;
  size_t slot_floats = 0;
};
RollbackLayout rollback_layout(const ModelConfig& c, int max_tokens, size_t ring_row_nbytes);

// Decode rows the device samples in one call (GpuModel::decode samples larger steps in pieces).
inline constexpr int kSampleRows = 16;
// Bytes of that sampling workspace for this model and budget.
size_t sample_rows_workspace_nbytes(const ModelConfig& c, const KvBudget& budget);

// Rows of the largest step: a prefill chunk (max_step_tokens), a decode batch (max_seqs) or a
// multi-sequence step (max_step_rows), whichever is largest.
inline int step_max_rows(const KvBudget& b) {
  const int rows = b.max_step_tokens > b.max_seqs ? b.max_step_tokens : b.max_seqs;
  return b.max_step_rows > rows ? b.max_step_rows : rows;
}

// Device bytes of a step's temporaries at n_rows rows and contexts up to max_context, as GpuModel
// allocates them from its arena: the step-long arrays plus the largest sublayer's scope.
size_t step_arena_nbytes(const ModelConfig& c, int64_t n_rows, int64_t max_context);

// Tokens of one fused EXL3 MoE launch (cuda/exl3_moe.h; its workspace holds that many tokens' pairs): a decode
// of every sequence, at least kFusedMoeMinTokens and at most kFusedMoeMaxTokens (larger steps launch in
// pieces, which give the same bits). More tokens a launch share more expert decodes (its groups).
inline constexpr int kFusedMoeMinTokens = 16, kFusedMoeMaxTokens = 64;
inline int fused_moe_tokens(const KvBudget& b) {
  return b.max_seqs < kFusedMoeMinTokens ? kFusedMoeMinTokens : b.max_seqs > kFusedMoeMaxTokens ? kFusedMoeMaxTokens : b.max_seqs;
}

// Widest input of a linear or of the grouped output projection (sizes the linear workspace).
int max_linear_in(const ModelConfig& c);

// Width (k and n capacity) of the EXL3 GEMM workspace GpuModel allocates: max(d_model, d_expert), rounded
// up to 128.
int64_t exl3_workspace_width(const ModelConfig& c);

// The row formats of the three pools: the reference's compact precisions when the numerics fake-
// quantize KV (Numerics::fake_quant), else unquantized f32 rows (Numerics::exact()).
struct KvFormats {
  cuda::KvRowFormat ring, compressed, index_key;
};
KvFormats kv_formats(const ModelConfig& c, bool quantized_kv);

// tiers: where the routed experts live (empty: all on the GPU).
MemoryPlan plan_memory(const ModelConfig& c, const KvBudget& budget, bool quantized_kv = true,
                       const ExpertTiers& tiers = {});

}  // namespace spw::engine
