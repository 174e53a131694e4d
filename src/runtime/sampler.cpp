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

Sampler::Sampler(const SamplingParams& params, std::shared_ptr<LogitsConstraint> constraint)
    : params_(params), constraint_(std::move(constraint)) {
  rng_.seed(params.seed ? *params.seed : os_seed());
}

GeneratedToken Sampler::sample(std::span<const float> raw) {
  std::span<const float> logits = raw;
  if (constraint_) {
    masked_.assign(raw.begin(), raw.end());
    constraint_->mask(masked_);
    logits = masked_;
  }
  GeneratedToken out;
  out.id = draw(logits, params_.temperature > 0.f ? uniform01(rng_) : 0.0);
  if (params_.top_logprobs >= 0) log_softmax_top(logits, out.id, params_.top_logprobs, out);
  ++counts_[out.id];
  if (constraint_) constraint_->accept(out.id);
  return out;
}

bool Sampler::runner_may_pick() const {
  return !constraint_ && params_.top_logprobs < 0 && params_.presence_penalty == 0.f &&
         params_.frequency_penalty == 0.f && params_.logit_bias.empty();
}

TokenPick Sampler::next_pick() {
  TokenPick p;
  p.temperature = params_.temperature;
  p.top_k = params_.top_k;
  p.top_p = params_.top_p;
  p.min_p = params_.min_p;
  p.u = params_.temperature > 0.f ? uniform01(rng_) : 0.0;
  return p;
}

GeneratedToken Sampler::accept(int32_t id) {
  GeneratedToken out;
  out.id = id;
  ++counts_[id];
  return out;
}

GeneratedToken Sampler::sample(std::span<const float> logits, const TokenPick& pick) {
  return accept(draw(logits, pick.u));
}

int32_t Sampler::draw(std::span<const float> logits, double u) {
  const size_t vocab = logits.size();
  work_.assign(logits.begin(), logits.end());
  if (params_.presence_penalty != 0.f || params_.frequency_penalty != 0.f)
    for (const auto& [id, count] : counts_)
      work_[id] -= params_.presence_penalty + params_.frequency_penalty * float(count);
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && size_t(id) < vocab) work_[size_t(id)] += bias;

  if (params_.temperature <= 0.f) {
    size_t best = 0;
    for (size_t i = 1; i < vocab; ++i)
      if (work_[i] > work_[best]) best = i;
    return int32_t(best);
  }

  // Candidates in descending logit order (ties: lower id first), cut by top-k.
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) { return work_[a] > work_[b] || (work_[a] == work_[b] && a < b); };
  size_t n_keep = vocab;
  if (params_.top_k > 0 && size_t(params_.top_k) < vocab) {
    n_keep = size_t(params_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + n_keep, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }

  // Probabilities (unnormalised) at temperature.
  const double inv_t = 1.0 / params_.temperature;
  const double top = work_[order_[0]];
  std::vector<double> p(n_keep);
  double sum = 0;
  for (size_t i = 0; i < n_keep; ++i) {
    p[i] = std::exp((double(work_[order_[i]]) - top) * inv_t);
    sum += p[i];
  }
  // Masked (-inf) tokens sort last with probability 0; never let rounding land on one.
  while (n_keep > 1 && p[n_keep - 1] == 0) --n_keep;
  if (params_.min_p > 0.f) {
    const double floor_p = params_.min_p * p[0];  // p[0] is the max
    size_t n = 1;
    while (n < n_keep && p[n] >= floor_p) ++n;
    for (size_t i = n; i < n_keep; ++i) sum -= p[i];
    n_keep = n;
  }
  if (params_.top_p < 1.f) {
    const double target = params_.top_p * sum;
    double kept = 0;
    size_t n = 0;
    while (n < n_keep && kept < target) kept += p[n++];
    n_keep = std::max<size_t>(n, 1);
    sum = kept > 0 ? kept : p[0];
  }
  double r = u * sum;
  for (size_t i = 0; i < n_keep; ++i) {
    r -= p[i];
    if (r < 0) return order_[i];
  }
  return order_[n_keep - 1];
}

}  // namespace spw::runtime
