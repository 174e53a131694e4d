// The hand-off between one HTTP handler thread and the scheduler thread for one request.
// The scheduler pushes tokens and a finish; the handler drains them (blocking with a timeout) and
// may cancel at any time. Cancellation is a flag the scheduler reads before every step, so a
// cancelled sequence is freed within one step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/request.h"

namespace spw::runtime {

struct StreamUpdate {
  std::vector<GeneratedToken> tokens;  // new since the last drain
  std::vector<GeneratedToken> prompt_logprobs;  // prompt tokens 1.. scored since the last drain
  FinishReason finish = FinishReason::none;
  std::string error;                   // set with FinishReason::error
  int n_prompt_tokens = 0;
  int n_cached_tokens = 0;             // prompt tokens served from the prefix cache
  bool speculative = false;            // the sequence runs with speculative decoding
  int n_drafted_tokens = 0;            // tokens drafted and verified
  int n_accepted_tokens = 0;           // of which accepted
};

class RequestStream {
 public:
  explicit RequestStream(int n_prompt_tokens) { n_prompt_ = n_prompt_tokens; }

  // Handler side. Waits up to `timeout` for new tokens or the finish; returns what arrived
  // (possibly nothing). Once the finish has been returned, later calls return it again.
  StreamUpdate wait(std::chrono::milliseconds timeout);
  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Scheduler side.
  void push(GeneratedToken token);
  void push_prompt_logprobs(std::vector<GeneratedToken> scored);
  void finish(FinishReason reason, std::string error = {});
  void set_cached_tokens(int n);
  // Speculative decoding: marks the request as speculating, and counts one verifying step's drafts.
  void set_speculative();
  void add_speculation(int drafted, int accepted);
  bool finished() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<GeneratedToken> pending_;
  std::vector<GeneratedToken> prompt_pending_;
  FinishReason finish_ = FinishReason::none;
  std::string error_;
  int n_prompt_ = 0;
  int n_cached_ = 0;
  bool speculative_ = false;
  int n_drafted_ = 0, n_accepted_ = 0;
  std::atomic<bool> cancelled_{false};
};

}  // namespace spw::runtime
