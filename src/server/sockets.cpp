#include "server/sockets.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spw::server {
namespace {

bool endpoint(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    port = ntohs(v4.sin_port);
    return inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof buf) && (ip = buf, true);
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    port = ntohs(v6.sin6_port);
    return inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof buf) && (ip = buf, true);
  }
  return false;
}

}  // namespace

Result<int> listen_tcp(const std::string& host, int port, int backlog) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return make_error("cannot listen on ", host, ":", port, ": ", gai_strerror(rc));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, backlog) != 0) {
      why = errno == EADDRINUSE ? "the port is in use (is another server running on it?)" : std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return make_error("cannot listen on ", host, ":", port, ": ", why);
  return fd;
}

bool local_endpoint(int fd, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0 && endpoint(a, ip, port);
}

bool peer_endpoint(int fd, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  return getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0 && endpoint(a, ip, port);
}

bool socket_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  char c;
  return (p.revents & POLLIN) && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace spw::server
