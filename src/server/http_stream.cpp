#include "server/http_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "server/sockets.h"

namespace spw::server {

void Connection::compact() {
  received.erase(0, n_parsed);
  n_parsed = 0;
}

bool Connection::head_complete() const { return received.find("\r\n\r\n", n_parsed) != std::string::npos; }

ConnectionStream::ConnectionStream(Connection& conn, StreamTimeouts timeouts, int stop_fd)
    : conn_(conn), timeouts_(timeouts), stop_fd_(stop_fd) {}

bool ConnectionStream::wait(short events, int timeout_ms) const {
  pollfd p[2] = {{conn_.fd, events, 0}, {stop_fd_, POLLIN, 0}};
  for (;;) {
    const int n = poll(p, 2, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || p[1].revents) return false;
    return p[0].revents != 0;
  }
}

int ConnectionStream::read_wait_ms() const {
  if (timeouts_.min_body_rate <= 0) return timeouts_.read_ms;
  using namespace std::chrono;
  const double earned_s = timeouts_.read_ms / 1000.0 + double(n_socket_bytes_) / timeouts_.min_body_rate;
  const double left_ms = (earned_s - duration<double>(steady_clock::now() - start_).count()) * 1000.0;
  return int(std::clamp(left_ms, 0.0, double(timeouts_.read_ms)));
}

bool ConnectionStream::is_readable() const {
  if (conn_.n_parsed < conn_.received.size()) return true;
  const int wait_ms = read_wait_ms();
  return wait_ms > 0 && wait(POLLIN, wait_ms);
}

bool ConnectionStream::is_writable() const { return wait(POLLOUT, timeouts_.write_ms) && !socket_closed(conn_.fd); }

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (conn_.n_parsed == conn_.received.size()) {
    conn_.received.clear();
    conn_.n_parsed = 0;
    char buf[16384];
    for (;;) {
      const ssize_t n = recv(conn_.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        conn_.received.assign(buf, size_t(n));
        n_socket_bytes_ += size_t(n);
        break;
      }
      if (n == 0) return 0;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      const int wait_ms = read_wait_ms();
      if (wait_ms <= 0 || !wait(POLLIN, wait_ms)) return -1;
    }
  }
  const size_t n = std::min(size, conn_.received.size() - conn_.n_parsed);
  std::memcpy(ptr, conn_.received.data() + conn_.n_parsed, n);
  conn_.n_parsed += n;
  return ssize_t(n);
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  for (;;) {
    const ssize_t n = send(conn_.fd, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if ((errno != EAGAIN && errno != EWOULDBLOCK) || !wait(POLLOUT, timeouts_.write_ms)) return -1;
  }
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const { peer_endpoint(conn_.fd, ip, port); }

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const { local_endpoint(conn_.fd, ip, port); }

}  // namespace spw::server
