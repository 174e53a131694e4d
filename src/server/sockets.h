// The socket-level pieces cpp-httplib 0.11.4 (Debian 12) does not expose: a handler's own
// connection socket (to notice a client that has gone), and the listening socket (to widen its
// backlog). Both are found among this process's open descriptors by their endpoints.
#pragma once

#include <string>

#include "base/status.h"

namespace spw::server {

// The connected socket whose peer is remote_addr:remote_port and whose local port is local_port,
// as httplib records them in a Request; -1 when none is open.
int connection_socket(const std::string& remote_addr, int remote_port, int local_port);

// True once the peer has closed (or reset) the connection: end-of-file is readable, or an error.
// Never blocks.
bool socket_closed(int fd);

// The listening socket bound to local `port`; -1 when none is.
int listening_socket(int port);

// httplib listens with a backlog of 5, compiled into Debian's library. When dozens of clients
// connect at once (an agent fanning out, a load test), the kernel's accept queue overflows before
// the accept loop drains it, and some connections are dropped or reset (the openai SDK reports
// "Connection error"). Linux lets listen() on a listening socket change its backlog; the kernel
// caps it at net.core.somaxconn.
Status widen_listen_backlog(int port, int backlog);

}  // namespace spw::server
