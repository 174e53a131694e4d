#include "server/sockets.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace spw::server {
namespace {

// The numeric address and port of a socket endpoint, as httplib records them in Request.
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

// The first open socket descriptor of this process that `matches` accepts, or -1. cpp-httplib
// 0.11.4 (Debian 12) exposes neither a handler's connection socket nor its listening socket, so
// both are found by their endpoints.
template <typename Match>
int find_socket(Match matches) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (matches(int(fd))) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// The local port of a socket, -1 when it is not an IP socket.
int local_port_of(int fd) {
  sockaddr_storage local{};
  socklen_t n = sizeof local;
  std::string ip;
  int port = -1;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n) != 0 || !endpoint(local, ip, port)) return -1;
  return port;
}

}  // namespace

int connection_socket(const std::string& remote_addr, int remote_port, int local_port) {
  return find_socket([&](int fd) {
    sockaddr_storage peer{};
    socklen_t n_peer = sizeof peer;
    std::string peer_ip;
    int peer_port = -1;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &n_peer) != 0 || !endpoint(peer, peer_ip, peer_port))
      return false;
    return peer_port == remote_port && peer_ip == remote_addr && local_port_of(fd) == local_port;
  });
}

int listening_socket(int port) {
  return find_socket([port](int fd) {
    int listening = 0;
    socklen_t n = sizeof listening;
    return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) == 0 && listening && local_port_of(fd) == port;
  });
}

Status widen_listen_backlog(int port, int backlog) {
  const int fd = listening_socket(port);
  if (fd < 0) return make_error("no listening socket on port ", port);
  if (::listen(fd, backlog) != 0) return make_error("cannot widen the listen backlog of port ", port, " to ", backlog);
  return {};
}

bool socket_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
  char c;
  return (p.revents & POLLIN) && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace spw::server
