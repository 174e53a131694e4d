#include "server/connection_loop.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "server/api_error.h"

namespace spw::server {
namespace {

using Clock = std::chrono::steady_clock;

// A complete error reply written by the loop itself, without a worker; best effort (one
// non-blocking send), the connection closes right after.
void send_error_and_close(int fd, int status, const char* reason, const std::string& message) {
  const std::string body = dump_json(error_json({status, message, "server_unavailable", "", ""}));
  const std::string reply = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                            "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] ssize_t n = send(fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  close(fd);
}

}  // namespace

ConnectionLoop::ConnectionLoop(int listen_fd, ConnectionLimits limits, Serve serve)
    : listen_fd_(listen_fd),
      stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      limits_(limits),
      serve_(std::move(serve)) {}

ConnectionLoop::~ConnectionLoop() {
  close(listen_fd_);
  close(stop_fd_);
  close(wake_fd_);
}

void ConnectionLoop::stop() {
  stopping_.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(stop_fd_, &one, sizeof one);
}

void ConnectionLoop::close_connection(Connection& conn) {
  if (conn.fd >= 0) close(conn.fd);
  conn.fd = -1;
  n_open_.fetch_sub(1);
}

void ConnectionLoop::accept_new(Clock::time_point now) {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: drained; EMFILE and the like: retried on the next wake-up
    if (n_open_.load() >= limits_.max_connections) {
      send_error_and_close(fd, 503, "Service Unavailable",
                           "the server has " + std::to_string(limits_.max_connections) +
                               " connections open (--http-max-connections); retry later");
      continue;
    }
    n_open_.fetch_add(1);
    auto conn = std::make_shared<Connection>();
    conn->fd = fd;
    conn->head_started = true;
    conn->deadline = now + limits_.header_timeout;
    waiting_.push_back(std::move(conn));
  }
}

bool ConnectionLoop::receive(Connection& conn, Clock::time_point now) {
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(conn.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (!conn.head_started) {
        conn.head_started = true;
        conn.deadline = now + limits_.header_timeout;
      }
      conn.received.append(buf, size_t(n));
      if (conn.head_complete()) return true;
      if (conn.received.size() > kMaxHeadBytes) {
        send_error_and_close(conn.fd, 431, "Request Header Fields Too Large",
                             "the request line and headers are larger than " + std::to_string(kMaxHeadBytes) + " bytes");
        conn.fd = -1;
        n_open_.fetch_sub(1);
        return false;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    close_connection(conn);
    return false;
  }
}

void ConnectionLoop::dispatch(ConnectionPtr conn) {
  workers_->enqueue([this, conn] {
    bool keep = !stopping_.load() && serve_(*conn);
    if (!keep || stopping_.load()) return close_connection(*conn);
    conn->compact();
    conn->head_started = !conn->received.empty();
    {
      std::lock_guard<std::mutex> lock(returned_mutex_);
      returned_.push_back(conn);
    }
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  });
}

void ConnectionLoop::take_returned(Clock::time_point now) {
  uint64_t count = 0;
  [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof count);
  std::vector<ConnectionPtr> back;
  {
    std::lock_guard<std::mutex> lock(returned_mutex_);
    back.swap(returned_);
  }
  for (auto& conn : back) {
    conn->deadline = now + (conn->head_started ? limits_.header_timeout : limits_.keep_alive_timeout);
    waiting_.push_back(std::move(conn));
  }
}

void ConnectionLoop::run() {
  workers_ = std::make_unique<httplib::ThreadPool>(size_t(std::max(limits_.threads, 1)));
  std::vector<pollfd> polls;
  while (!stopping_.load()) {
    polls.clear();
    polls.push_back({listen_fd_, POLLIN, 0});
    polls.push_back({wake_fd_, POLLIN, 0});
    polls.push_back({stop_fd_, POLLIN, 0});
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);
    for (const auto& conn : waiting_) {
      polls.push_back({conn->fd, POLLIN, 0});
      next = std::min(next, conn->deadline);
    }
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    if (poll(polls.data(), polls.size(), int(std::max<int64_t>(wait_ms, 0))) < 0 && errno != EINTR) break;
    const Clock::time_point now = Clock::now();
    if (polls[2].revents || stopping_.load()) break;

    // The connections polled are waiting_[0 .. n_polled); new ones are appended after them.
    const size_t n_polled = polls.size() - 3;
    std::vector<ConnectionPtr> still_waiting;
    still_waiting.reserve(waiting_.size());
    for (size_t i = 0; i < n_polled; ++i) {
      ConnectionPtr& conn = waiting_[i];
      if (polls[3 + i].revents && !receive(*conn, now)) continue;
      if (conn->head_started && conn->head_complete()) {
        dispatch(std::move(conn));
      } else if (now >= conn->deadline) {
        if (conn->head_started)
          send_error_and_close(conn->fd, 408, "Request Timeout",
                               "the request head did not arrive within the header timeout (--http-header-timeout)");
        else
          close(conn->fd);
        conn->fd = -1;
        n_open_.fetch_sub(1);
      } else {
        still_waiting.push_back(std::move(conn));
      }
    }
    waiting_.swap(still_waiting);
    if (polls[1].revents) take_returned(now);
    if (polls[0].revents) accept_new(now);
  }
  for (auto& conn : waiting_) close_connection(*conn);
  waiting_.clear();
  workers_->shutdown();
  {
    std::lock_guard<std::mutex> lock(returned_mutex_);
    for (auto& conn : returned_) close_connection(*conn);
    returned_.clear();
  }
}

}  // namespace spw::server
