// One accepted HTTP connection and the httplib::Stream that httplib's request parser reads and
// writes it through. The connection loop (connection_loop.h) collects each request head before a
// worker thread sees the connection; the stream hands those bytes over first, then reads the
// socket itself. Every wait (read, write) has a timeout and also ends at once when the server
// stops, so no client (a half-sent body, a reader that never reads) holds a thread past shutdown.
#pragma once

#include <httplib.h>

#include <chrono>
#include <string>

namespace spw::server {

struct Connection {
  int fd = -1;
  std::string received;  // bytes read from the socket and not yet parsed (a head, pipelined requests)
  size_t n_parsed = 0;   // the first n_parsed bytes of `received` are consumed
  // Set while serving a request whose body stays unread (an early 401/404/405/413/503): the
  // remaining bytes cannot be told apart from a next request, so the connection closes after the reply.
  bool close_after_reply = false;
  std::chrono::steady_clock::time_point deadline;  // the connection loop's: head or keep-alive
  bool head_started = false;                       // a byte of the next request has arrived

  // Drops the consumed prefix of `received`.
  void compact();
  // True when `received` (past the consumed prefix) holds a whole request head.
  bool head_complete() const;
};

struct StreamTimeouts {
  int read_ms = 30000;   // longest wait for the next bytes of a body
  int write_ms = 30000;  // longest wait for the client to take more of a response
  // Bytes/s a body must average: reading ends (as a timeout) once read_ms plus the time the bytes
  // read so far earn at this rate have passed since the stream began. 0: no minimum.
  double min_body_rate = 0;
};

class ConnectionStream final : public httplib::Stream {
 public:
  // `stop_fd` becomes readable (and stays so) when the server stops.
  ConnectionStream(Connection& conn, StreamTimeouts timeouts, int stop_fd);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return conn_.fd; }

 private:
  // Waits until the socket has `events` or `timeout_ms` passes or the server stops; true for the first.
  bool wait(short events, int timeout_ms) const;
  // The wait for more body bytes: read_ms, cut short by the minimum body rate (0: none left).
  int read_wait_ms() const;

  Connection& conn_;
  StreamTimeouts timeouts_;
  int stop_fd_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  size_t n_socket_bytes_ = 0;  // read from the socket by this stream (the head came before)
};

}  // namespace spw::server
