#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>

namespace spw::runtime {
namespace {

uint64_t os_seed() {
  static std::random_device device;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  return (uint64_t(device()) << 32) ^ device();
}

// Uniform double in [0, 1) from 53 random bits: the same on every standard library.
double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

void log_softmax_top(std::span<const float> logits, int32_t chosen, int top_n, GeneratedToken& out) {
  float max_l = -std::numeric_limits<float>::infinity();
  for (float l : logits) max_l = std::max(max_l, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - max_l);
  const double log_z = max_l + std::log(sum);
  out.logprob = float(double(logits[chosen]) - log_z);
  if (top_n <= 0) return;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t n = std::min<size_t>(size_t(top_n), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  out.top.reserve(n);
  for (size_t i = 0; i < n && std::isfinite(logits[ids[i]]); ++i)
    out.top.push_back({ids[i], float(double(logits[ids[i]]) - log_z)});
}

}  // namespace

GeneratedToken score_token(std::span<const float> logits, int32_t id, int top_n) {
  GeneratedToken out;
  out.id = id;
  log_softmax_top(logits, id, top_n, out);
  return out;
}

Sampler::Sampler(const SamplingParams& params, std::shared_ptr<LogitsConstraint> constraint,
                 std::span<const int32_t> prompt)
    : params_(params), constraint_(std::move(constraint)) {
  rng_.seed(params.seed ? *params.seed : os_seed());
  if (params.repetition_penalty != 1.f) seen_.insert(prompt.begin(), prompt.end());
  for (const auto& [id, bias] : params.logit_bias) {
    auto same = std::find_if(biases_.begin(), biases_.end(), [id = id](const LogitShift& b) { return b.id == id; });
    if (same == biases_.end()) biases_.push_back({id, bias});
    else same->delta += bias;
  }
}

GeneratedToken Sampler::sample(std::span<const float> logits) { return sample(logits, next_pick(int64_t(logits.size()))); }

bool Sampler::runner_may_pick() const { return params_.top_logprobs <= kMaxPickTopLogprobs; }

TokenPick Sampler::next_pick(int64_t vocab) {
  TokenPick p;
  p.temperature = params_.temperature;
  p.top_k = params_.top_k;
  p.top_p = params_.top_p;
  p.min_p = params_.min_p;
  p.u = params_.temperature > 0.f ? uniform01(rng_) : 0.0;
  if (params_.presence_penalty != 0.f || params_.frequency_penalty != 0.f) {
    p.penalties.reserve(counts_.size());
    for (const auto& [id, count] : counts_)
      p.penalties.push_back({id, -(params_.presence_penalty + params_.frequency_penalty * float(count))});
  }
  if (params_.repetition_penalty != 1.f) {
    p.repetition_penalty = params_.repetition_penalty;
    p.repeated.assign(seen_.begin(), seen_.end());
  }
  p.biases = biases_;
  if (constraint_) {
    p.allowed.assign(size_t(vocab + 63) / 64, 0);
    constraint_->allowed(p.allowed);
  }
  p.top_logprobs = params_.top_logprobs;
  return p;
}

void Sampler::record(int32_t id) {
  ++counts_[id];
  if (params_.repetition_penalty != 1.f) seen_.insert(id);
  if (constraint_) constraint_->accept(id);
}

GeneratedToken Sampler::accept(const TokenPick& picked) {
  GeneratedToken out;
  out.id = picked.token;
  if (picked.top_logprobs >= 0) {
    out.logprob = picked.logprob;
    out.top = picked.top;
  }
  record(out.id);
  return out;
}

GeneratedToken Sampler::sample(std::span<const float> raw, const TokenPick& pick) {
  std::span<const float> logits = raw;
  if (!pick.allowed.empty()) {
    masked_.assign(raw.begin(), raw.end());
    apply_mask(masked_, pick.allowed);
    logits = masked_;
  }
  GeneratedToken out;
  out.id = draw(logits, pick);
  if (pick.top_logprobs >= 0) log_softmax_top(logits, out.id, pick.top_logprobs, out);
  record(out.id);
  return out;
}

size_t Sampler::distribution(std::span<const float> logits, const TokenPick& pick, double& sum) {
  const size_t vocab = logits.size();
  work_.assign(logits.begin(), logits.end());
  if (pick.repetition_penalty != 1.f)
    for (int32_t id : pick.repeated)
      if (id >= 0 && size_t(id) < vocab) {
        float& l = work_[size_t(id)];
        l = l > 0.f ? l / pick.repetition_penalty : l * pick.repetition_penalty;
      }
  for (const std::vector<LogitShift>* shifts : {&pick.penalties, &pick.biases})
    for (const LogitShift& s : *shifts)
      if (s.id >= 0 && size_t(s.id) < vocab) work_[size_t(s.id)] += s.delta;

  if (pick.temperature <= 0.f) {
    size_t best = 0;
    for (size_t i = 1; i < vocab; ++i)
      if (work_[i] > work_[best]) best = i;
    order_.assign(1, int32_t(best));
    probs_.assign(1, 1.0);
    sum = 1.0;
    return 1;
  }
  // Candidates in descending logit order (ties: lower id first), cut by top-k.
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
  size_t n_keep = vocab;
  if (pick.top_k > 0 && size_t(pick.top_k) < vocab) {
    n_keep = size_t(pick.top_k);
    std::partial_sort(order_.begin(), order_.begin() + n_keep, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }

  // Probabilities (unnormalised) at temperature.
  const double inv_t = 1.0 / pick.temperature;
  const double top = work_[order_[0]];
  std::vector<double>& p = probs_;
  p.resize(n_keep);
  sum = 0;
  for (size_t i = 0; i < n_keep; ++i) {
    p[i] = std::exp((double(work_[order_[i]]) - top) * inv_t);
    sum += p[i];
  }
  // Masked (-inf) tokens sort last with probability 0; never let rounding land on one.
  while (n_keep > 1 && p[n_keep - 1] == 0) --n_keep;
  if (pick.min_p > 0.f) {
    const double floor_p = pick.min_p * p[0];  // p[0] is the max
    size_t n = 1;
    while (n < n_keep && p[n] >= floor_p) ++n;
    for (size_t i = n; i < n_keep; ++i) sum -= p[i];
    n_keep = n;
  }
  if (pick.top_p < 1.f) {
    const double target = pick.top_p * sum;
    double kept = 0;
    size_t n = 0;
    while (n < n_keep && kept < target) kept += p[n++];
    n_keep = std::max<size_t>(n, 1);
    sum = kept > 0 ? kept : p[0];
  }
  return n_keep;
}

int32_t Sampler::draw(std::span<const float> logits, const TokenPick& pick) {
  double sum = 0;
  const size_t n_keep = distribution(logits, pick, sum);
  double r = pick.u * sum;
  for (size_t i = 0; i < n_keep; ++i) {
    r -= probs_[i];
    if (r < 0) return order_[i];
  }
  return order_[n_keep - 1];
}

Sampler::Verdict Sampler::verify(std::span<const float> raw, int32_t draft) {
  const TokenPick pick = next_pick(int64_t(raw.size()));
  const double u_accept = pick.temperature > 0.f ? uniform01(rng_) : 0.0;
  std::span<const float> logits = raw;
  if (!pick.allowed.empty()) {
    masked_.assign(raw.begin(), raw.end());
    apply_mask(masked_, pick.allowed);
    logits = masked_;
  }
  double sum = 0;
  const size_t n_keep = distribution(logits, pick, sum);
  double p_draft = 0;
  for (size_t i = 0; i < n_keep; ++i)
    if (order_[i] == draft) p_draft = probs_[i];
  Verdict v;
  v.accepted = p_draft > 0 && u_accept * sum < p_draft;  // greedy: p_draft is 1 for the argmax, else 0
  v.token.id = draft;
  if (!v.accepted) {
    // The residual distribution: the pick's with the draft removed, inverted at the pick's uniform.
    double r = pick.u * (sum - p_draft);
    v.token.id = -1;
    for (size_t i = 0; i < n_keep && v.token.id < 0; ++i) {
      if (order_[i] == draft) continue;
      r -= probs_[i];
      if (r < 0) v.token.id = order_[i];
    }
    for (size_t i = n_keep; i-- > 0 && v.token.id < 0;)  // rounding left r ≥ 0: the last kept candidate
      if (order_[i] != draft) v.token.id = order_[i];
    if (v.token.id < 0) v.token.id = order_[0];  // the draft was the only candidate and had no mass
  }
  if (pick.top_logprobs >= 0) log_softmax_top(logits, v.token.id, pick.top_logprobs, v.token);
  record(v.token.id);
  return v;
}

}  // namespace spw::runtime
