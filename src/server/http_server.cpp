#include "server/http_server.h"

#include <httplib.h>
#include <strings.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <thread>

#include "base/log.h"
#include "server/connection_loop.h"
#include "server/http_stream.h"
#include "server/anthropic_response.h"
#include "server/metrics_text.h"
#include "server/sockets.h"

namespace spw::server {

// httplib's request parser and router, driven by our connection loop through process_request.
class HttpCore : public httplib::Server {
 public:
  using httplib::Server::process_request;
  // httplib stops streaming responses once its listening socket is INVALID_SOCKET (its own stop());
  // it never listens here, so it is told the loop's socket while the loop runs.
  void set_listening_socket(int fd) { svr_sock_ = fd; }
};

namespace {

// The connection the calling worker thread is serving (handlers run on that thread).
thread_local Connection* t_connection = nullptr;

// For a reply that leaves the request's body unread: the connection closes after it, and says so.
void close_after_reply(httplib::Response& res) {
  if (t_connection) t_connection->close_after_reply = true;
  res.set_header("Connection", "close");
}

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

std::string default_message(int status) {
  switch (status) {
    case 404: return "no such endpoint";
    case 405: return "method not allowed";
    case 400: return "malformed HTTP request";
    case 414: return "the request line is too long";
    default: return "HTTP error " + std::to_string(status);
  }
}

// Every path the server answers, with its methods (the Allow header of a 405).
struct Route {
  std::regex path;
  const char* allow;
  bool authenticated;
  bool anthropic = false;  // key also from x-api-key; errors in Anthropic's shape
};

const std::vector<Route>& route_table() {
  static const std::vector<Route> routes = {
      {std::regex("/v1/completions"), "POST", true},
      {std::regex("/v1/chat/completions"), "POST", true},
      {std::regex("/v1/messages"), "POST", true, true},
      {std::regex("/v1/models"), "GET, HEAD", true},
      {std::regex("/v1/models/.+"), "GET, HEAD", true},
      {std::regex("/tokenize"), "POST", true},
      {std::regex("/detokenize"), "POST", true},
      {std::regex("/health"), "GET, HEAD", false},
      {std::regex("/metrics"), "GET, HEAD", false},
  };
  return routes;
}

bool method_allowed(const Route& route, const std::string& method) {
  const std::string allow = route.allow;
  size_t at = 0;
  while (at < allow.size()) {
    const size_t end = std::min(allow.find(", ", at), allow.size());
    if (allow.compare(at, end - at, method) == 0) return true;
    at = end + 2;
  }
  return false;
}

bool is_chunked(const httplib::Request& req) {
  return strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") == 0;
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

std::string bearer_token(const std::string& authorization) {
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() || authorization[kScheme.size()] != ' ' ||
      strncasecmp(authorization.c_str(), kScheme.data(), kScheme.size()) != 0)
    return {};
  const size_t begin = authorization.find_first_not_of(' ', kScheme.size());
  if (begin == std::string::npos) return {};
  const size_t end = authorization.find_last_not_of(" \t");
  return authorization.substr(begin, end + 1 - begin);
}

HttpServer::HttpServer(OpenAiApi& api, runtime::Scheduler& scheduler, const ServerSettings& settings)
    : api_(api), scheduler_(scheduler), settings_(settings), http_(std::make_unique<HttpCore>()) {
  // Body size is enforced by our readers (chunked bodies included) and by refuse_early; httplib's
  // own check would read and discard a whole oversized body before answering.
  http_->set_payload_max_length(std::numeric_limits<size_t>::max());
  http_->set_keep_alive_max_count(10000);  // only advertised: the connection loop closes idle ones
  http_->set_keep_alive_timeout(std::max<time_t>(1, time_t(settings.keep_alive_timeout_s)));
  http_->set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    res.set_content(dump_json(error_json({res.status, default_message(res.status),
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
    close_after_reply(res);
    res.status = 500;
    res.set_content(dump_json(error_json({500, what, "server_error", "", ""})), "application/json");
  });
  // Both run once the head is parsed and before any body byte is read; the first answers
  // `Expect: 100-continue` (the 100 goes out only when the request passes).
  http_->set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    return refuse_early(req, res) ? res.status : 100;
  });
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return refuse_early(req, res) ? httplib::Server::HandlerResponse::Handled
                                  : httplib::Server::HandlerResponse::Unhandled;
  });
  routes();
}

HttpServer::~HttpServer() = default;

bool HttpServer::refuse_early(const httplib::Request& req, httplib::Response& res) {
  const auto& table = route_table();
  const auto route = std::find_if(table.begin(), table.end(), [&](const Route& r) { return std::regex_match(req.path, r.path); });
  const bool has_body = req.has_header("Content-Length") || req.has_header("Transfer-Encoding");
  ApiError refusal;
  if (route == table.end()) {
    refusal = {404, "no such endpoint: " + req.method + " " + req.path, "not_found_error", "", ""};
  } else if (!method_allowed(*route, req.method)) {
    res.set_header("Allow", route->allow);
    refusal = {405, req.method + " is not allowed on " + req.path + "; use " + route->allow, "invalid_request_error",
               "", "method_not_allowed"};
  } else if (route->authenticated && !settings_.api_key.empty() &&
             !api_key_matches(settings_.api_key, bearer_token(req.get_header_value("Authorization"))) &&
             !(route->anthropic && api_key_matches(settings_.api_key, req.get_header_value("x-api-key")))) {
    refusal = {401, "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.", "invalid_request_error", "",
               "invalid_api_key"};
  } else if (route->authenticated && draining_.load()) {
    refusal = {503, "the server is shutting down", "server_unavailable", "", "shutting_down"};
  } else if (req.method != "POST") {
    if (!has_body) return false;
    refusal = bad_request(req.method + " " + req.path + " takes no request body");
  } else if (!is_chunked(req) && !req.has_header("Content-Length")) {
    refusal = {411, "send the request body with a Content-Length or as Transfer-Encoding: chunked",
               "invalid_request_error", "", ""};
  } else if (req.get_header_value("Content-Type").rfind("multipart/", 0) == 0) {
    refusal = {415, "send the request body as application/json", "invalid_request_error", "", ""};
  } else if (!is_chunked(req)) {
    const std::string declared = req.get_header_value("Content-Length");
    char* end = nullptr;
    const unsigned long long n = std::strtoull(declared.c_str(), &end, 10);
    if (declared.empty() || *end != '\0' || declared[0] == '-') {
      refusal = bad_request("Content-Length '" + declared + "' is not a byte count");
    } else if (n > settings_.max_body_bytes) {
      refusal = {413, "the request body is larger than " + std::to_string(settings_.max_body_bytes) +
                          " bytes (--max-body-bytes)", "invalid_request_error", "", "request_too_large"};
    } else {
      return false;
    }
  } else {
    return false;
  }
  if (route != table.end() && route->anthropic) {
    if (refusal.status == 401)
      refusal.message = "invalid x-api-key: send this server's --api-key as the 'x-api-key' header";
    send(res, anthropic_error_reply(refusal));
  } else {
    send(res, HttpReply::error(refusal));
  }
  if (has_body) close_after_reply(res);
  return true;
}

void HttpServer::routes() {
  // A handler that reads the whole body (at most --max-body-bytes, checked as it arrives) and
  // passes it to an OpenAI-layer call; a last-resort catch keeps handlers from throwing.
  auto with_body = [this](auto fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      std::string body;
      bool too_large = false;
      const bool complete = read([&](const char* data, size_t n) {
        if (n > settings_.max_body_bytes - body.size()) return !(too_large = true);
        body.append(data, n);
        return true;
      });
      if (!complete) {
        close_after_reply(res);
        return send(res, HttpReply::error(
                             too_large ? ApiError{413, "the request body is larger than " +
                                                           std::to_string(settings_.max_body_bytes) +
                                                           " bytes (--max-body-bytes)",
                                                  "invalid_request_error", "", "request_too_large"}
                                       : bad_request("the request body ended early or its chunked encoding is malformed")));
      }
      const int fd = t_connection ? t_connection->fd : -1;
      const ClientGone gone = [fd] { return fd >= 0 && socket_closed(fd); };
      try {
        send(res, fn(body, gone));
      } catch (const std::exception& e) {
        SPW_LOG_ERROR("handler failed: {}", e.what());
        send(res, HttpReply::error({500, e.what(), "server_error", "", ""}));
      }
    };
  };
  http_->Post("/v1/completions", with_body([this](const std::string& body, const ClientGone& gone) {
                return api_.completions(body, gone);
              }));
  http_->Post("/v1/chat/completions", with_body([this](const std::string& body, const ClientGone& gone) {
                return api_.chat_completions(body, gone);
              }));
  // Its key may come as x-api-key (Anthropic's header); refuse_early checked it before the body.
  http_->Post("/v1/messages", with_body([this](const std::string& body, const ClientGone& gone) {
                return api_.messages(body, gone);
              }));
  http_->Post("/tokenize", with_body([this](const std::string& body, const ClientGone&) { return api_.tokenize(body); }));
  http_->Post("/detokenize",
              with_body([this](const std::string& body, const ClientGone&) { return api_.detokenize(body); }));
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { send(res, api_.models()); });
  http_->Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    send(res, api_.model(req.matches[1].str()));
  });
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = !draining_.load();
    send(res, HttpReply::json(Json{{"status", ok ? "ok" : "shutting_down"}}, ok ? 200 : 503));
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(scheduler_.metrics()), "text/plain; version=0.0.4");
  });
}

bool HttpServer::serve_connection(Connection& conn) {
  const StreamTimeouts timeouts{int(settings_.read_timeout_s * 1000), int(settings_.write_timeout_s * 1000),
                                settings_.min_body_rate};
  do {
    ConnectionStream stream(conn, timeouts, loop_->stop_fd());
    conn.close_after_reply = false;
    bool client_closes = false;
    t_connection = &conn;
    const bool answered = http_->process_request(stream, draining_.load(), client_closes, nullptr);
    t_connection = nullptr;
    if (!answered || client_closes || conn.close_after_reply || draining_.load()) return false;
  } while (conn.head_complete());
  return true;
}

Status HttpServer::bind() {
  auto fd = listen_tcp(settings_.host, settings_.port, settings_.listen_backlog);
  if (!fd.ok()) return fd.error();
  std::string ip;
  local_endpoint(*fd, ip, port_);
  ConnectionLimits limits;
  limits.threads = std::max(settings_.http_threads, 4);
  limits.max_connections = settings_.max_connections;
  limits.header_timeout = std::chrono::milliseconds(int64_t(settings_.header_timeout_s * 1000));
  limits.keep_alive_timeout = std::chrono::milliseconds(int64_t(settings_.keep_alive_timeout_s * 1000));
  http_->set_listening_socket(*fd);
  loop_ = std::make_unique<ConnectionLoop>(*fd, limits, [this](Connection& conn) { return serve_connection(conn); });
  return {};
}

Status HttpServer::serve() {
  if (!loop_) return make_error("serve() before bind()");
  loop_->run();
  return {};
}

void HttpServer::shutdown(double grace_s) {
  draining_.store(true);
  scheduler_.drain();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (!scheduler_.idle() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!scheduler_.idle()) {
    SPW_LOG_WARN("shutdown: grace period over, cancelling the requests still running");
    scheduler_.cancel_all();
    for (int i = 0; i < 250 && !scheduler_.idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Let handlers write their final SSE events before the connections close.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  http_->set_listening_socket(INVALID_SOCKET);
  if (loop_) loop_->stop();
}

}  // namespace spw::server
