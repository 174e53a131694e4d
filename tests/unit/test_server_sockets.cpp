// The socket helpers of the HTTP server (src/server/sockets.h) against real loopback sockets:
// a closed peer is noticed, listen_tcp's backlog lets a burst of connections complete while nothing
// accepts them (the burst that reset agents' connections behind httplib's backlog of 5), and a
// port another listener holds is refused (no SO_REUSEPORT).
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

TEST(ServerSockets, PeerClosingIsNoticed) {
  Fd l = listener(5);
  Fd c(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a = loopback(port_of(l.fd));
  ASSERT_EQ(connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  Fd server_side(accept(l.fd, nullptr, nullptr));
  ASSERT_GE(server_side.fd, 0);

  std::string ip;
  int port = 0;
  ASSERT_TRUE(peer_endpoint(server_side.fd, ip, port));
  EXPECT_EQ(ip, "127.0.0.1");
  EXPECT_EQ(port, port_of(c.fd));
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

TEST(ServerSockets, ListenerBacklogHoldsABurstOfConnections) {
  constexpr int kBurst = 64;
  // The problem: with httplib's backlog of 5, most of a burst waits a second or more for a retry.
  Fd narrow = listener(5);
  EXPECT_LT(connects_completed(port_of(narrow.fd), kBurst, std::chrono::milliseconds(300)), kBurst / 2);
  // listen_tcp's backlog holds the whole burst at once.
  auto wide = listen_tcp("127.0.0.1", 0, 1024);
  ASSERT_TRUE(wide.ok()) << wide.error().message;
  Fd owned(*wide);
  EXPECT_EQ(connects_completed(port_of(owned.fd), kBurst, std::chrono::milliseconds(300)), kBurst);
}

TEST(ServerSockets, APortInUseIsAnError) {
  auto first = listen_tcp("127.0.0.1", 0, 16);
  ASSERT_TRUE(first.ok()) << first.error().message;
  Fd owned(*first);
  const auto second = listen_tcp("127.0.0.1", port_of(owned.fd), 16);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("in use"), std::string::npos) << second.error().message;
}

}  // namespace
}  // namespace spw::server
