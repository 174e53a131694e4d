// HTTP transport: routes, the checks every request passes before its body is read (method,
// API key, draining, declared body size), bodies read with the size limit enforced while they
// arrive (chunked ones too), SSE via chunked content providers on the connection's own thread,
// OpenAI error bodies for every failure, and graceful shutdown. httplib (0.11.4) parses requests
// and writes responses; connections, timeouts and limits are ours (connection_loop.h). The
// OpenAI layer (openai_api.h) does the work; this file only moves bytes.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "base/status.h"
#include "runtime/scheduler.h"
#include "server/openai_api.h"
#include "server/settings.h"

namespace httplib {
class Request;
class Response;
}  // namespace httplib

namespace spw::server {

class ConnectionLoop;
struct Connection;
class HttpCore;

// Constant-time in the content of `given` (time depends only on the expected key's length).
bool api_key_matches(const std::string& expected, const std::string& given);

// The token of an `Authorization: Bearer TOKEN` header value; the scheme is case-insensitive
// (RFC 9110, 11.1). Empty when the value is not a bearer credential.
std::string bearer_token(const std::string& authorization);

class HttpServer {
 public:
  HttpServer(OpenAiApi& api, runtime::Scheduler& scheduler, const ServerSettings& settings);
  ~HttpServer();

  // Listens on host:port (port 0 picks a free one; see port()). A port in use is an error.
  Status bind();
  int port() const { return port_; }
  // Serves until shutdown() (blocks).
  Status serve();
  // Stop admitting (new requests get 503), give in-flight requests up to grace_s to finish,
  // cancel the rest, then close every connection, whatever its client is doing. Thread-safe;
  // called from the signal thread.
  void shutdown(double grace_s);

 private:
  void routes();
  // Answers a request that must not reach its handler (unknown path, wrong method, missing API
  // key, draining, body declared too large) before its body is read; true when it did.
  bool refuse_early(const httplib::Request& req, httplib::Response& res);
  // Serves the requests whose heads `conn` holds; true to keep the connection open.
  bool serve_connection(Connection& conn);

  OpenAiApi& api_;
  runtime::Scheduler& scheduler_;
  const ServerSettings& settings_;
  std::unique_ptr<HttpCore> http_;
  std::unique_ptr<ConnectionLoop> loop_;
  std::atomic<bool> draining_{false};
  int port_ = 0;
};

}  // namespace spw::server
