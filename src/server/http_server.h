// HTTP transport (cpp-httplib): routes, API-key check, body-size limit, SSE via chunked content
// providers on the connection's own thread, OpenAI error bodies for every failure, and graceful
// shutdown. The OpenAI layer (openai_api.h) does the work; this file only moves bytes.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "base/status.h"
#include "runtime/scheduler.h"
#include "server/openai_api.h"
#include "server/settings.h"

namespace httplib {
class Server;
}

namespace spw::server {

// Constant-time in the content of `given` (time depends only on the expected key's length).
bool api_key_matches(const std::string& expected, const std::string& given);

class HttpServer {
 public:
  HttpServer(OpenAiApi& api, runtime::Engine& engine, const ServerSettings& settings);
  ~HttpServer();

  // Binds host:port (port 0 picks a free one; see port()).
  Status bind();
  int port() const { return port_; }
  // Serves until shutdown() (blocks).
  Status serve();
  // Stop admitting (new requests get 503), give in-flight requests up to grace_s to finish,
  // cancel the rest, then stop the listener. Thread-safe; called from the signal thread.
  void shutdown(double grace_s);

 private:
  void routes();

  OpenAiApi& api_;
  runtime::Engine& engine_;
  const ServerSettings& settings_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> draining_{false};
  int port_ = 0;
};

}  // namespace spw::server
