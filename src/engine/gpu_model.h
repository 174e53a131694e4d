// The DeepSeek-V4 / V4.1 text forward on one GPU: the same computation as the CPU
// reference Model (model/model.h), built from the kernel libraries spw_cuda_ops, spw_cuda_dense and
// spw_cuda_attn, with the weights in their compact checkpoint formats (device_weights.h) and the KV
// state in compact paged pools shared by all sequences (cuda/attn/kv_pages.h), sized by the memory
// planner (memory_plan.h). Prefill of any chunk length and decode share one code path, as on the CPU;
// the layer code (gpu_model.cpp, gpu_attention.cpp, gpu_moe.cpp) reads like src/model/*.cpp.
//
// Numerics: any Numerics the CPU model takes. With fake quant the compact KV pools store exactly the
// reference's fake-quantized rows; without it (Numerics::exact(), what Transformers computes in
// float32) the pools hold f32 rows and, without bf16 activations, every linear is an f32 product
// (routed EXL3 experts, multiplied in fp16, are then rejected at load). Results differ from the CPU only by
// f32 summation order in the linears, the attention dots and the mHC mixes, and expf vs exp; with bf16
// activations such an ulp can flip a bf16 rounding and grow through the layers (tests/golden says
// how far on these random-weight models), which is what tests/gpu/test_engine_golden.cpp bounds.
//
// Execution: one non-blocking CUDA stream per model; step temporaries come from a device arena sized
// by the memory planner (no cudaMalloc / cudaFree in a step); host <-> device copies go through a
// pinned staging buffer, async on the stream (step_arena.h). A step is a chunk of one sequence
// (forward) or one token of each of B sequences (decode): every kernel takes per-row slots and
// positions, so batching does not change a sequence's numbers (tests/gpu/test_engine_batch.cpp).
// Decode-sized steps (≤ 16 rows) dispatch the MoE on the device (engine/moe_dispatch.h: grouped
// GEMVs for dense experts, the fused cuda/exl3_moe.h kernel for EXL3 experts); Engram gathers its
// rows from mapped host memory on the device; the V4 indexer's Hadamard and head weights run on the
// device.
//
// What is still slow, and why:
//  - host round trips left: a prefill chunk (> 16 rows) downloads the router's choices for the
//    per-expert token lists (GEMMs that read each expert once); decode() waits for its next tokens;
//    test hooks (before_layer / on_layer) copy the streams;
//  - host work per step: the compressors' emission counts, the entry ids, the indexer's entry
//    counts and the ring rows are planned on the host from the positions once per step (a few
//    small async copies, gpu_step.h RatioPlan), the V4.1 key layer per sequence per index layer, and
//    the Engram hashes; the launch sizes depend on the counts, so decode's CUDA graphs are recorded
//    again every step and updated in place (step_graphs.h) rather than replayed unchanged (which needs
//    the emission and entry counts predicated on device-side positions, and the indexer's key-layer
//    choice per row inside the scoring kernel);
//  - the device MoE dispatch for dense (MXFP4) experts is a grouped GEMV over (token, slot) pairs: an
//    expert is read once per pair, not once per step for all tokens that chose it (V4 at batch 16 is
//    slower per token than batch 64's host dispatch, bench/results/engine_h200.md);
//  - Engram hashing stays on the host (a few integer ops per token).
// Tests: tests/gpu/test_engine_golden.cpp, test_engine_plan.cpp, test_engine_batch.cpp.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "cuda/dense/dense_linear.h"
#include "cuda/ops/sampling.h"
#include "engine/memory_plan.h"
#include "engine/moe_dispatch.h"
#include "engine/step_graphs.h"
#include "engine/token_picks.h"
#include "model/expert_tier.h"
#include "model/model.h"

namespace spw::engine {

struct GpuState;
struct GpuStep;
class GpuModel;
template <class T>
struct DeviceSpan;

enum class MoeDispatch { kAuto, kHost, kDevice };

struct GpuModelOptions {
  KvBudget budget;
  // kAuto: the dense library's choice per call (weight-streaming GEMV up to 16 tokens, else GEMM).
  // kGemv forces the GEMV for every linear (past 16 tokens in slices of 16, 64 on tensor cores, each reading the weight again), and the sparse
  // attention's scalar paths at every row count: the same summation order for every chunking, which the chunked-prefill
  // test uses to expect identical results.
  LinearPath linear_path = LinearPath::kAuto;
  // The linears of decode steps when linear_path is kAuto: kGemv keeps every row's sums independent of the
  // batch at any size (GpuRunner's batch invariance; the attention then keeps its scalar paths too), kAuto takes
  // GEMMs past 16 rows (and tensor-core attention past 512 query-head pairs).
  LinearPath decode_linear_path = LinearPath::kAuto;
  // Routed experts: kAuto runs steps of ≤ 16 rows with the dispatch on the device (grouped GEMVs over
  // the (token, slot) pairs, engine/moe_dispatch.h) and longer ones per expert with the token lists on
  // the host (GEMMs that read each expert once); kHost / kDevice force one (tests compare them).
  MoeDispatch moe_dispatch = MoeDispatch::kAuto;
  // The EXL3 and dense expert paths (moe_dispatch.h); moe_paths_from(settings().gpu) gives the environment's.
  MoePaths moe_paths;
  // Decode steps whose MoE dispatches on the device (≤ 16 sequences) run from CUDA graphs, recorded per
  // step and updated in place (engine/step_graphs.h); false launches every kernel directly.
  bool cuda_graphs = true;
  // copy_sequence shares the source's full pages of compressed entries and index keys (rows no sequence
  // writes again: entries are appended, never rewritten) instead of copying them; the window ring, the
  // last partly filled page and the compressor states are still copied.
  bool share_kv_pages = false;
  // Where each routed expert lives (model/expert_tier.h, a `spillway plan` placement): HBM, mapped pinned host
  // memory read by the GPU's kernels, or host memory computed by the CPU worker (engine/host_experts.h).
  // Empty: every expert in HBM.
  ExpertTiers expert_tiers;
  // Where V4.1's Engram tables live: kPinned copies them into mapped pinned host memory (the GPU gathers a step's
  // rows over PCIe), kDisk leaves them in the checkpoint's memory maps (the host gathers a step's rows, a few KB
  // per token, and uploads them: the tables may be larger than RAM; the page cache keeps the hot rows), kAuto
  // pins them when they take at most half of the host's available memory, else kDisk.
  EngramTablePlace engram_tables = EngramTablePlace::kAuto;
  // HostGpu EXL3 experts of decode steps are copied into HBM slots before the MoE kernels read them
  // (engine/expert_staging.h); false: the kernels read them over PCIe where they are (the same bits).
  bool stage_host_experts = true;
  // Threads of the CPU worker's pool when some experts are on the CPU (0: the machine's hardware threads).
  int host_expert_threads = 0;
  // The CPU worker multiplies in approximate int16 activations (MUL1 experts on AVX-512 VNNI machines; ~2e-4
  // relative error, cpu/exl3_gemm.h) instead of exact fp32.
  bool host_expert_int16 = false;
  // Called as the checkpoint's layers are read (LoadOptions::on_progress), for a progress display.
  std::function<void(int done, int total)> on_progress;
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
  // Set before a forward that GpuModel::truncate may take back; any other forward drops the log. The
  // log's device part lives in the slot's rollback area, its host part here.
  bool keep_rollback = false;
  HostRollback rollback;
};

class GpuModel {
 public:
  ~GpuModel();

  const ModelConfig& config() const { return config_; }
  const MemoryPlan& plan() const { return plan_; }
  // The KV budget the pools were sized for (GpuModelOptions::budget).
  const KvBudget& budget() const { return options_.budget; }
  size_t weight_nbytes() const;
  // Where the routed experts are (GpuModelOptions::expert_tiers): per tier the experts and the bytes they hold
  // (Gpu: device memory of routed experts only; HostGpu and HostCpu: pinned host memory), the host memory pinned
  // for both, and the CPU worker's requests served and busy seconds (0 without experts on the CPU).
  struct ExpertPlacement {
    int64_t n_experts[kNumExpertTiers] = {};
    size_t nbytes[kNumExpertTiers] = {};
    size_t host_mapped_pinned_nbytes = 0, mailbox_nbytes = 0;
    uint64_t cpu_requests = 0;
    double cpu_busy_seconds = 0;
  };
  ExpertPlacement expert_placement() const;
  // Whether the Engram tables were left on disk (GpuModelOptions::engram_tables; false without Engram layers).
  bool engram_tables_on_disk() const;
  // Routing statistics (ModelRunner::set_routing_record): a device histogram per layer, added to by every step's
  // router (graph-capturable; no host round trip). routing_counts() synchronizes the model's stream.
  Status set_routing_record(bool on);
  Result<RoutingCounts> routing_counts() const;
  // The most step-arena bytes any step has used so far, and the arena's size (plan().step_arena_nbytes).
  size_t step_arena_high_water() const;
  size_t step_arena_capacity() const;

  // Pages of the three KV pools (window rings, compressed entries, index keys) in use and in all.
  struct KvPageCounts {
    int64_t used = 0, total = 0;
  };
  KvPageCounts kv_pages() const;
  // A sequence grown to n_total positions (seq == nullptr: a new one, which also takes a slot and its
  // window rings; with copy_of, one copy_sequence makes from it, which with share_kv_pages takes none of the
  // full pages it shares).
  struct Growth {
    const GpuSequence* seq = nullptr;
    int64_t n_total = 0;
    const GpuSequence* copy_of = nullptr;
  };
  // The slots and the pages of each pool that all of these growths at once would take, exactly as forward(),
  // new_sequence() and copy_sequence() reserve them.
  struct KvNeed {
    int64_t slots = 0, ring = 0, comp = 0, keys = 0;
  };
  KvNeed kv_need(std::span<const Growth> growth) const;
  // Whether the free slots and pages cover kv_need(growth).
  bool can_hold(std::span<const Growth> growth) const;

  // The most sequences one decode() step may take with every row computed from that row's inputs alone (the
  // linears on the GEMV, routed experts dispatched on the device), so that a sequence's logits do not depend on
  // the others: 16 unless decode steps force the GEMV, then dense-table experts allow MoePaths::dense_device_rows
  // and EXL3 experts MoePaths::exl3_device_rows (past it their dispatch goes through the host), capped at the
  // budget's max_seqs.
  int invariant_decode_rows() const;

  // Sets GpuModelOptions::decode_linear_path after loading.
  void set_decode_linear_path(LinearPath path) { options_.decode_linear_path = path; }

  // Turns CUDA graphs for decode steps on or off (GpuModelOptions::cuda_graphs), e.g. to compare.
  void set_cuda_graphs(bool on);
  // Counts of the graph segments launched so far (zeros without graphs).
  StepGraphStats graph_stats() const;

  // A new empty sequence. Errors: every slot of the budget in use, or the pools exhausted.
  Result<GpuSequence> new_sequence();
  // Returns the sequence's slot and pages (also done by its destructor).
  void free_sequence(GpuSequence& seq);
  // A new sequence holding a copy of src's state (its pages' rows, compressor partial groups and host
  // bookkeeping), queued on the model's stream: forward() on either gives what it would give on src.
  // With share_kv_pages the full pages of compressed entries and index keys are shared (reference
  // counted in the pools), not copied. Errors: a foreign or freed src, no free slot, the pools exhausted
  // (nothing is taken then).
  Result<GpuSequence> copy_sequence(const GpuSequence& src);
  // Takes back the positions [n_past, seq.n_past) of the sequence's last forward, which ran with
  // GpuSequence::keep_rollback (n_past ≥ where it started): as model/model.h's Model::truncate, from the
  // ring rows and compressor rows that forward logged (queued on the model's stream). Errors: no such
  // forward, a position outside it, a model loaded without KvBudget::max_rollback_tokens.
  Status truncate(GpuSequence& seq, int64_t n_past);
  // The most tokens a forward kept for rollback may take (KvBudget::max_rollback_tokens).
  int max_rollback_tokens() const { return options_.budget.max_rollback_tokens; }

  // Device bytes a sequence holds: its KV pages and its slot's compressor states.
  size_t sequence_nbytes(const GpuSequence& seq) const;

  // Appends `tokens` to `seq` and returns logits [n, vocab] on the host (n = tokens.size() with
  // options.all_logits, else 1). options.before_layer / on_layer see the residual streams
  // [n, hc, d] on the host (a copy each way: for tests); on_intermediate gets the names
  // of model/model.h (each a host round trip).
  // Errors: token ids outside the vocabulary, a chunk longer than the budget's max_step_tokens or a
  // context beyond max_context, a foreign sequence, CUDA failures.
  // `images` marks image positions among the tokens (model/image_positions.h; V4.1), as in Model::forward.
  Result<std::vector<float>> forward(GpuSequence& seq, std::span<const int32_t> tokens,
                                     const ForwardOptions& options = {}, const ImagePositions& images = {});

  // One sequence's part of a multi-sequence step (forward_chunks).
  struct ChunkInput {
    GpuSequence* seq = nullptr;
    std::span<const int32_t> tokens;  // appended to seq; at least one
    bool all_logits = false;          // logits of every new position, else of the last
    ImagePositions images{};          // image positions among the tokens (forward())
  };
  // How forward_chunks computes the step's rows.
  enum class ChunkPath {
    // forward()'s paths for the step's row count: the linears' path (GEMV up to 16 rows, else GEMM) and the MoE
    // dispatch follow it, so a row's result can depend on the other chunks.
    kAuto,
    // decode()'s linear path (GpuModelOptions::decode_linear_path): with the GEMV forced, chunks that each satisfy
    // chunk_computes_as_decode, of at most invariant_decode_rows() rows in all, give every row the bits forward() of
    // its chunk alone gives (verified drafts, short prompt pieces).
    kAsDecode,
    // Every row from its own inputs, on paths fixed for prefill whatever the step holds: linears on the GEMV (tensor
    // cores, the weight read once per 64 rows), attention on tensor cores where the layer allows (else one block per
    // query, never split), routed experts host-dispatched with EXL3 items of ≤ 64 rows of one class
    // (MoePaths::exl3_fixed_classes). A chunk's rows then have the same bits in any step of this path, alone or
    // among others (GpuRunner's batch-invariant prompt pieces shorter than kRowInvariantPieceTokens, several per
    // step).
    kRowInvariant,
  };
  // Appends every chunk's tokens to its sequence in one step: the rows of all chunks go through each
  // linear, the MoE and the head together, and each row attends only to its own sequence (per-row
  // slots and positions, as in decode). Returns per chunk its logits on the host: [vocab], or
  // [n, vocab] with all_logits. What it saves over one forward() per chunk: the weights are read once
  // for all chunks and the launches are shared. A row's numbers are forward()'s up to f32 summation
  // order; `path` says when they are exactly another step's (above).
  // Errors: forward()'s, checked for every chunk before any sequence advances.
  Result<std::vector<std::vector<float>>> forward_chunks(std::span<const ChunkInput> chunks,
                                                         ChunkPath path = ChunkPath::kAuto);
  // Whether forward() of a chunk of n_tokens alone computes each row as a GEMV-forced step of any row count
  // does: its linears on the GEMV, its attention on the split path (n_tokens·heads within its limit, where a
  // GEMV-forced step's one-block path gives the same bits) and its MoE on the device dispatch.
  bool chunk_computes_as_decode(int n_tokens) const;
  // Prompt pieces shorter than this take kRowInvariant under batch invariance, longer ones forward() alone: the
  // row-invariant path reads the dense weights once per 64 rows where forward()'s GEMMs read them once, which pays
  // for short prompts that share a step and not for long ones (a cold 8K-token prompt on an H100 in 256-token
  // pieces: 2.44 s on the row-invariant path, 1.10 s one forward() per piece; bench/results/serve_h200.md).
  static constexpr int kRowInvariantPieceTokens = 128;

  // A token drawn on the device (engine/token_picks.h): cuda::sample's parameters, the uniform u ∈ [0, 1)
  // for the row, and the sampler's edits around the draw (mask, penalties and biases, logprobs).
  using TokenDraw = engine::TokenDraw;
  // One decode step for B sequences with one new token each (tokens[i] for seqs[i]); returns the
  // next token of each in next[B]: the greedy one (argmax on the GPU), or with draws (none, or one
  // per sequence) the one the draw's pipeline gives (TokenPick in model/model_runner.h: edits by
  // cuda/ops/pick_logits.h, then argmax or cuda::sample, the server sampler's pipeline given its
  // uniform). With draws that ask for logprobs, `row_logprobs` (required then) gets one entry per
  // sequence. Copies logits [B, vocab] to the host only when `logits` is non-null (after the draws'
  // edits, if any).
  // Per sequence the result is what forward(seq, {token}) computes: every kernel of the step works
  // per row (the sequence's slot and position), and linears on ≤ 16 rows take the GEMV, whose row
  // results do not depend on the other rows. Errors: B = 0 or above the budget's max_seqs, a
  // sequence twice, mismatched spans, draws beyond the pick workspace (fits_pick_workspace), and
  // forward()'s errors.
  Status decode(std::span<GpuSequence* const> seqs, std::span<const int32_t> tokens, std::span<int32_t> next,
                std::vector<float>* logits = nullptr, std::span<const TokenDraw> draws = {},
                std::vector<cuda::RowLogprobs>* row_logprobs = nullptr);

 private:
  // Pages of compressed entries (and as many of index keys) of `layer` that a copy of a sequence of n_past
  // positions shares with it instead of copying: 0 without share_kv_pages.
  int64_t shared_pages(int64_t n_past, int layer) const;
  friend Result<std::unique_ptr<GpuModel>> load_gpu_model(ModelConfig, Checkpoint, const Numerics&,
                                                          const GpuModelOptions&);
  GpuModel() = default;
  Status reserve_pages(GpuSequence& seq, int64_t n_total);
  Status begin_step(GpuStep& s);
  // Rows first .. first + n − 1 of a step whose logits run_step computes.
  struct RowRange {
    int first = 0, n = 0;
  };
  Status run_step(GpuStep& s, const ForwardOptions& options, std::span<const RowRange> out_rows,
                  DeviceSpan<float>& logits);
  void end_step(GpuStep& s);

  ModelConfig config_;
  Numerics numerics_;
  GpuModelOptions options_;
  MemoryPlan plan_;
  std::unique_ptr<ModelWeights> host_weights_;  // after load, only the Engram token map (host hashing), and the
                                                // checkpoint's maps when the Engram tables stay on disk
  bool engram_on_disk_ = false;
  std::unique_ptr<GpuState> state_;
};

// Reads config and weights (model/weights.h), uploads them and allocates the pools of the budget.
Result<std::unique_ptr<GpuModel>> load_gpu_model(const std::string& model_dir, const Numerics& numerics,
                                                 const GpuModelOptions& options = {});
// The same for a config and checkpoint already at hand (a synthetic model built in memory: model/synthetic_model.h).
Result<std::unique_ptr<GpuModel>> load_gpu_model(ModelConfig config, Checkpoint checkpoint, const Numerics& numerics,
                                                 const GpuModelOptions& options = {});

}  // namespace spw::engine
