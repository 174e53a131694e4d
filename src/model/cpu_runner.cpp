#include "model/cpu_runner.h"

#include <algorithm>

namespace spw {

namespace {

template <class T>
size_t vec_nbytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

int64_t blocks_for(int64_t n_positions) { return (n_positions + kCpuKvBlockTokens - 1) / kCpuKvBlockTokens; }

}  // namespace

CpuSequence::CpuSequence(SequenceState s, const Model* model, std::shared_ptr<CpuKvLedger> ledger)
    : state(std::move(s)), model_(model), ledger_(std::move(ledger)) {
  state.rollback = RollbackLog{};  // a copy cannot take back its source's forward
  account();
}

Status CpuSequence::truncate(int64_t n_past) {
  if (!model_) return make_error("truncate: this sequence was made without its model");
  SPW_TRY(model_->truncate(state, n_past));
  account();
  return {};
}

CpuSequence::~CpuSequence() { ledger_->used_blocks -= blocks_; }

std::unique_ptr<RunnerSequence> CpuSequence::clone() const {
  return std::make_unique<CpuSequence>(state, model_, ledger_);
}

void CpuSequence::account() {
  const int64_t now = blocks_for(state.n_past);
  ledger_->used_blocks += now - blocks_;
  blocks_ = now;
}

size_t CpuSequence::nbytes() const {
  size_t n = sizeof(SequenceState) + vec_nbytes(state.engram_recent);
  for (const LayerState& l : state.layers) {
    n += sizeof(LayerState) + vec_nbytes(l.window) + vec_nbytes(l.compressed) + vec_nbytes(l.index_keys);
    for (const CompressorState* c : {&l.comp, &l.idx_comp})
      n += vec_nbytes(c->kv) + vec_nbytes(c->score) + vec_nbytes(c->prev_kv) + vec_nbytes(c->prev_score);
  }
  return n;
}

CpuRunner::CpuRunner(const Model& model, int64_t kv_tokens)
    : model_(model), ledger_(std::make_shared<CpuKvLedger>()) {
  ledger_->total_blocks = kv_tokens > 0 ? blocks_for(kv_tokens) : 0;
}

RunnerUsage CpuRunner::usage() const {
  RunnerUsage u;
  if (ledger_->total_blocks > 0) {
    u.kv_blocks_used = ledger_->used_blocks;
    u.kv_blocks_total = ledger_->total_blocks;
  }
  return u;
}

bool CpuRunner::kv_can_hold(std::span<const KvGrowth> growth) const {
  if (ledger_->total_blocks == 0) return true;
  int64_t more = 0;
  for (const KvGrowth& g : growth)
    more += std::max<int64_t>(0, blocks_for(g.n_total) - (g.seq ? blocks_for(g.seq->n_past()) : 0));
  return ledger_->used_blocks + more <= ledger_->total_blocks;
}

Result<std::unique_ptr<RunnerSequence>> CpuRunner::new_sequence() {
  return std::unique_ptr<RunnerSequence>(std::make_unique<CpuSequence>(model_.new_sequence(), &model_, ledger_));
}

Result<std::vector<std::vector<float>>> CpuRunner::forward(std::span<const RunnerInput> inputs) {
  std::vector<std::vector<float>> out(inputs.size());
  std::vector<SequenceState*> states[2];
  std::vector<std::span<const int32_t>> tokens[2];
  std::vector<size_t> index[2];
  std::vector<ImagePositions> images[2];
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto* seq = dynamic_cast<CpuSequence*>(inputs[i].seq);
    if (!seq) return make_error("input ", i, ": not a sequence of the CPU runner");
    seq->state.keep_rollback = inputs[i].keep_rollback;
    const int kind = inputs[i].all_logits ? 1 : 0;
    states[kind].push_back(&seq->state);
    tokens[kind].push_back(inputs[i].tokens);
    images[kind].push_back(inputs[i].images);
    index[kind].push_back(i);
  }
  // Validate both groups before either advances, so an error leaves every sequence as it was.
  for (int kind : {0, 1})
    for (size_t j = 0; j < states[kind].size(); ++j)
      if (auto st = model_.validate_input(*states[kind][j], tokens[kind][j], images[kind][j]); !st.ok())
        return make_error("input ", index[kind][j], ": ", st.error().message);
  std::vector<KvGrowth> growth(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i)
    growth[i] = {inputs[i].seq, inputs[i].seq->n_past() + int64_t(inputs[i].tokens.size())};
  if (!kv_can_hold(growth))
    return make_error("KV memory exhausted: the step needs more than the ", ledger_->total_blocks * kCpuKvBlockTokens,
                      " positions of --kv-tokens that live sequences leave free");
  for (int kind : {0, 1}) {
    if (states[kind].empty()) continue;
    ForwardOptions options;
    options.routing_counts = routing_ ? &*routing_ : nullptr;
    options.all_logits = kind == 1;
    auto r = model_.forward_batch(states[kind], tokens[kind], options, images[kind]);
    if (!r.ok()) {
      for (const RunnerInput& in : inputs) static_cast<CpuSequence*>(in.seq)->account();
      return r.error();
    }
    for (size_t j = 0; j < index[kind].size(); ++j) out[index[kind][j]] = std::move((*r)[j]);
  }
  for (const RunnerInput& in : inputs) static_cast<CpuSequence*>(in.seq)->account();
  // Plain greedy picks are taken here as the GPU runner takes them (the lowest id of the maximum);
  // others keep their logits for the host's draw.
  for (size_t i = 0; i < inputs.size(); ++i) {
    TokenPick* pick = inputs[i].pick;
    if (!pick || pick->temperature > 0.f || pick->repetition_penalty != 1.f || !pick->penalties.empty() || !pick->biases.empty() ||
        !pick->allowed.empty() || pick->top_logprobs >= 0 || out[i].empty())
      continue;
    pick->token = int32_t(std::max_element(out[i].begin(), out[i].end()) - out[i].begin());
    out[i].clear();
  }
  return out;
}

Status CpuRunner::set_routing_record(bool on) {
  if (!on) routing_.reset();
  else if (!routing_) routing_.emplace().reset(model_.config().n_layers, model_.config().n_experts);
  return {};
}

Result<RoutingCounts> CpuRunner::routing_counts() const {
  if (!routing_) return make_error("routing is not being recorded (set_routing_record)");
  return *routing_;
}

}  // namespace spw
