#include "server/generation.h"

#include <algorithm>
#include <thread>

namespace spw::server {

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  size_t first = std::string::npos;
  for (const auto& s : stops_)
    if (const size_t at = held_.find(s); at < first) {
      first = at;
      matched_ = s;
    }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop sequence.
  size_t keep = 0;
  for (const auto& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() { return stopped_ ? std::string() : std::exchange(held_, {}); }

GenerationRun::GenerationRun(const Text& text, std::shared_ptr<runtime::RequestStream> stream,
                             const GenerationParams& params, int32_t eos_id, bool skip_special)
    : stream_(std::move(stream)), decoder_(text, skip_special), stops_(params.stop), stop_ids_(params.stop_token_ids) {
  if (!params.ignore_eos) stop_ids_.push_back(eos_id);
}

GenerationRun::~GenerationRun() {
  if (!finished_) stream_->cancel();
}

GenerationRun::Update GenerationRun::next(std::chrono::milliseconds timeout) {
  Update out;
  if (finished_) return out;
  runtime::StreamUpdate u = stream_->wait(timeout);
  n_prompt_ = u.n_prompt_tokens;
  n_cached_ = u.n_cached_tokens;
  speculative_ = u.speculative;
  n_drafted_ = u.n_drafted_tokens;
  n_accepted_ = u.n_accepted_tokens;
  for (auto& t : u.prompt_logprobs) prompt_logprobs_.push_back(std::move(t));
  for (auto& tok : u.tokens) {
    ++n_completion_;
    const int32_t id = tok.id;
    out.tokens.push_back(std::move(tok));
    // A stop token id (EOS included) ends the output without adding its text.
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) continue;
    out.text += stops_.push(decoder_.push(id));
    if (stops_.stopped()) {
      stream_->cancel();  // the scheduler frees the sequence before its next step
      finished_ = true;
      out.finish_reason = "stop";
      return out;
    }
  }
  if (u.finish == runtime::FinishReason::none) return out;
  finished_ = true;
  out.text += stops_.push(decoder_.flush());
  out.text += stops_.flush();
  switch (u.finish) {
    case runtime::FinishReason::stop: out.finish_reason = "stop"; break;
    case runtime::FinishReason::length: out.finish_reason = "length"; break;
    case runtime::FinishReason::error:
      out.finish_reason = "error";
      out.error = u.error;
      break;
    default: out.finish_reason = stops_.stopped() ? "stop" : "abort"; break;
  }
  if (stops_.stopped()) out.finish_reason = "stop";
  return out;
}

bool drive_runs(const RunList& runs, const std::function<bool(size_t, GenerationRun::Update&)>& on_update,
                const std::function<bool(bool idle)>& on_tick, std::chrono::milliseconds tick) {
  using clock = std::chrono::steady_clock;
  // One run blocks in its stream's wait; several are polled without blocking, then nap briefly.
  const auto wait = runs.size() == 1 ? std::chrono::milliseconds(200) : std::chrono::milliseconds(0);
  std::vector<bool> done(runs.size(), false);
  size_t n_done = 0;
  bool idle = true;
  auto last_tick = clock::now();
  auto stop = [&] {
    for (const auto& run : runs) run->cancel();
    return false;
  };
  while (n_done < runs.size()) {
    bool progress = false;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (done[i]) continue;
      GenerationRun::Update update = runs[i]->next(wait);
      if (update.finish_reason) {
        done[i] = true;
        ++n_done;
      }
      if (update.text.empty() && update.tokens.empty() && !update.finish_reason) continue;
      progress = true;
      if (!on_update(i, update)) return stop();
    }
    idle = idle && !progress;
    if (n_done < runs.size() && clock::now() - last_tick >= tick) {
      if (!on_tick(idle)) return stop();
      last_tick = clock::now();
      idle = true;
    }
    if (!progress && runs.size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace spw::server
