// The HTTP transport's accept loop, in place of httplib's (which gives each connection a thread
// from the moment it is accepted, so a few hundred clients sending their headers slowly starve
// everyone, and whose threads cannot be woken at shutdown).
//
// One thread accepts connections and collects each request head without blocking; only a
// connection whose head has arrived whole is handed to a worker thread (`threads` of them), and a
// kept-alive connection comes back to the loop between requests. So slow or idle clients cost a
// descriptor and a small buffer, never a worker, and /health keeps answering under them.
// Limits: at most `max_connections` open at once (the excess gets 503 and is closed at once,
// before anything is read); a head must arrive whole within `header_timeout` of the connection's
// first byte or accept (408), and within kMaxHeadBytes (431); an idle connection closes after
// `keep_alive_timeout`. There is no per-client cap: a proxy in front of the server speaks for
// every user from one address.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "server/http_stream.h"

namespace spw::server {

struct ConnectionLimits {
  int threads = 256;
  int max_connections = 4096;
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds keep_alive_timeout{5000};
};

class ConnectionLoop {
 public:
  // A request head larger than this gets 431.
  static constexpr size_t kMaxHeadBytes = 64 << 10;

  // Serves the requests whose heads `conn` holds, on a worker thread; returns true to keep the
  // connection open for the next request.
  using Serve = std::function<bool(Connection& conn)>;

  // Takes ownership of the listening socket `listen_fd`.
  ConnectionLoop(int listen_fd, ConnectionLimits limits, Serve serve);
  ~ConnectionLoop();

  // Accepts and dispatches until stop(); returns once every worker has finished.
  void run();
  // Ends run(): every wait of every connection stream ends (see stop_fd()). Thread-safe.
  void stop();
  // Readable once stop() was called; connection streams wait on it.
  int stop_fd() const { return stop_fd_; }

 private:
  using ConnectionPtr = std::shared_ptr<Connection>;
  void accept_new(std::chrono::steady_clock::time_point now);
  // Reads what `conn` has sent; false when the connection is finished (closed or refused).
  bool receive(Connection& conn, std::chrono::steady_clock::time_point now);
  void dispatch(ConnectionPtr conn);
  void close_connection(Connection& conn);
  void take_returned(std::chrono::steady_clock::time_point now);

  int listen_fd_;
  int stop_fd_;
  int wake_fd_;
  ConnectionLimits limits_;
  Serve serve_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> n_open_{0};
  std::vector<ConnectionPtr> waiting_;  // the loop's own: heads being collected, idle keep-alives
  std::mutex returned_mutex_;
  std::vector<ConnectionPtr> returned_;  // kept-alive connections workers hand back
  std::unique_ptr<httplib::ThreadPool> workers_;
};

}  // namespace spw::server
