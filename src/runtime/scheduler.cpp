#include "runtime/scheduler.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <utility>

#include "base/log.h"
#include "runtime/step_plan.h"

namespace spw::runtime {

struct Scheduler::Sequence {
  GenerationRequest request;
  std::shared_ptr<RequestStream> stream;
  Sampler sampler;
  std::unique_ptr<RunnerSequence> state;  // set while running; dropped when preempted
  int64_t n_prefilled = 0;       // prompt tokens in `state`
  std::vector<int32_t> output;   // generated tokens
  size_t n_fed = 0;              // of which in `state`: output.size() − 1 once caught up (the last one
                                 // is the next input); fewer while a preempted sequence replays them
  int n_preemptions = 0;
  bool seated = false;           // counted in n_active_ (admitted, not finished or preempted)
  clock::time_point submitted, last_token_at;
  // Speculation (SchedulerSettings::speculative): the prompt then the generated tokens, which the
  // drafter looks up; this step's input when it verifies drafts (the last generated token, then them).
  std::vector<int32_t> context;
  std::unique_ptr<NgramDrafter> drafter;
  DraftLength draft_length{0};
  std::vector<int32_t> step_tokens;

  Sequence(GenerationRequest r, std::shared_ptr<RequestStream> s)
      : request(std::move(r)), stream(std::move(s)), sampler(request.sampling, request.constraint, request.prompt) {}
  bool decoding() const { return n_prefilled == int64_t(request.prompt.size()); }
  bool verifying() const { return decoding() && !step_tokens.empty(); }
  // Positions the state will hold once the prompt and every generated token are in it.
  int64_t n_total() const { return int64_t(request.prompt.size() + output.size()); }
  // Whether it starts from a prefix-cache copy when there is one: a cached prefix has no logits to score,
  // so a request for prompt logprobs prefills all of it (once: after a preemption they have been sent).
  bool uses_prefix_cache() const { return !request.prompt_logprobs || n_preemptions > 0; }
  // The prompt as the prefix cache keys it: image positions stand for their image's content.
  std::span<const int32_t> cache_key() const {
    return request.images ? std::span<const int32_t>(request.images->cache_key) : std::span<const int32_t>(request.prompt);
  }
};

namespace {

SchedulerSettings capped(SchedulerSettings s, const ModelRunner& runner) {
  if (const int cap = runner.max_sequences(); cap > 0) {
    s.max_num_seqs = std::min(s.max_num_seqs, cap);
    s.max_batch = std::min(s.max_batch, cap);
  }
  return s;
}

}  // namespace

Status Scheduler::check_speculative(const ModelRunner& runner, const SpeculativeSettings& settings) {
  if (settings.mode == SpeculativeMode::off) return {};
  if (settings.draft_tokens < 1) return make_error("--draft-tokens ", settings.draft_tokens, " must be at least 1");
  const int most = runner.max_rollback_tokens() - 1;  // a verified step is the last token and the drafts
  if (most < 1)
    return make_error("--speculative ", to_string(settings.mode), " needs a runner that can take back rejected drafts; the ",
                      runner.device(), " runner was set up without room for them");
  if (settings.draft_tokens > most)
    return make_error("--draft-tokens ", settings.draft_tokens, " must be in [1, ", most, "] (the ", runner.device(),
                      " runner takes back at most ", most + 1, " tokens of a step)");
  if (settings.ngram.min_ngram < 1 || settings.ngram.max_ngram < settings.ngram.min_ngram)
    return make_error("n-gram match lengths must satisfy 1 ≤ min (", settings.ngram.min_ngram, ") ≤ max (",
                      settings.ngram.max_ngram, ")");
  return {};
}

Scheduler::Scheduler(ModelRunner& runner, SchedulerSettings settings)
    : runner_(runner), settings_(capped(settings, runner)),
      prefix_cache_(settings.prefix_block, settings.prefix_cache_nbytes, runner.max_cached_states()) {
  metrics_.set_device(std::string(runner_.device()));
  if (settings_.speculative.mode != SpeculativeMode::off) metrics_.set_drafter(to_string(settings_.speculative.mode));
  SPW_CHECK(check_speculative(runner_, settings_.speculative).ok());
  SPW_CHECK(settings_.prefix_block > 0 && settings_.prefill_chunk % settings_.prefix_block == 0);
  SPW_CHECK(settings_.step_token_budget >= settings_.prefill_chunk && settings_.max_batch > 0);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

Submission Scheduler::submit(GenerationRequest request) {
  Submission out;
  const int64_t vocab = runner_.config().vocab_size;
  if (request.prompt.empty()) return {SubmitCode::invalid, "the prompt is empty", nullptr};
  for (size_t i = 0; i < request.prompt.size(); ++i)
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab)
      return {SubmitCode::invalid,
              make_error("prompt token ", i, " is ", request.prompt[i], ", outside the vocabulary [0, ", vocab, ")").message,
              nullptr};
  for (const auto& [id, bias] : request.sampling.logit_bias)
    if (id < 0 || id >= vocab)
      return {SubmitCode::invalid,
              make_error("logit_bias names token ", id, ", outside the vocabulary [0, ", vocab, ")").message,
              nullptr, "logit_bias"};
  if (request.max_tokens < 1) return {SubmitCode::invalid, "max_tokens must be at least 1", nullptr};
  if (const PromptImages* images = request.images.get()) {
    if (!runner_.takes_images())
      return {SubmitCode::invalid,
              make_error("the ", runner_.device(), " runner does not take image inputs; send text only, or serve a ",
                         "V4.1 model with a vision tower with --device cpu")
                  .message,
              nullptr, "messages"};
    const size_t n = request.prompt.size();
    const size_t n_image = size_t(std::count_if(images->is_image.begin(), images->is_image.end(), [](uint8_t b) { return b; }));
    if (images->is_image.size() != n || images->cache_key.size() != n || images->d_model != runner_.config().d_model ||
        images->rows.size() != n_image * size_t(images->d_model))
      return {SubmitCode::invalid, "the prompt's image positions do not match its tokens", nullptr, "messages"};
  }
  const int64_t reserve = int64_t(request.prompt.size()) + request.max_tokens;
  if (const int64_t ctx = runner_.max_context(); ctx > 0 && reserve > ctx)
    return {SubmitCode::too_large,
            make_error("the prompt (", request.prompt.size(), " tokens) plus max_tokens (", request.max_tokens,
                       ") needs ", reserve, " positions, more than the ", runner_.device(),
                       " runner's context of ", ctx, " (--max-model-len); shorten the prompt or lower max_tokens")
                .message,
            nullptr};
  if (reserve > settings_.kv_tokens)
    return {SubmitCode::too_large,
            make_error("the prompt (", request.prompt.size(), " tokens) plus max_tokens (", request.max_tokens,
                       ") needs ", reserve, " KV positions, more than this server's KV capacity of ", settings_.kv_tokens,
                       " (--kv-tokens); shorten the prompt or lower max_tokens")
                .message,
            nullptr};

  auto stream = std::make_shared<RequestStream>(int(request.prompt.size()));
  auto seq = std::make_unique<Sequence>(std::move(request), stream);
  seq->submitted = clock::now();
  {
    std::lock_guard lock(mutex_);
    if (draining_ || stopping_) return {SubmitCode::draining, "the server is shutting down", nullptr};
    // The queue holds what may be admitted at once (free seats) plus max_queue more.
    const int64_t seats = std::max<int64_t>(0, settings_.max_num_seqs - n_active_);
    if (int64_t(waiting_.size()) >= seats + settings_.max_queue) {
      metrics_.on_reject();
      return {SubmitCode::queue_full,
              make_error("the server is at capacity: ", n_active_, " requests running and ", waiting_.size(),
                         " queued (--max-queue ", settings_.max_queue, "); retry later")
                  .message,
              nullptr};
    }
    waiting_.push_back(std::move(seq));
  }
  wake_.notify_one();
  out.stream = std::move(stream);
  return out;
}

void Scheduler::drain() {
  std::lock_guard lock(mutex_);
  draining_ = true;
}

void Scheduler::cancel_all() {
  {
    std::lock_guard lock(mutex_);
    cancel_all_ = true;
  }
  wake_.notify_one();
}

bool Scheduler::idle() const {
  std::lock_guard lock(mutex_);
  return waiting_.empty() && n_active_ == 0;
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    draining_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::release_locked(Sequence& seq) {
  if (seq.seated) --n_active_;
  seq.seated = false;
}

// FIFO: the head of the queue is admitted first; nothing overtakes it. A sequence is admitted when a
// seat is free and the runner's KV can hold its prompt (and the tokens it generated before a
// preemption) beside every running sequence's next step; prefix-cache copies other than those
// of its own prompt's prefixes are dropped, oldest first, to make that room. A sequence that will start
// from a cached copy counts what the runner shares with that copy as held (KvGrowth::copy_of). Runner
// calls happen on the scheduler thread only.
std::vector<std::unique_ptr<Scheduler::Sequence>> Scheduler::admit_locked() {
  std::vector<std::unique_ptr<Sequence>> admitted;
  std::vector<KvGrowth> growth;
  const auto source = [&](const Sequence& s) {
    return s.uses_prefix_cache() ? prefix_cache_.peek(s.cache_key(), max_cached_prefix(int64_t(s.request.prompt.size())))
                                 : nullptr;
  };
  // Each running sequence's next step: one decode token, or its next prefill piece.
  for (const auto& r : running_)
    growth.push_back({r->state.get(), r->decoding() ? r->state->n_past() + 1
                                                    : next_prefill_end(r->n_prefilled, int64_t(r->request.prompt.size()),
                                                                       settings_.prefill_chunk, settings_.prefix_block)});
  const size_t first_new = growth.size();
  while (!waiting_.empty() && n_active_ < settings_.max_num_seqs) {
    growth.push_back({nullptr, waiting_.front()->n_total(), source(*waiting_.front())});
    // The copies this request would start from stay (a burst sharing a prefix must not evict it); a copy
    // an earlier admission counted on may go, so theirs are looked up again.
    while (!runner_.kv_can_hold(growth) && prefix_cache_.evict_oldest(waiting_.front()->cache_key()))
      for (size_t i = first_new; i + 1 < growth.size(); ++i) growth[i].copy_of = source(*admitted[i - first_new]);
    if (!runner_.kv_can_hold(growth)) break;
    ++n_active_;
    waiting_.front()->seated = true;
    admitted.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return admitted;
}

// Capacity is released before the stream reports the finish, so a client that saw its request
// finish also sees the scheduler's counts without it.
void Scheduler::finish(Sequence& seq, FinishReason reason, std::string error) {
  {
    std::lock_guard lock(mutex_);
    release_locked(seq);
  }
  metrics_.on_finish(reason == FinishReason::cancelled);
  seq.stream->finish(reason, std::move(error));
}

bool Scheduler::start_sequence(Sequence& seq) {
  const auto& prompt = seq.request.prompt;
  int64_t cached = 0;
  if (seq.uses_prefix_cache())
    std::tie(cached, seq.state) = prefix_cache_.lookup(seq.cache_key(), max_cached_prefix(int64_t(prompt.size())));
  if (!seq.state) {
    auto fresh = runner_.new_sequence();
    if (!fresh.ok()) {
      SPW_LOG_ERROR("no sequence for a request: {}", fresh.error().message);
      finish(seq, FinishReason::error, fresh.error().message);
      return false;
    }
    seq.state = std::move(fresh.value());
  }
  seq.n_prefilled = cached;
  seq.n_fed = 0;
  if (settings_.speculative.mode != SpeculativeMode::off && !seq.drafter) {
    seq.drafter = std::make_unique<NgramDrafter>(settings_.speculative.ngram);
    seq.draft_length = DraftLength(settings_.speculative.draft_tokens);
    seq.context = prompt;
    seq.stream->set_speculative();
  }
  if (seq.n_preemptions == 0) {
    seq.stream->set_cached_tokens(int(cached));
    metrics_.on_admit(int64_t(prompt.size()), cached);
  }
  return true;
}

void Scheduler::publish_gauges() {
  int64_t held = 0;
  for (const auto& seq : running_) held += seq->state->n_past();
  int64_t queued;
  {
    std::lock_guard lock(mutex_);
    queued = int64_t(waiting_.size());
  }
  metrics_.set_gauges(queued, int64_t(running_.size()), held, settings_.kv_tokens, prefix_cache_.n_entries(),
                      prefix_cache_.nbytes(), runner_.usage());
}

void Scheduler::loop() {
  publish_gauges();  // the runner's capacity is in /metrics before the first request
  for (;;) {
    std::vector<std::unique_ptr<Sequence>> fresh, gone;
    std::unique_ptr<Sequence> unfit;
    bool cancel_everything = false;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || cancel_all_ || !waiting_.empty() || !running_.empty(); });
      cancel_everything = cancel_all_ || stopping_;
      cancel_all_ = false;
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (cancel_everything || (*it)->stream->cancelled()) {
          gone.push_back(std::move(*it));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
      fresh = admit_locked();
      // Nothing runs and the head still does not fit: it never will (submit() bounds a request by
      // --kv-tokens, so this is a runner whose KV is smaller than that); refuse it rather than spin.
      if (running_.empty() && fresh.empty() && !waiting_.empty() && n_active_ < settings_.max_num_seqs) {
        unfit = std::move(waiting_.front());
        waiting_.pop_front();
      }
    }
    for (auto& seq : gone) finish(*seq, FinishReason::cancelled);
    if (unfit)
      finish(*unfit, FinishReason::error,
             make_error("the ", runner_.device(), " runner's KV memory cannot hold this request (", unfit->n_total(),
                        " positions) even alone; lower --kv-tokens to what the runner holds, or shorten the request")
                 .message);
    for (auto& seq : fresh)
      if (start_sequence(*seq)) running_.push_back(std::move(seq));
    std::erase_if(running_, [&](const std::unique_ptr<Sequence>& seq) {
      if (!cancel_everything && !seq->stream->cancelled()) return false;
      finish(*seq, FinishReason::cancelled);
      return true;
    });
    if (!running_.empty()) run_step();
    publish_gauges();
    std::lock_guard lock(mutex_);
    if (stopping_ && running_.empty() && waiting_.empty()) break;
  }
}

// Sends running_[i] back to the head of the queue without its state; readmitted, it prefills its prompt
// again and replays its generated tokens as decode inputs (what produced them the first time, so
// greedy output is unchanged), then goes on sampling.
void Scheduler::preempt(size_t i) {
  std::unique_ptr<Sequence> seq = std::move(running_[i]);
  running_.erase(running_.begin() + std::ptrdiff_t(i));
  SPW_LOG_DEBUG("preempting a sequence at {} positions to free KV memory", seq->state->n_past());
  seq->state.reset();
  seq->n_prefilled = 0;
  seq->n_fed = 0;
  seq->step_tokens.clear();
  ++seq->n_preemptions;
  metrics_.on_preempt();
  std::lock_guard lock(mutex_);
  release_locked(*seq);
  waiting_.push_front(std::move(seq));
}

// One runner step; prefill pieces of requests that asked for prompt logprobs get logits at every
// position (scored and pushed here), so every member's result is then its last position's logits,
// or none where the runner picked the token (offered[k]: picks[k] goes to the runner).
Result<std::vector<std::vector<float>>> Scheduler::forward(const std::vector<size_t>& members,
                                                        std::span<const std::span<const int32_t>> tokens,
                                                        std::span<TokenPick> picks, std::span<const char> offered) {
  std::vector<RunnerInput> inputs(members.size());
  for (size_t k = 0; k < members.size(); ++k) {
    const Sequence& s = *running_[members[k]];
    const bool scored = !s.decoding() && s.request.prompt_logprobs && s.n_preemptions == 0;
    inputs[k] = {s.state.get(), tokens[k], scored || s.verifying(), offered[k] ? &picks[k] : nullptr, s.verifying()};
    if (s.request.images && !s.decoding())  // a prefill piece: prompt[n_prefilled, + its tokens)
      inputs[k].images = s.request.images->slice(size_t(s.n_prefilled), size_t(s.n_prefilled) + tokens[k].size());
  }
  auto out = runner_.forward(inputs);
  if (!out.ok()) return out;
  const size_t vocab = size_t(runner_.config().vocab_size);
  for (size_t k = 0; k < members.size(); ++k) {
    if (!inputs[k].all_logits || inputs[k].keep_rollback) continue;  // a verify step keeps all its rows
    Sequence& s = *running_[members[k]];
    const auto& prompt = s.request.prompt;
    std::vector<float>& rows = (*out)[k];
    std::vector<GeneratedToken> lp;
    for (size_t j = 0; j < tokens[k].size(); ++j) {
      const size_t next = size_t(s.n_prefilled) + j + 1;  // row j predicts this prompt position
      if (next >= prompt.size()) break;
      lp.push_back(score_token(std::span<const float>(rows).subspan(j * vocab, vocab), prompt[next],
                               std::max(s.request.sampling.top_logprobs, 0)));
    }
    s.stream->push_prompt_logprobs(std::move(lp));
    rows.erase(rows.begin(), rows.end() - std::ptrdiff_t(vocab));
  }
  return out;
}

// The step's plan, within the runner's KV: while the members' growth does not fit, prefix-cache copies
// are dropped (oldest first), then the most recently admitted sequences preempted.
StepPlan Scheduler::plan_within_kv(std::vector<PlanEntry>& entries) {
  const int64_t chunk = settings_.prefill_chunk, block = settings_.prefix_block;
  for (;;) {
    entries.assign(running_.size(), {});
    for (size_t i = 0; i < running_.size(); ++i) {
      const Sequence& s = *running_[i];
      entries[i].decoding = s.decoding();
      entries[i].n_tokens = s.verifying() ? int64_t(s.step_tokens.size())
                            : s.decoding() ? 1
                                           : next_prefill_end(s.n_prefilled, int64_t(s.request.prompt.size()), chunk, block) -
                                                 s.n_prefilled;
    }
    StepPlan plan = plan_step(entries, size_t(settings_.max_batch), settings_.step_token_budget, rotate_);
    for (size_t i : plan.without_drafts) {
      running_[i]->step_tokens.clear();
      entries[i].n_tokens = 1;
    }
    std::vector<KvGrowth> growth;
    for (size_t i : plan.members)
      growth.push_back({running_[i]->state.get(), running_[i]->state->n_past() + entries[i].n_tokens});
    if (runner_.kv_can_hold(growth)) return plan;
    // Drafts are the first thing to give up: nothing is evicted or preempted to verify them.
    bool drafted = false;
    for (auto& r : running_) drafted |= !std::exchange(r->step_tokens, {}).empty();
    if (drafted) continue;
    if (prefix_cache_.evict_oldest()) continue;
    if (running_.size() == 1) {
      // Alone, with no copies cached: submit() admitted nothing larger than --kv-tokens, so this is a
      // runner whose KV is smaller than that.
      finish(*running_[0], FinishReason::error,
             make_error("the ", runner_.device(), " runner's KV memory cannot hold this sequence (",
                        growth[0].n_total, " positions) even alone; lower --kv-tokens to what the runner holds")
                 .message);
      running_.clear();
      return {};
    }
    preempt(running_.size() - 1);
  }
}

void Scheduler::draft(Sequence& s) {
  s.step_tokens.clear();
  if (!s.decoding() || s.n_fed + 1 != s.output.size()) return;  // prefilling, or replaying after a preemption
  // The step emits at most drafts + 1 tokens, and verifies at most a window of them.
  const int64_t room = std::min<int64_t>(s.request.max_tokens - int64_t(s.output.size()) - 1,
                                         runner_.max_rollback_tokens() - 1);
  const int n = int(std::min<int64_t>(s.draft_length.next(), room));
  if (n <= 0) return;
  std::vector<int32_t> drafted = s.drafter->propose(s.context, n);
  if (drafted.empty()) return;
  s.step_tokens.reserve(drafted.size() + 1);
  s.step_tokens.push_back(s.output.back());
  s.step_tokens.insert(s.step_tokens.end(), drafted.begin(), drafted.end());
}

bool Scheduler::emit(Sequence& s, GeneratedToken tok, clock::time_point now) {
  const int32_t id = tok.id;
  if (s.output.empty())
    metrics_.on_first_token(std::chrono::duration<double>(now - s.submitted).count());
  else
    metrics_.on_inter_token(std::chrono::duration<double>(now - s.last_token_at).count());
  s.last_token_at = now;
  s.output.push_back(id);
  if (s.drafter) s.context.push_back(id);
  s.stream->push(std::move(tok));
  const auto& stops = s.request.stop_token_ids;
  if ((id == runner_.config().eos_id && !s.request.ignore_eos) || std::find(stops.begin(), stops.end(), id) != stops.end()) {
    finish(s, FinishReason::stop);
    return true;
  }
  if (int64_t(s.output.size()) >= s.request.max_tokens) {
    finish(s, FinishReason::length);
    return true;
  }
  return false;
}

// Row i of the logits predicts the token after step_tokens[i]: draft i + 1 is verified against row i,
// and the row after the last accepted draft gives the step's own token (the residual draw of a rejection,
// or a plain sample when every draft was accepted).
bool Scheduler::verify_drafts(Sequence& s, const std::vector<float>& logits, clock::time_point now) {
  const size_t vocab = size_t(runner_.config().vocab_size), n_drafts = s.step_tokens.size() - 1;
  std::vector<int32_t> step = std::exchange(s.step_tokens, {});
  std::vector<GeneratedToken> tokens;
  size_t accepted = 0;
  for (size_t i = 0; i <= n_drafts; ++i) {
    const auto row = std::span<const float>(logits).subspan(i * vocab, vocab);
    if (i == n_drafts) {
      tokens.push_back(s.sampler.sample(row));
      break;
    }
    Sampler::Verdict v = s.sampler.verify(row, step[i + 1]);
    tokens.push_back(std::move(v.token));
    if (!v.accepted) break;
    ++accepted;
  }
  // Counted before the tokens reach the stream, so the response that finishes with them reports them.
  s.draft_length.on_verified(int(n_drafts), int(accepted));
  metrics_.on_speculation(int64_t(n_drafts), int64_t(accepted));
  s.stream->add_speculation(int(n_drafts), int(accepted));
  for (GeneratedToken& tok : tokens)
    if (emit(s, std::move(tok), now)) return true;
  if (auto st = s.state->truncate(s.state->n_past() - int64_t(n_drafts - accepted)); !st.ok()) {
    SPW_LOG_ERROR("taking back rejected drafts failed: {}", st.error().message);
    finish(s, FinishReason::error, st.error().message);
    return true;
  }
  s.n_fed = s.output.size() - 1;  // the state holds every generated token but the last, the next input
  return false;
}

std::vector<std::span<const int32_t>> Scheduler::queued_prompts() const {
  // Only this thread takes sequences out of the queue, so the prompts outlive the lock.
  std::lock_guard lock(mutex_);
  std::vector<std::span<const int32_t>> out;
  for (const auto& w : waiting_)
    if (w->uses_prefix_cache()) out.emplace_back(w->cache_key());
  return out;
}

void Scheduler::run_step() {
  const int64_t block = settings_.prefix_block;
  if (settings_.speculative.mode != SpeculativeMode::off)
    for (auto& s : running_) draft(*s);
  std::vector<PlanEntry> entries;
  const StepPlan plan = plan_within_kv(entries);
  ++rotate_;
  if (plan.members.empty()) return;

  std::vector<std::span<const int32_t>> tokens;
  // Decodes let the runner pick (TokenPick: the sampler's whole pipeline) unless the sampler wants more
  // top_logprobs than a pick reports; a replayed token's pick is greedy and ignored (nothing is
  // sampled then, and no uniform is drawn).
  std::vector<TokenPick> picks(plan.members.size());
  std::vector<char> offered(plan.members.size(), 0);
  for (size_t k = 0; k < plan.members.size(); ++k) {
    Sequence& s = *running_[plan.members[k]];
    if (s.verifying()) {
      tokens.emplace_back(s.step_tokens);
    } else if (s.decoding()) {
      tokens.emplace_back(&s.output[s.n_fed], 1);
      if (s.n_fed + 1 < s.output.size()) {
        offered[k] = 1;
      } else if (s.sampler.runner_may_pick()) {
        picks[k] = s.sampler.next_pick(runner_.config().vocab_size);
        offered[k] = 1;
      }
    } else {
      tokens.push_back(std::span<const int32_t>(s.request.prompt).subspan(size_t(s.n_prefilled), size_t(entries[plan.members[k]].n_tokens)));
    }
  }
  const auto t0 = clock::now();
  auto logits = forward(plan.members, tokens, picks, offered);
  const auto t1 = clock::now();

  std::vector<bool> done(running_.size(), false);
  int64_t n_prefill = 0, n_generated = 0;
  if (!logits.ok()) {
    SPW_LOG_ERROR("scheduler step failed: {}", logits.error().message);
    for (size_t i : plan.members) {
      finish(*running_[i], FinishReason::error, logits.error().message);
      done[i] = true;
    }
  } else {
    for (size_t k = 0; k < plan.members.size(); ++k) {
      Sequence& s = *running_[plan.members[k]];
      if (s.decoding()) s.draft_length.on_step();
      if (s.verifying()) {
        const size_t before = s.output.size();
        done[plan.members[k]] = verify_drafts(s, (*logits)[k], t1);
        n_generated += int64_t(s.output.size() - before);
        continue;
      }
      if (!s.decoding()) {
        s.n_prefilled += int64_t(tokens[k].size());
        n_prefill += int64_t(tokens[k].size());
        const std::array<KvGrowth, 1> copy{KvGrowth{nullptr, s.n_prefilled, s.state.get()}};
        if (s.n_prefilled % block == 0 && runner_.kv_can_hold(copy))
          prefix_cache_.insert(s.cache_key().first(size_t(s.n_prefilled)), *s.state,
                               queued_prompts());
        if (!s.decoding() || !s.output.empty()) continue;  // more prompt, or generated tokens to replay
      } else if (++s.n_fed < s.output.size()) {
        continue;  // replaying after a preemption
      }
      // A pick offered: the runner's token, or the host's draw with the pick's uniform.
      GeneratedToken tok = !offered[k]            ? s.sampler.sample((*logits)[k])
                           : picks[k].token >= 0 ? s.sampler.accept(picks[k])
                                                 : s.sampler.sample((*logits)[k], picks[k]);
      ++n_generated;
      done[plan.members[k]] = emit(s, std::move(tok), t1);
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < running_.size(); ++i)
    if (!done[i]) running_[kept++] = std::move(running_[i]);
  running_.resize(kept);
  metrics_.on_step(std::chrono::duration<double>(t1 - t0).count(), n_prefill, n_generated, t1);
}

}  // namespace spw::runtime
