#include "runtime/request_stream.h"

namespace spw::runtime {

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "unknown";
}

StreamUpdate RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout,
               [&] { return !pending_.empty() || !prompt_pending_.empty() || finish_ != FinishReason::none; });
  StreamUpdate u;
  u.tokens.swap(pending_);
  u.prompt_logprobs.swap(prompt_pending_);
  u.finish = finish_;
  u.error = error_;
  u.n_prompt_tokens = n_prompt_;
  u.n_cached_tokens = n_cached_;
  u.speculative = speculative_;
  u.n_drafted_tokens = n_drafted_;
  u.n_accepted_tokens = n_accepted_;
  return u;
}

void RequestStream::cancel() {
  cancelled_.store(true, std::memory_order_release);
}

void RequestStream::push(GeneratedToken token) {
  {
    std::lock_guard lock(mutex_);
    pending_.push_back(std::move(token));
  }
  cv_.notify_all();
}

void RequestStream::push_prompt_logprobs(std::vector<GeneratedToken> scored) {
  {
    std::lock_guard lock(mutex_);
    for (auto& t : scored) prompt_pending_.push_back(std::move(t));
  }
  cv_.notify_all();
}

void RequestStream::finish(FinishReason reason, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (finish_ != FinishReason::none) return;
    finish_ = reason;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void RequestStream::set_cached_tokens(int n) {
  std::lock_guard lock(mutex_);
  n_cached_ = n;
}

void RequestStream::set_speculative() {
  std::lock_guard lock(mutex_);
  speculative_ = true;
}

void RequestStream::add_speculation(int drafted, int accepted) {
  std::lock_guard lock(mutex_);
  n_drafted_ += drafted;
  n_accepted_ += accepted;
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return finish_ != FinishReason::none;
}

}  // namespace spw::runtime
