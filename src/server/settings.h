// Every `spillway serve` setting, read once at start-up (flags, then SPILLWAY_* environment
// variables) into this struct; nothing below the CLI reads the environment (docs/STYLE.md, rule 8).
// docs/server.md documents each one.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/scheduler.h"
#include "vision/image_decode.h"

namespace spw::server {

struct ServerSettings {
  std::string model_dir;
  std::string served_model_name;  // the id /v1/models lists; default: the model directory's name
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;            // empty: no authentication
  int max_model_len = 8192;       // prompt + completion tokens of one request
  int max_tokens_limit = 4096;    // largest max_tokens accepted; also the default when none is sent
  size_t max_body_bytes = 8u << 20;
  int http_threads = 256;         // requests served at once (each streaming request holds one thread)
  int listen_backlog = 1024;      // connections the kernel queues before the accept loop takes them
  int max_connections = 4096;     // open connections at once; the excess gets 503 and is closed at once
  double header_timeout_s = 10;   // a request head (line + headers) must arrive whole within this
  double keep_alive_timeout_s = 5;  // an idle kept-alive connection is closed after this
  double read_timeout_s = 30;     // longest wait for the next piece of a request body
  // A body must keep this average rate (bytes/s) once read_timeout_s has passed: by time t after
  // its first wait it must have sent (t - read_timeout_s) · rate bytes. 0: no minimum.
  double min_body_rate = 1024;
  double write_timeout_s = 30;    // longest wait for a client to take the next piece of a response
  double shutdown_grace_s = 30;   // on SIGINT/SIGTERM: time in-flight requests get before cancellation
  vision::ImageLimits image_limits;  // images of one request: count, encoded bytes, declared pixels
  runtime::SchedulerSettings scheduler;
};

}  // namespace spw::server
