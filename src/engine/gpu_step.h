// Internal to the engine: the GPU model's device state (pools, page tables, compressor states,
// workspace) and the context of one forward step, shared by the sublayers. Not a public API.
#pragma once

#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cuda/attn/compressor.h"
#include "cuda/attn/kv_pages.h"
#include "cuda/dense/dense_linear.h"
#include "engine/device_buffer.h"
#include "engine/device_weights.h"
#include "engine/expert_staging.h"
#include "engine/gpu_model.h"
#include "engine/host_experts.h"
#include "engine/moe_dispatch.h"
#include "engine/step_arena.h"
#include "engine/step_graphs.h"
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

// One Engram layer's tables and its gate weights q·k [hc, d] (device). The tables are either mapped pinned host
// memory (table, scale) or the checkpoint's memory maps (disk_table, disk_scale; GpuModelOptions::engram_tables).
struct EngramTables {
  MappedHostBuffer table, scale;
  const uint8_t* disk_table = nullptr;  // [rows, head_dim] e4m3, host addresses
  const uint8_t* disk_scale = nullptr;  // [rows, head_dim/32] ue8m0
  DeviceBuffer<float> qk;
};

struct GpuState {
  std::unique_ptr<DeviceWeights> w;
  std::unique_ptr<HostExperts> host_experts;  // null when no routed expert is on the CPU
  ExpertStaging expert_staging;               // HostGpu EXL3 experts of decode steps (empty when none)
  std::vector<DeviceBuffer<uint8_t>> on_host_gpu;  // [layer]: [n_experts] 1 for HostGpu experts; null when none
  DeviceBuffer<unsigned long long> routing_counts;  // [layers][experts] while recording routing (else empty)
  int64_t routing_tokens = 0;                       // rows routed while recording
  KvPool ring, comp, keys;
  std::vector<CompressorBuffers> comp_state, idx_comp_state;  // per layer
  DeviceBuffer<float> rope_main, rope_compress;                // [d_rope/2] frequencies
  std::vector<ref::EngramHashParams> engram_params;
  std::vector<EngramTables> engram_tables;  // per Engram layer, as engram_params
  std::vector<ExpertTable> expert_tables;   // per layer (device MoE dispatch; empty when not uniform dense)
  std::vector<Exl3MoeTable> exl3_moe;       // per layer (fused EXL3 decode; empty when not EXL3)
  Exl3CudaMoeWorkspace exl3_moe_ws;         // pairs of a ≤ 16-row step
  LinearWorkspace ws;
  Exl3CudaWorkspace exl3_ws;  // EXL3 experts (max(d, F) wide)
  DeviceBuffer<char> sample_ws;  // token sampling of kSampleRows decode rows (memory_plan.h)
  DeviceBuffer<char> pick_ws;    // the draws' edits of a decode call (token_picks.h)
  std::vector<bool> slot_used;
  RollbackLayout rollback;               // max_tokens 0: no rollback logs (KvBudget::max_rollback_tokens)
  DeviceBuffer<float> rollback_area;     // [slots][rollback.slot_floats]
  cudaStream_t stream = nullptr;  // non-blocking; every kernel and copy of the model runs on it
  DeviceArena arena;              // step temporaries (memory_plan.h: step_arena_nbytes)
  PinnedStaging staging;          // host side of the step's copies
  bool cuda_graphs = true;        // decode steps through StepGraphs (GpuModelOptions::cuda_graphs)
  StepGraphs graphs;              // their executable graphs, per (rows, segment)
};

// One sequence's part of a step: its tokens are rows row0 .. row0 + n − 1 of the step, at
// positions p .. p + n − 1.
struct StepChunk {
  GpuSequence* seq = nullptr;
  std::span<const int32_t> tokens;
  int64_t p = 0;
  int row0 = 0, n = 0;
  ImagePositions images{};  // which of the tokens are image positions (empty: text only)
};

// Rows first .. first + n − 1 of a step, all image positions; their embeddings start at row `source` of
// the step's image rows.
struct ImageRun {
  int first = 0, n = 0, source = 0;
};

// What a step's attention needs per compress ratio r of the model, planned once per step (so that a
// layer uploads nothing): the entries that complete — chunk b's ids p_b/r .. (p_b + n_b)/r − 1 at
// rows out_row0[b] .. of the compressor's output — and the indexer's per-row entry counts and
// visibility. Device arrays live for the whole step.
struct RatioPlan {
  int r = 0, count = 0, max_per_chunk = 0;
  std::vector<int32_t> per_chunk{};      // [n_chunks] entries completing in the step
  std::vector<int64_t> chunk_entries{};  // [n_chunks] (p_b + n_b)/r
  int64_t max_entries = 0;               // max of chunk_entries
  DeviceSpan<int32_t> out_row0{}, slots{};     // [n_chunks]; [count] the entry's sequence slot
  DeviceSpan<int64_t> ids{}, rope_pos{};       // [count] entry id, RoPE position id·r
  DeviceSpan<int64_t> n_entries{}, visible{};  // [n] per row: its chunk's entries; (pos + 1)/r
};

// One step: a chunk of one sequence (forward) or one token of each of several sequences (decode).
// Every per-token quantity is indexed by the step's row; kernels see per-token slots and positions.
struct GpuStep {
  const ModelConfig& c;
  const DeviceWeights& w;
  const ModelWeights& host_w;
  const Numerics& num;
  GpuState& st;
  std::vector<StepChunk> chunks;
  LinearPath path = LinearPath::kAuto;
  cudaStream_t stream = nullptr;
  MoeDispatch moe_dispatch = MoeDispatch::kAuto;
  MoePaths moe_paths{};
  // Row-invariant steps (GpuModel::ChunkPath::kRowInvariant, batch-invariant decode): the row class of every item of
  // the grouped EXL3 launches under host dispatch (exl3_group_plan's fixed_class; −1: by the item's rows), and
  // attention that never takes the split path (tensor cores where the layer allows, else one block per query).
  int exl3_item_class = -1;
  bool attn_no_split = false;
  int n = 0;                        // rows (tokens) of the step
  std::vector<int32_t> tokens{};    // [n]
  std::vector<int32_t> row_chunk{}; // [n] chunk of each row
  std::vector<int64_t> row_pos{};   // [n] position of each row
  int64_t max_end = 0;              // max over chunks of p + n
  // Image positions of the step (V4.1): maximal runs of rows, and their embeddings [rows of runs, d] in run
  // order, already rounded to the activation type.
  std::vector<ImageRun> image_runs{};
  std::vector<float> image_rows{};
  bool is_image_row(int row) const {
    for (const ImageRun& r : image_runs)
      if (row >= r.first && row < r.first + r.n) return true;
    return false;
  }
  // Device arrays, per row: token ids, slot, position, its chunk's first position and first row;
  // per chunk: slot, first position, token count, first row (compressor_push's items).
  DeviceSpan<int32_t> tokens_d{}, slots{}, row0s{}, chunk_slot{}, chunk_n{}, chunk_row0{};
  DeviceSpan<int64_t> pos{}, pos0s{}, chunk_pos0{};
  // V4.1 publications of this step: the latest index source's selection [n, index_topk] (−1 padded)
  // and the candidate source's per-entry mask [n, cand_stride] (cand_stride = max_end).
  DeviceSpan<int32_t> topk{};
  DeviceSpan<uint8_t> candidates{};
  int64_t cand_stride = 0;
  bool has_candidates = false;
  std::vector<RatioPlan> ratios{};  // one per compress ratio of the model (plan_attention)
  DeviceSpan<int64_t> ring_rows{};  // [n] pos mod window; empty when a chunk is longer than the window

  const RatioPlan& ratio(int r) const {
    for (const RatioPlan& rp : ratios)
      if (rp.r == r) return rp;
    SPW_CHECK(false);
    return ratios.front();
  }

  // The caller's options, for dump() (ForwardOptions::on_intermediate); null in batched decode.
  const ForwardOptions* options = nullptr;
  // Set when the step is recorded into CUDA graphs (decode steps that qualify: step_graphs.h).
  StepGraphs* graphs = nullptr;

  // Starts graph segment k of the step (the previous one is launched); nothing without graphs.
  Status segment(int k) { return graphs ? graphs->begin_segment(stream, n, k) : Status{}; }

  int n_chunks() const { return int(chunks.size()); }
  template <class T>
  Status alloc(DeviceSpan<T>& out, size_t count) {
    return st.arena.alloc(out, count);
  }
  // Allocates and queues the upload of v (async, through the pinned staging buffer).
  template <class T>
  Status upload(const std::vector<T>& v, DeviceSpan<T>& out) {
    SPW_TRY(alloc(out, v.size()));
    return st.staging.upload_bytes(out.get(), v.data(), v.size() * sizeof(T), stream);
  }
  // Reports a named intermediate (device values) to ForwardOptions::on_intermediate, then lets
  // replace_intermediate overwrite a float one: host round trips, for tests that compare each step with the
  // CPU reference's (model/model.h lists the names).
  template <class T>
  Status dump(const char* name, int layer, T* src, size_t count) {
    if (!options || (!options->on_intermediate && !options->replace_intermediate)) return {};
    std::vector<std::remove_const_t<T>> host;
    SPW_TRY(download(static_cast<const T*>(src), count, host));
    std::vector<float> values(host.begin(), host.end());
    if (options->on_intermediate) options->on_intermediate(name, layer, values.data(), values.size());
    if constexpr (std::is_same_v<T, float>) {
      if (options->replace_intermediate && std::string_view(name) != "moe.weights") {
        options->replace_intermediate(name, layer, values);
        if (values.size() != count) return make_error("replace_intermediate changed the size of ", name);
        SPW_TRY(st.staging.upload_bytes(src, values.data(), count * sizeof(float), stream));
      }
    }
    return {};
  }
  // Copies n device values to the host and waits for them (a host round trip).
  template <class T>
  Status download(const T* src, size_t count, std::vector<T>& dst) {
    dst.resize(count);
    return st.staging.download_bytes(dst.data(), src, count * sizeof(T), stream);
  }
};

// y[n_tokens, l.n_out] = x̂·Wᵀ with the reference's numerics (model/linear.cpp).
Status linear(GpuStep& s, const DeviceLinear& l, const float* x, int n_tokens, float* y, bool round_out = true);
// Rounds to bf16 when the numerics keep bf16 activations.
Status to_activation(GpuStep& s, float* x, int64_t n);

// Whether every layer's MoE of the step dispatches on the device (no host round trip: gpu_moe.cpp).
bool moe_on_device(const GpuStep& s);

// Plans and uploads s.ratios and s.ring_rows from the chunks (gpu_attention.cpp; step scope).
// The rollback log (GpuModel::truncate, src/engine/gpu_rollback.cpp): rollback_begin starts a sequence's
// log for a chunk of `tokens` when it keeps one, else drops it; before the step writes them,
// rollback_save_ring logs the ring rows of `layer` that kept chunks replace, and rollback_save_compressor
// the rows of a compressor's state that they touch and the rows they push (kv, score [step rows, width]).
void rollback_begin(GpuSequence& seq, std::span<const int32_t> tokens);
Status rollback_save_ring(GpuStep& s, int layer);
Status rollback_save_compressor(GpuStep& s, int layer, const CompressorBuffers& cb, const float* kv,
                                const float* score);

Status plan_attention(GpuStep& s);
// out[n, d] = attention sublayer of `layer` on the normed input x[n, d] (gpu_attention.cpp).
Status attention(GpuStep& s, int layer, const float* x, float* out);
// out[n, d] = MoE sublayer (gpu_moe.cpp).
Status moe(GpuStep& s, int layer, const float* x, float* out);
// V4.1 Engram on the residual streams [n, hc, d], in place (gpu_moe.cpp).
Status engram(GpuStep& s, int layer, float* streams);

// Image positions (gpu_images.cpp). plan_image_rows fills s.image_runs and s.image_rows from the chunks;
// embed_image_rows writes those rows over the embeddings in streams [n, hc, d]; route_image_rows re-selects
// the image rows' experts with the layer's bias_vl (experts, weights [n, top_k] from router logits [n, E]);
// mute_engram_values zeroes the Engram value of image rows in kv [n, (hc + 1)·d], so their gate adds nothing.
void plan_image_rows(GpuStep& s);
Status embed_image_rows(GpuStep& s, float* streams);
Status route_image_rows(GpuStep& s, int layer, const float* logits, float route_eps, int32_t* experts, float* weights);
Status mute_engram_values(GpuStep& s, float* kv);

}  // namespace spw::engine
