#include "model/parallel_model.h"

#include <thread>

#include "comm/loopback.h"

namespace spw {

Result<std::unique_ptr<ParallelModel>> ParallelModel::create(const Model& full, const ParallelPlan& plan) {
  const ModelConfig& c = full.config();
  SPW_TRY(check_parallel_plan(c, plan));
  std::unique_ptr<ParallelModel> pm(new ParallelModel());
  pm->plan_ = plan;
  pm->comms_ = comm::make_loopback_group(plan.n_ranks());
  const ModelConfig rank_config = shard_config(c, plan);
  for (int r = 0; r < plan.n_ranks(); ++r) {
    auto weights = shard_weights(full.weights(), c, plan, r);
    if (!weights.ok()) return weights.error();
    pm->ranks_.push_back(std::make_unique<Model>(rank_config, std::move(weights.value()), full.numerics(),
                                                 shard_role(c, plan, r, pm->comms_[size_t(r)].get())));
  }
  return pm;
}

ParallelModel::~ParallelModel() = default;

ParallelModel::Sequence ParallelModel::new_sequence() const {
  Sequence seq;
  for (const auto& m : ranks_) seq.ranks.push_back(m->new_sequence());
  return seq;
}

Result<std::vector<std::vector<float>>> ParallelModel::forward_every_rank(
    Sequence& seq, std::span<const int32_t> tokens, std::span<const ForwardOptions> rank_options) const {
  const size_t n = ranks_.size();
  if (seq.ranks.size() != n)
    return make_error("parallel forward: the sequence has state for ", seq.ranks.size(), " ranks, the model ", n);
  if (rank_options.size() != n)
    return make_error("parallel forward: ", rank_options.size(), " ranks' options for ", n, " ranks");
  for (size_t r = 0; r < n; ++r) {
    if (rank_options[r].all_logits != rank_options[0].all_logits)
      return make_error("parallel forward: all_logits differs between ranks 0 and ", r);
    SPW_TRY(ranks_[r]->validate_input(seq.ranks[r], tokens));
  }
  std::vector<Result<std::vector<float>>> results(n, Result<std::vector<float>>(std::vector<float>{}));
  std::vector<std::thread> threads;
  for (size_t r = 1; r < n; ++r)
    threads.emplace_back([&, r] { results[r] = ranks_[r]->forward(seq.ranks[r], tokens, rank_options[r]); });
  results[0] = ranks_[0]->forward(seq.ranks[0], tokens, rank_options[0]);
  for (auto& t : threads) t.join();
  std::vector<std::vector<float>> logits;
  for (size_t r = 0; r < n; ++r) {
    if (!results[r].ok()) return make_error("rank ", r, ": ", results[r].error().message);
    logits.push_back(std::move(results[r].value()));
  }
  return logits;
}

Result<std::vector<float>> ParallelModel::forward(Sequence& seq, std::span<const int32_t> tokens,
                                                  bool all_logits) const {
  std::vector<ForwardOptions> options(ranks_.size());
  for (ForwardOptions& o : options) o.all_logits = all_logits;
  auto all = forward_every_rank(seq, tokens, options);
  if (!all.ok()) return all.error();
  return std::move(all.value()[0]);
}

}  // namespace spw
