// POSIX TCP for the expert-parallel nodes (node_rendezvous.h, tcp_communicator.h): non-blocking
// sockets whose every send and receive waits at most until a deadline, and whole frames of
// node_wire.h. IPv4 only (a host name resolves to its first IPv4 address).
#pragma once

#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/parallel/node_wire.h"

namespace loom {

// An owned file descriptor: closed once, when destroyed.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
};
// "HOST:PORT" (HOST a name or IPv4 address, PORT in [1, 65535]); InvalidArgument naming `flag`.
absl::StatusOr<HostPort> parse_host_port(const std::string& s, const char* flag);

// Listens on every IPv4 interface at `port` (0: a free one, see local_port).
absl::StatusOr<Socket> listen_tcp(int port);
int local_port(const Socket& s);
// Accepts one connection, waiting until `deadline`; DeadlineExceeded if none came.
absl::StatusOr<Socket> accept_tcp(const Socket& listener, absl::Time deadline);
// Connects to host:port, retrying (the listener may not be up yet) until `deadline`.
absl::StatusOr<Socket> connect_tcp(const HostPort& to, absl::Time deadline);
// "a.b.c.d:port" of the connection's far end.
std::string peer_address(const Socket& s);

// Sends `parts` back to back, waiting at most until `deadline` for room.
absl::Status send_bytes(const Socket& s, std::span<const std::span<const char>> parts,
                        absl::Time deadline);
// One frame: header and payload parts.
absl::Status send_frame(const Socket& s, NodeFrame type,
                        std::span<const std::span<const char>> payload, absl::Time deadline);
absl::Status send_frame(const Socket& s, NodeFrame type, const std::string& payload,
                        absl::Time deadline);

struct ReceivedFrame {
  NodeFrame type = NodeFrame::kHeartbeat;
  std::string payload;
};
// Reads one whole frame by `deadline`. Unavailable when the peer closed the connection (before a
// frame began: "closed"; within one: "closed mid-frame") or it failed; DeadlineExceeded.
absl::StatusOr<ReceivedFrame> recv_frame(const Socket& s, absl::Time deadline);
// Whether bytes (or the end of the stream) can be read from any of `sockets` within `wait`:
// ready[i] set for each. Invalid sockets are skipped.
absl::Status poll_readable(std::span<const int> fds, absl::Duration wait, std::span<bool> ready);

}  // namespace loom
