// Handler-side view of one request in flight: drains the scheduler's RequestStream, detokenizes
// incrementally, applies text stop sequences (holding back text that could still become one),
// and reports the finish reason. Shared by /v1/completions and /v1/chat/completions, streaming
// or not.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/request_stream.h"
#include "server/openai_request.h"
#include "server/text.h"

namespace spw::server {

// Text stop sequences. push() returns the text that can no longer be part of a stop sequence;
// once one is present after a push (one token's text), the output is cut at the leftmost
// occurrence, the rest dropped, and stopped() is true. Tested against a brute-force reference in
// tests/unit/test_server_request_fuzz.cpp.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string push(std::string_view text);
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop sequence that ended the text ("" until stopped()); the first listed on a tie.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

class GenerationRun {
 public:
  GenerationRun(const Text& text, std::shared_ptr<runtime::RequestStream> stream, const GenerationParams& params,
                int32_t eos_id, bool skip_special);
  ~GenerationRun();  // cancels the request if it is still running (client gone, handler error)

  struct Update {
    std::string text;                            // new output text
    std::vector<runtime::GeneratedToken> tokens; // tokens consumed since the last update
    std::optional<std::string> finish_reason;    // "stop", "length", "abort"; set once, on the last update
    std::string error;                           // scheduler or model failure (finish_reason "error")
  };
  // Waits up to `timeout` for progress. Returns an empty Update on timeout.
  Update next(std::chrono::milliseconds timeout);
  void cancel() { stream_->cancel(); }

  int n_prompt_tokens() const { return n_prompt_; }
  int n_cached_tokens() const { return n_cached_; }
  int n_completion_tokens() const { return n_completion_; }
  // Speculative decoding (the request ran with it): drafted tokens verified, and of those accepted.
  bool speculative() const { return speculative_; }
  int n_drafted_tokens() const { return n_drafted_; }
  int n_accepted_tokens() const { return n_accepted_; }
  // The text stop sequence that finished this run; "" when it ended any other way.
  const std::string& stop_sequence() const { return stops_.matched(); }
  // Prompt tokens 1.. scored so far (GenerationParams::prompt_logprobs); complete once finished.
  const std::vector<runtime::GeneratedToken>& prompt_logprobs() const { return prompt_logprobs_; }

 private:
  std::shared_ptr<runtime::RequestStream> stream_;
  Text::Decoder decoder_;
  StopMatcher stops_;
  std::vector<int32_t> stop_ids_;
  bool finished_ = false;
  int n_prompt_ = 0, n_cached_ = 0, n_completion_ = 0;
  bool speculative_ = false;
  int n_drafted_ = 0, n_accepted_ = 0;
  std::vector<runtime::GeneratedToken> prompt_logprobs_;
};

// Drives the runs of one request's choices (n ≥ 1) from the handler's thread, round-robin:
// on_update(i, update) for every update of run i that carries text, tokens or the finish, and on_tick(idle)
// every `tick` (idle: nothing arrived since the last tick). Either callback returning false stops
// it early (client gone) and cancels every run. Returns true when every run finished.
using RunList = std::vector<std::shared_ptr<GenerationRun>>;
bool drive_runs(const RunList& runs, const std::function<bool(size_t, GenerationRun::Update&)>& on_update,
                const std::function<bool(bool idle)>& on_tick, std::chrono::milliseconds tick);

}  // namespace spw::server
