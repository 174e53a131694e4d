// Internal to the engine: the GPU model's device state (pools, page tables, compressor states,
// workspace) and the context of one forward step, shared by the sublayers. Not a public API.
#pragma once

#include <span>
#include <vector>

#include "cuda/attn/compressor.h"
#include "cuda/attn/kv_pages.h"
#include "cuda/dense/dense_linear.h"
#include "engine/device_buffer.h"
#include "engine/device_weights.h"
#include "engine/gpu_model.h"
#include "ops/ref/engram_hash.h"

namespace spw::engine {

// One compressor's streaming state for every sequence slot (cuda/attn/compressor.h).
struct CompressorBuffers {
  cuda::CompressorShape shape;  // ratio 0: the layer has no such compressor
  DeviceBuffer<float> kv, score, prev_kv, prev_score;
  cuda::CompressorStates view() const { return {kv.get(), score.get(), prev_kv.get(), prev_score.get()}; }
};

// One paged pool with its page tables, laid out [n_layers][max_seqs][max_pages_per_seq], so that a
// layer's view indexes sequences by slot.
struct KvPool {
  cuda::KvRowFormat fmt;
  DeviceBuffer<uint8_t> pages;
  DeviceBuffer<int32_t> page_table;
  cuda::KvPageAllocator alloc{0};
  int max_seqs = 0, max_pages_per_seq = 0;

  cuda::KvPages view(int layer) const {
    return {pages.get(), page_table.get() + size_t(layer) * max_seqs * max_pages_per_seq, max_pages_per_seq, fmt};
  }
};

struct GpuState {
  std::unique_ptr<DeviceWeights> w;
  KvPool ring, comp, keys;
  std::vector<CompressorBuffers> comp_state, idx_comp_state;  // per layer
  DeviceBuffer<float> rope_main, rope_compress;                // [d_rope/2] frequencies
  std::vector<ref::EngramHashParams> engram_params;
  LinearWorkspace ws;
  Exl3CudaWorkspace exl3_ws;  // EXL3 experts (max(d, F) wide)
  std::vector<bool> slot_used;
};

// One forward call of one sequence.
struct GpuStep {
  const ModelConfig& c;
  const DeviceWeights& w;
  const ModelWeights& host_w;
  const Numerics& num;
  GpuState& st;
  GpuSequence& seq;
  std::span<const int32_t> tokens;
  int64_t p = 0;  // position of tokens[0]
  int n = 0;
  LinearPath path = LinearPath::kAuto;
  cudaStream_t stream = nullptr;
  // Device arrays of the step, [n] each: token ids, positions p + i, the slot, p, 0; and [1]: n.
  DeviceBuffer<int32_t> tokens_d{}, slots{}, zeros{}, n_tokens{};
  DeviceBuffer<int64_t> pos{}, pos0s{};
  // V4.1 publications of this step: the latest index source's selection [n, index_topk] (−1 padded)
  // and the candidate source's per-entry mask [n, cand_stride].
  DeviceBuffer<int32_t> topk{};
  DeviceBuffer<uint8_t> candidates{};
  int64_t cand_stride = 0;
  bool has_candidates = false;
};

// y[n_tokens, l.n_out] = x̂·Wᵀ with the reference's numerics (model/linear.cpp).
Status linear(GpuStep& s, const DeviceLinear& l, const float* x, int n_tokens, float* y, bool round_out = true);
// Rounds to bf16 when the numerics keep bf16 activations.
Status to_activation(GpuStep& s, float* x, int64_t n);

// out[n, d] = attention sublayer of `layer` on the normed input x[n, d] (gpu_attention.cpp).
Status attention(GpuStep& s, int layer, const float* x, float* out);
// out[n, d] = MoE sublayer (gpu_moe.cpp).
Status moe(GpuStep& s, int layer, const float* x, float* out);
// V4.1 Engram on the residual streams [n, hc, d], in place (gpu_moe.cpp).
Status engram(GpuStep& s, int layer, float* streams);

}  // namespace spw::engine
