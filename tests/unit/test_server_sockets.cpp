// The socket helpers of the HTTP server (src/server/sockets.h) against real loopback sockets:
// the listening and connection sockets are found by their endpoints, a closed peer is noticed,
// and a widened backlog lets a burst of connections complete while nothing accepts them (the
// burst that reset agents' connections behind httplib's backlog of 5).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "server/sockets.h"

namespace spw::server {
namespace {

// A descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

int port_of(int fd) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n), 0);
  return ntohs(a.sin_port);
}

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A socket listening on a free loopback port with the given backlog.
Fd listener(int backlog) {
  Fd s(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a = loopback(0);
  EXPECT_EQ(bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(listen(s.fd, backlog), 0);
  return s;
}

// Starts `n` non-blocking connects to `port` and counts those whose handshake completes within
// `wait`. Nothing accepts them, so only the connections the accept queue holds complete: the
// kernel drops the SYN of the rest, and their first retry comes a second later.
int connects_completed(int port, int n, std::chrono::milliseconds wait) {
  std::vector<Fd> clients;
  std::vector<pollfd> polls;
  for (int i = 0; i < n; ++i) {
    clients.emplace_back(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    sockaddr_in a = loopback(port);
    connect(clients.back().fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    polls.push_back({clients.back().fd, POLLOUT, 0});
  }
  auto count = [&](int timeout_ms) {
    for (auto& p : polls) p.revents = 0;
    poll(polls.data(), polls.size(), timeout_ms);
    int done = 0;
    for (const auto& p : polls) {
      int err = -1;
      socklen_t len = sizeof err;
      if ((p.revents & POLLOUT) && getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) ++done;
    }
    return done;
  };
  const auto deadline = std::chrono::steady_clock::now() + wait;
  int done = 0;
  while (done < n && std::chrono::steady_clock::now() < deadline) done = count(20);
  // Once more after the deadline: a test process descheduled during the wait still sees what completed.
  return done < n ? count(0) : done;
}

TEST(ServerSockets, ListeningSocketIsFoundByItsPort) {
  Fd l = listener(5);
  EXPECT_EQ(listening_socket(port_of(l.fd)), l.fd);
  // A connected socket on another port is not a listener.
  Fd c(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a = loopback(port_of(l.fd));
  ASSERT_EQ(connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(listening_socket(port_of(c.fd)), -1);
}

TEST(ServerSockets, ConnectionSocketIsFoundAndItsPeerClosingIsNoticed) {
  Fd l = listener(5);
  Fd c(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a = loopback(port_of(l.fd));
  ASSERT_EQ(connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  Fd server_side(accept(l.fd, nullptr, nullptr));
  ASSERT_GE(server_side.fd, 0);

  EXPECT_EQ(connection_socket("127.0.0.1", port_of(c.fd), port_of(l.fd)), server_side.fd);
  EXPECT_EQ(connection_socket("127.0.0.2", port_of(c.fd), port_of(l.fd)), -1);
  EXPECT_FALSE(socket_closed(server_side.fd));
  // Unread request bytes are not a close.
  ASSERT_EQ(write(c.fd, "x", 1), 1);
  EXPECT_FALSE(socket_closed(server_side.fd));
  close(c.fd);
  c.fd = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!socket_closed(server_side.fd) && std::chrono::steady_clock::now() < deadline) usleep(1000);
  EXPECT_TRUE(socket_closed(server_side.fd));
}

TEST(ServerSockets, WidenedBacklogHoldsABurstOfConnections) {
  constexpr int kBurst = 64;
  // The problem: with httplib's backlog, most of a burst waits a second or more for a retry.
  Fd narrow = listener(5);
  EXPECT_LT(connects_completed(port_of(narrow.fd), kBurst, std::chrono::milliseconds(300)), kBurst / 2);
  // The fix: the same listener, widened after the fact, holds the whole burst at once.
  Fd wide = listener(5);
  ASSERT_TRUE(widen_listen_backlog(port_of(wide.fd), 1024).ok());
  EXPECT_EQ(connects_completed(port_of(wide.fd), kBurst, std::chrono::milliseconds(300)), kBurst);
}

TEST(ServerSockets, WideningAPortWithoutListenerIsAnError) {
  Fd l = listener(5);
  const int port = port_of(l.fd);
  close(l.fd);
  l.fd = -1;
  const Status st = widen_listen_backlog(port, 1024);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("no listening socket"), std::string::npos);
}

}  // namespace
}  // namespace spw::server
