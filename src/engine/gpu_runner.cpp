#include "engine/gpu_runner.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "base/log.h"
#include "cuda/kernel_settings.h"
#include "engine/gpu_model.h"

namespace spw::engine {
namespace {

class GpuRunnerSequence final : public RunnerSequence {
 public:
  explicit GpuRunnerSequence(GpuSequence seq) : seq(std::move(seq)) {}
  int64_t n_past() const override { return seq.n_past; }
  // A copy on the device (GpuModel::copy_sequence); nullptr when no slot or pages are free.
  std::unique_ptr<RunnerSequence> clone() const override {
    auto copy = seq.owner->copy_sequence(seq);
    if (!copy.ok()) {
      SPW_LOG_WARN("no device copy of a sequence for the prefix cache: {}", copy.error().message);
      return nullptr;
    }
    return std::make_unique<GpuRunnerSequence>(std::move(copy.value()));
  }
  size_t nbytes() const override { return seq.owner->sequence_nbytes(seq); }
  Status truncate(int64_t n_past) override { return seq.owner->truncate(seq, n_past); }

  GpuSequence seq;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error for later calls
    return 0;
  }
  return n;
}

Result<DeviceMemory> device_memory() {
  DeviceMemory m;
  if (cudaError_t e = cudaMemGetInfo(&m.free, &m.total); e != cudaSuccess)
    return make_error("cudaMemGetInfo: ", cudaGetErrorString(e));
  return m;
}

GpuRunner::GpuRunner(std::unique_ptr<GpuModel> model, bool batch_invariant, int cache_slots)
    : model_(std::move(model)),
      cache_slots_(cache_slots),
      batch_invariant_(batch_invariant),
      max_decode_rows_(batch_invariant_ ? model_->invariant_decode_rows() : model_->budget().max_seqs - cache_slots) {}

Status GpuRunner::set_routing_record(bool on) { return model_->set_routing_record(on); }
Result<RoutingCounts> GpuRunner::routing_counts() const { return model_->routing_counts(); }

RunnerUsage GpuRunner::usage() const {
  RunnerUsage u;
  const auto pages = model_->kv_pages();
  u.kv_blocks_used = pages.used;
  u.kv_blocks_total = pages.total;
  if (auto m = device_memory(); m.ok()) {
    u.device_bytes_total = int64_t(m->total);
    u.device_bytes_used = int64_t(m->total - m->free);
  }
  return u;
}
GpuRunner::~GpuRunner() = default;

const ModelConfig& GpuRunner::config() const { return model_->config(); }
int64_t GpuRunner::max_context() const { return model_->budget().max_context; }
int GpuRunner::max_sequences() const { return model_->budget().max_seqs - cache_slots_; }

int GpuRunner::max_rollback_tokens() const { return model_->max_rollback_tokens(); }

bool GpuRunner::kv_can_hold(std::span<const KvGrowth> growth) const {
  std::vector<GpuModel::Growth> g(growth.size());
  for (size_t i = 0; i < growth.size(); ++i) {
    const auto* s = dynamic_cast<const GpuRunnerSequence*>(growth[i].seq);
    const auto* from = dynamic_cast<const GpuRunnerSequence*>(growth[i].copy_of);
    if ((growth[i].seq && !s) || (growth[i].copy_of && !from)) return false;
    g[i] = {s ? &s->seq : nullptr, growth[i].n_total, from ? &from->seq : nullptr};
  }
  return model_->can_hold(g);
}

Result<std::unique_ptr<RunnerSequence>> GpuRunner::new_sequence() {
  auto seq = model_->new_sequence();
  if (!seq.ok()) return seq.error();
  return std::unique_ptr<RunnerSequence>(std::make_unique<GpuRunnerSequence>(std::move(seq.value())));
}

Result<std::vector<std::vector<float>>> GpuRunner::forward(std::span<const RunnerInput> inputs) {
  const ModelConfig& c = model_->config();
  const KvBudget& budget = model_->budget();
  // Everything is checked before any sequence advances (GpuModel checks again, per call).
  std::vector<GpuSequence*> seqs(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto* s = dynamic_cast<GpuRunnerSequence*>(inputs[i].seq);
    if (!s || s->seq.owner != model_.get()) return make_error("input ", i, ": not a sequence of this GPU runner");
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == &s->seq) return make_error("input ", i, ": the sequence of input ", j, " again");
    seqs[i] = &s->seq;
    const auto& t = inputs[i].tokens;
    if (t.empty()) return make_error("input ", i, ": no tokens");
    if (int64_t(t.size()) > budget.max_step_tokens)
      return make_error("input ", i, ": ", t.size(), " tokens in one step, the budget allows ", budget.max_step_tokens);
    if (s->seq.n_past + int64_t(t.size()) > budget.max_context)
      return make_error("input ", i, ": context ", s->seq.n_past + int64_t(t.size()), " beyond the budget's ",
                        budget.max_context);
    for (int32_t id : t)
      if (id < 0 || id >= c.vocab_size)
        return make_error("input ", i, ": token ", id, " outside the vocabulary [0, ", c.vocab_size, ")");
  }
  std::vector<KvGrowth> growth(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) growth[i] = {inputs[i].seq, seqs[i]->n_past + int64_t(inputs[i].tokens.size())};
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].keep_rollback && int64_t(inputs[i].tokens.size()) > max_rollback_tokens())
      return make_error("input ", i, ": ", inputs[i].tokens.size(), " tokens to keep for rollback, the runner takes back ",
                        max_rollback_tokens());
    seqs[i]->keep_rollback = inputs[i].keep_rollback;
  }
  if (!kv_can_hold(growth))
    return make_error("KV pools exhausted: the step needs more pages than the live sequences leave free");
  std::vector<std::vector<float>> out(inputs.size());
  const size_t vocab = size_t(c.vocab_size);
  // Decodes in two groups: token picks (drawn on the device, no logits copied back) and the rest.
  // A pick's mask and edits travel with it; a pick with more single-logit edits than one call's workspace
  // takes (kPickShiftsPerStep) returns its logits instead, for the host to draw.
  std::vector<size_t> decodes[2];
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].tokens.size() != 1 || inputs[i].all_logits) continue;
    const TokenPick* p = inputs[i].pick;
    const bool pick = p && pick_shifts(*p) <= kPickShiftsPerStep;
    decodes[pick ? 0 : 1].push_back(i);
  }
  for (int group : {0, 1}) {
    const std::vector<size_t>& rows = decodes[group];
    for (size_t first = 0; first < rows.size();) {
      // A call: up to max_decode_rows_ rows, and for picks up to kPickShiftsPerStep shifts in all.
      size_t n = 0;
      for (int64_t shifts = 0; first + n < rows.size() && n < size_t(max_decode_rows_); ++n) {
        if (group == 0 && (shifts += pick_shifts(*inputs[rows[first + n]].pick)) > kPickShiftsPerStep) break;
      }
      std::vector<GpuSequence*> batch;
      std::vector<int32_t> tokens, next(n);
      PickDraws draws;
      for (size_t k = first; k < first + n; ++k) {
        batch.push_back(seqs[rows[k]]);
        tokens.push_back(inputs[rows[k]].tokens[0]);
        if (group == 0) draws.add(*inputs[rows[k]].pick);
      }
      std::vector<float> logits;
      std::vector<cuda::RowLogprobs> row_logprobs;
      SPW_TRY(model_->decode(batch, tokens, next, group == 0 ? nullptr : &logits, draws.draws(), &row_logprobs));
      for (size_t k = 0; k < n; ++k) {
        const size_t i = rows[first + k];
        if (group == 0) {
          TokenPick& p = *inputs[i].pick;
          p.token = next[k];
          if (p.top_logprobs >= 0) {
            const cuda::RowLogprobs& lp = row_logprobs[k];
            p.logprob = lp.chosen;
            p.top.clear();
            for (int j = 0; j < lp.n_top; ++j) p.top.push_back({lp.top_ids[j], lp.top_logprobs[j]});
          }
          continue;
        }
        out[i].assign(logits.begin() + std::ptrdiff_t(k * vocab), logits.begin() + std::ptrdiff_t((k + 1) * vocab));
      }
      first += n;
    }
  }
  std::vector<bool> done(inputs.size(), false);
  for (size_t i : decodes[0]) done[i] = true;
  for (size_t i : decodes[1]) done[i] = true;
  std::vector<size_t> pieces;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!done[i]) pieces.push_back(i);
  // Pieces together in steps of at most max_rows rows, each step one forward_chunks call on `path`.
  auto run_together = [&](const std::vector<size_t>& group, int64_t max_rows, GpuModel::ChunkPath path) -> Status {
    for (size_t first = 0; first < group.size();) {
      std::vector<GpuModel::ChunkInput> chunks;
      int64_t rows = 0;
      size_t last = first;
      for (; last < group.size(); ++last) {
        const RunnerInput& in = inputs[group[last]];
        if (!chunks.empty() && rows + int64_t(in.tokens.size()) > max_rows) break;
        chunks.push_back({seqs[group[last]], in.tokens, in.all_logits, in.images});
        rows += int64_t(in.tokens.size());
      }
      auto r = model_->forward_chunks(chunks, path);
      if (!r.ok()) return make_error("inputs ", group[first], "..", group[last - 1], ": ", r.error().message);
      for (size_t k = first; k < last; ++k) out[group[k]] = std::move(r.value()[k - first]);
      first = last;
    }
    return {};
  };
  if (!batch_invariant_) {
    SPW_TRY(run_together(pieces, step_max_rows(budget), GpuModel::ChunkPath::kAuto));
    return out;
  }
  // Batch-invariant: small pieces (verified drafts, the shortest prompt pieces) together in steps computed as decode
  // steps are, up to max_decode_rows_ rows (GpuModel::chunk_computes_as_decode); other text pieces shorter than
  // GpuModel::kRowInvariantPieceTokens together on the row-invariant prefill path; longer pieces and pieces with
  // image positions each alone (GpuModel::forward). A piece's class follows from its own length, so its rows have
  // the same bits whatever else runs.
  std::vector<size_t> small, prompt;
  for (size_t i : pieces) {
    const int n = int(inputs[i].tokens.size());
    if (!inputs[i].images.empty() || (n >= GpuModel::kRowInvariantPieceTokens && !model_->chunk_computes_as_decode(n))) {
      ForwardOptions options;
      options.all_logits = inputs[i].all_logits;
      auto r = model_->forward(*seqs[i], inputs[i].tokens, options, inputs[i].images);
      if (!r.ok()) return make_error("input ", i, ": ", r.error().message);
      out[i] = std::move(r.value());
    } else {
      (model_->chunk_computes_as_decode(n) ? small : prompt).push_back(i);
    }
  }
  SPW_TRY(run_together(small, max_decode_rows_, GpuModel::ChunkPath::kAsDecode));
  SPW_TRY(run_together(prompt, step_max_rows(budget), GpuModel::ChunkPath::kRowInvariant));
  return out;
}

Status GpuRunner::warm_up() {
  auto seq = model_->new_sequence();
  if (!seq.ok()) return seq.error();
  const int64_t vocab = config().vocab_size;
  const int rows = int(std::min<int64_t>({64, model_->budget().max_step_tokens, (max_context() - 4) / 2}));
  std::vector<int32_t> prompt(size_t(std::max(rows, 1)));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 3) % vocab);
  // A piece on forward()'s GEMMs (long prompt pieces), one on the path forward() gives short ones (see the top),
  // then a one-token piece.
  if (auto r = model_->forward(*seq, prompt); !r.ok()) return r.error();
  const GpuModel::ChunkInput chunk{&*seq, prompt};
  auto r = batch_invariant_ ? model_->forward_chunks(std::span(&chunk, 1), GpuModel::ChunkPath::kRowInvariant)
                            : model_->forward_chunks(std::span(&chunk, 1));
  if (!r.ok()) return r.error();
  const int32_t one[] = {int32_t(11 % vocab)};
  if (auto r1 = model_->forward(*seq, one); !r1.ok()) return r1.error();
  GpuSequence* seqs[] = {&*seq};
  int32_t token[] = {int32_t(13 % vocab)}, next[1];
  for (int step = 0; step < 2; ++step) {
    SPW_TRY(model_->decode(seqs, token, next));
    token[0] = next[0];
  }
  return {};
}

void make_batch_invariant(GpuModelOptions& options) {
  // EXL3 decodes keep one numerics at every row count: each kernel is batch-invariant alone (cuda/exl3_moe.h,
  // cuda/exl3_grouped.h), switching between kernels by row count is not. By default the grouped kernel of one
  // token group: device pairs up to exl3_device_rows, host-dispatched items of class 0 past them (the same bits,
  // each expert decoded once per 8 of its rows: MoePaths::exl3_fixed_classes). SPILLWAY_EXL3_DECODE=fused keeps
  // the fused kernel instead, which then takes a decode of every sequence in one step.
  if (options.moe_paths.exl3_decode == Exl3DecodeKernel::kByRows) options.moe_paths.exl3_decode = Exl3DecodeKernel::kGrouped;
  if (options.moe_paths.exl3_decode == Exl3DecodeKernel::kFused)
    options.moe_paths.exl3_device_rows = std::max(options.moe_paths.exl3_device_rows, options.budget.max_seqs);
  options.moe_paths.exl3_fixed_classes = true;
}

void make_batch_invariant(GpuModel& model) { model.set_decode_linear_path(LinearPath::kGemv); }

Result<std::unique_ptr<GpuRunner>> load_gpu_runner(const std::string& model_dir, const GpuRunnerSettings& settings) {
  if (cuda_device_count() == 0) return make_error("no CUDA device is visible to this process");
  cuda::apply_kernel_settings(settings.gpu, settings.batch_invariant);  // before any weights are uploaded (dense_linear.h: set_gemv_mma)
  GpuModelOptions options;
  options.budget = settings.budget;
  options.budget.max_seqs += settings.prefix_cache_slots;
  options.moe_paths = moe_paths_from(settings.gpu);
  if (settings.batch_invariant) make_batch_invariant(options);
  options.share_kv_pages = settings.gpu.kv_share_pages;
  options.expert_tiers = settings.expert_tiers;
  options.host_expert_threads = settings.host_expert_threads;
  options.host_expert_int16 = settings.host_expert_int16;
  options.engram_tables = settings.engram_tables;
  options.on_progress = settings.on_progress;
  auto model = load_gpu_model(model_dir, settings.numerics, options);
  if (!model.ok()) return model.error();
  if (settings.batch_invariant) make_batch_invariant(**model);
  return std::make_unique<GpuRunner>(std::move(model.value()), settings.batch_invariant, settings.prefix_cache_slots);
}
}  // namespace spw::engine
