// The DeepSeek-V4 / V4.1 text forward on one GPU (issue 7): the same computation as the CPU
// reference Model (model/model.h), built from the kernel libraries spw_cuda_ops, spw_cuda_dense and
// spw_cuda_attn, with the weights in their compact checkpoint formats (device_weights.h) and the KV
// state in compact paged pools shared by all sequences (cuda/attn/kv_pages.h), sized by the memory
// planner (memory_plan.h). Prefill of any chunk length and decode share one code path, as on the CPU;
// the layer code (gpu_model.cpp, gpu_attention.cpp, gpu_moe.cpp) reads like src/model/*.cpp.
//
// Numerics: the reference's (Numerics::reference(); stale_index_k may be switched off). The compact
// KV pools store exactly the reference's fake-quantized rows, so a mode without fake quant or bf16
// activations cannot be represented and is rejected at load. Results differ from the CPU only by
// f32 summation order in the linears, the attention dots and the mHC mixes, and expf vs exp; with bf16
// activations such an ulp can flip a bf16 rounding and grow through the layers (tests/golden says
// how far on these random-weight models), which is what tests/gpu/test_engine_golden.cpp bounds.
//
// What is slow in this first version, and why (correctness first):
//  - everything runs on the legacy default stream with synchronous host copies in between;
//  - step temporaries are cudaMalloc'ed and freed per op (cudaFree synchronises the device);
//  - MoE: the router's choices go to the host, which then runs one gather + three linear calls +
//    one scatter-add per routed expert — MXFP4 through the dense library, EXL3 (packs from
//    `spillway quantize`) through cuda/exl3_gemm.h — (the fused EXL3 decode kernel, cuda/exl3_moe.h,
//    is not wired in yet; no batching across sequences);
//  - host round trips: the V4 indexer's Hadamard transform, the V4 head's mHC pre weights, the
//    Engram row gather (tables in host memory) and its gate, the per-expert token lists;
//  - one sequence per forward call (no batched decode, no CUDA graphs).
// Tests: tests/gpu/test_engine_golden.cpp, tests/gpu/test_engine_plan.cpp.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cuda/dense/dense_linear.h"
#include "engine/memory_plan.h"
#include "model/model.h"

namespace spw::engine {

struct GpuState;
class GpuModel;

struct GpuModelOptions {
  KvBudget budget;
  // kAuto: the dense library's choice per call (weight-streaming GEMV up to 16 tokens, else GEMM).
  // kGemv forces the GEMV for every linear (then no call may exceed 16 tokens): the same summation
  // order for every chunking, which the chunked-prefill test uses to expect identical results.
  LinearPath linear_path = LinearPath::kAuto;
};

// One sequence's state on the GPU: a slot in the model's page tables and compressor states, the
// pages it holds in each pool, and the small host-side bookkeeping the CPU model keeps in
// SequenceState. Returned to the pools when destroyed (or by GpuModel::free_sequence).
struct GpuSequence {
  GpuSequence() = default;
  GpuSequence(const GpuSequence&) = delete;
  GpuSequence& operator=(const GpuSequence&) = delete;
  GpuSequence(GpuSequence&& o) noexcept;
  GpuSequence& operator=(GpuSequence&& o) noexcept;
  ~GpuSequence();

  GpuModel* owner = nullptr;
  int slot = -1;
  int64_t n_past = 0;
  std::vector<int64_t> engram_recent;  // compressed ids of the last max_ngram−1 tokens, newest last
  int published_index_k_layer = -1;    // V4.1 (Numerics::stale_index_k)
  // Page ids per layer in the window-ring, compressed-entry and index-key pools.
  std::vector<std::vector<int32_t>> ring_pages, comp_pages, key_pages;
};

class GpuModel {
 public:
  ~GpuModel();

  const ModelConfig& config() const { return config_; }
  const MemoryPlan& plan() const { return plan_; }
  size_t weight_nbytes() const;

  // A new empty sequence. Errors: every slot of the budget in use, or the pools exhausted.
  Result<GpuSequence> new_sequence();
  // Returns the sequence's slot and pages (also done by its destructor).
  void free_sequence(GpuSequence& seq);

  // Appends `tokens` to `seq` and returns logits [n, vocab] on the host (n = tokens.size() with
  // options.all_logits, else 1). options.before_layer / on_layer see the residual streams
  // [n, hc, d] on the host (a copy each way: for tests); on_intermediate is not supported.
  // Errors: token ids outside the vocabulary, a chunk longer than the budget's max_step_tokens or a
  // context beyond max_context, a foreign sequence, CUDA failures.
  Result<std::vector<float>> forward(GpuSequence& seq, std::span<const int32_t> tokens,
                                     const ForwardOptions& options = {});

 private:
  friend Result<std::unique_ptr<GpuModel>> load_gpu_model(const std::string&, const Numerics&,
                                                          const GpuModelOptions&);
  GpuModel() = default;
  Status reserve_pages(GpuSequence& seq, int64_t n_total);

  ModelConfig config_;
  Numerics numerics_;
  GpuModelOptions options_;
  MemoryPlan plan_;
  std::unique_ptr<ModelWeights> host_weights_;  // Engram tables, token map, V4 head mHC (host steps)
  std::unique_ptr<GpuState> state_;
};

// Reads config and weights (model/weights.h), uploads them and allocates the pools of the budget.
Result<std::unique_ptr<GpuModel>> load_gpu_model(const std::string& model_dir, const Numerics& numerics,
                                                 const GpuModelOptions& options = {});

}  // namespace spw::engine
