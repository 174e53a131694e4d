#include "model/cpu_runner.h"

namespace spw {

namespace {

template <class T>
size_t vec_nbytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

}  // namespace

size_t CpuSequence::nbytes() const {
  size_t n = sizeof(SequenceState) + vec_nbytes(state.engram_recent);
  for (const LayerState& l : state.layers) {
    n += sizeof(LayerState) + vec_nbytes(l.window) + vec_nbytes(l.compressed) + vec_nbytes(l.index_keys);
    for (const CompressorState* c : {&l.comp, &l.idx_comp})
      n += vec_nbytes(c->kv) + vec_nbytes(c->score) + vec_nbytes(c->prev_kv) + vec_nbytes(c->prev_score);
  }
  return n;
}

Result<std::unique_ptr<RunnerSequence>> CpuRunner::new_sequence() {
  return std::unique_ptr<RunnerSequence>(std::make_unique<CpuSequence>(model_.new_sequence()));
}

Result<std::vector<std::vector<float>>> CpuRunner::forward(std::span<const RunnerInput> inputs) {
  std::vector<std::vector<float>> out(inputs.size());
  std::vector<SequenceState*> states[2];
  std::vector<std::span<const int32_t>> tokens[2];
  std::vector<size_t> index[2];
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto* seq = dynamic_cast<CpuSequence*>(inputs[i].seq);
    if (!seq) return make_error("input ", i, ": not a sequence of the CPU runner");
    const int kind = inputs[i].all_logits ? 1 : 0;
    states[kind].push_back(&seq->state);
    tokens[kind].push_back(inputs[i].tokens);
    index[kind].push_back(i);
  }
  // Validate both groups before either advances, so an error leaves every sequence as it was.
  for (int kind : {0, 1})
    for (size_t j = 0; j < states[kind].size(); ++j)
      if (auto st = model_.validate_input(*states[kind][j], tokens[kind][j]); !st.ok())
        return make_error("input ", index[kind][j], ": ", st.error().message);
  for (int kind : {0, 1}) {
    if (states[kind].empty()) continue;
    ForwardOptions options;
    options.all_logits = kind == 1;
    auto r = model_.forward_batch(states[kind], tokens[kind], options);
    if (!r.ok()) return r.error();
    for (size_t j = 0; j < index[kind].size(); ++j) out[index[kind][j]] = std::move((*r)[j]);
  }
  return out;
}

}  // namespace spw
