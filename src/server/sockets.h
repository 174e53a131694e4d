// The socket-level pieces of the HTTP transport that cpp-httplib 0.11.4 (Debian 12) does not give
// us the control of: the listening socket (its options and backlog) and endpoint look-ups.
#pragma once

#include <string>

#include "base/status.h"

namespace spw::server {

// A non-blocking TCP socket listening on host:port (port 0: a free port) with `backlog` queued
// connections (the kernel caps it at net.core.somaxconn). SO_REUSEADDR only: a restart may bind
// while old connections sit in TIME_WAIT, but a port another process listens on is an error
// ("in use"). httplib's own sockets set SO_REUSEPORT, which lets a second server bind the same
// port and take a share of its connections.
Result<int> listen_tcp(const std::string& host, int port, int backlog);

// The numeric address and port of a socket's local or remote end; false when it is not an IP socket.
bool local_endpoint(int fd, std::string& ip, int& port);
bool peer_endpoint(int fd, std::string& ip, int& port);

// True once the peer has closed (or reset) the connection: end-of-file is readable, or an error.
// Never blocks.
bool socket_closed(int fd);

}  // namespace spw::server
