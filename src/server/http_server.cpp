#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "base/log.h"
#include "server/metrics_text.h"
#include "server/sockets.h"

namespace spw::server {
namespace {

void send(httplib::Response& res, const HttpReply& reply) {
  res.status = reply.status;
  for (const auto& [k, v] : reply.headers) res.set_header(k, v);
  if (!reply.sse) {
    res.set_content(reply.body, reply.content_type);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto producer = reply.sse;
  res.set_chunked_content_provider(reply.content_type, [producer](size_t, httplib::DataSink& sink) {
    producer([&sink](const std::string& s) { return sink.write(s.data(), s.size()); });
    sink.done();
    return true;
  });
}

std::string default_message(int status, const ServerSettings& s) {
  switch (status) {
    case 404: return "no such endpoint";
    case 405: return "method not allowed";
    case 413: return "the request body is larger than " + std::to_string(s.max_body_bytes) + " bytes (--max-body-bytes)";
    case 400: return "malformed HTTP request";
    default: return "HTTP error " + std::to_string(status);
  }
}

// A probe for one request's connection; the socket is looked up on first use, so requests that
// finish before the first probe never pay for the search.
ClientGone client_gone_probe(const httplib::Request& req) {
  return [&req, fd = -2]() mutable {
    if (fd == -2) fd = connection_socket(req.remote_addr, req.remote_port, req.local_port);
    return fd >= 0 && socket_closed(fd);
  };
}

}  // namespace

bool api_key_matches(const std::string& expected, const std::string& given) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  const size_t n = given.size();
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = n ? static_cast<unsigned char>(given[i % n]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

HttpServer::HttpServer(OpenAiApi& api, runtime::Engine& engine, const ServerSettings& settings)
    : api_(api), engine_(engine), settings_(settings), http_(std::make_unique<httplib::Server>()) {
  const size_t n_threads = size_t(std::max(settings.http_threads, 4));
  http_->new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
  http_->set_payload_max_length(settings.max_body_bytes);
  http_->set_keep_alive_max_count(10000);
  http_->set_keep_alive_timeout(5);
  http_->set_read_timeout(30);
  http_->set_write_timeout(30);
  http_->set_tcp_nodelay(true);
  http_->set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    res.set_content(dump_json(error_json({res.status, default_message(res.status, settings_),
                                          res.status == 404 ? "not_found_error" : "invalid_request_error", "", ""})),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    SPW_LOG_ERROR("handler threw: {}", what);
    res.status = 500;
    res.set_content(dump_json(error_json({500, what, "server_error", "", ""})), "application/json");
  });
  routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::routes() {
  // Wraps an OpenAI-layer call: API key, draining, and a last-resort catch (handlers never throw).
  auto guarded = [this](auto fn, bool authenticated) {
    return [this, fn, authenticated](const httplib::Request& req, httplib::Response& res) {
      if (authenticated && !settings_.api_key.empty()) {
        const std::string auth = req.get_header_value("Authorization");
        const std::string given = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : std::string();
        if (!api_key_matches(settings_.api_key, given))
          return send(res, HttpReply::error({401, "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
                                             "invalid_request_error", "", "invalid_api_key"}));
      }
      if (draining_.load())
        return send(res, HttpReply::error({503, "the server is shutting down", "server_unavailable", "", "shutting_down"}));
      try {
        send(res, fn(req));
      } catch (const std::exception& e) {
        SPW_LOG_ERROR("handler failed: {}", e.what());
        send(res, HttpReply::error({500, e.what(), "server_error", "", ""}));
      }
    };
  };
  http_->Post("/v1/completions", guarded([this](const httplib::Request& r) {
                return api_.completions(r.body, client_gone_probe(r));
              }, true));
  http_->Post("/v1/chat/completions", guarded([this](const httplib::Request& r) {
                return api_.chat_completions(r.body, client_gone_probe(r));
              }, true));
  http_->Post("/v1/messages", guarded([this](const httplib::Request& r) {
                return api_.messages(r.body, r.get_header_value("x-api-key"), r.get_header_value("Authorization"),
                                     client_gone_probe(r));
              }, /*authenticated=*/false));  // messages() checks x-api-key itself
  http_->Get("/v1/models", guarded([this](const httplib::Request&) { return api_.models(); }, true));
  http_->Post("/tokenize", guarded([this](const httplib::Request& r) { return api_.tokenize(r.body); }, true));
  http_->Post("/detokenize", guarded([this](const httplib::Request& r) { return api_.detokenize(r.body); }, true));
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = !draining_.load();
    send(res, HttpReply::json(Json{{"status", ok ? "ok" : "shutting_down"}}, ok ? 200 : 503));
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(engine_.metrics()), "text/plain; version=0.0.4");
  });
}

Status HttpServer::bind() {
  if (settings_.port == 0) {
    port_ = http_->bind_to_any_port(settings_.host);
    if (port_ <= 0) return make_error("cannot bind ", settings_.host, " to a free port");
  } else {
    if (!http_->bind_to_port(settings_.host, settings_.port))
      return make_error("cannot bind ", settings_.host, ":", settings_.port, " (in use, or not an address of this host)");
    port_ = settings_.port;
  }
  if (Status st = widen_listen_backlog(port_, settings_.listen_backlog); !st.ok())
    SPW_LOG_WARN("{}; bursts of new connections may be reset", st.error().message);
  return {};
}

Status HttpServer::serve() {
  if (!http_->listen_after_bind() && !draining_.load()) return make_error("the HTTP listener stopped unexpectedly");
  return {};
}

void HttpServer::shutdown(double grace_s) {
  draining_.store(true);
  engine_.drain();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (!engine_.idle() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!engine_.idle()) {
    SPW_LOG_WARN("shutdown: grace period over, cancelling the requests still running");
    engine_.cancel_all();
    for (int i = 0; i < 250 && !engine_.idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Let handlers write their final SSE events before the listener closes.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  http_->stop();
}

}  // namespace spw::server
