#include "engine/parallel/node_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

absl::Status errno_status(const std::string& what) {
  const int e = errno;
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(e)));
}

// Milliseconds until `deadline` for poll(), at least 0, at most a day.
int poll_ms(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 86400000));
}

absl::Status make_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return errno_status("fcntl");
  return absl::OkStatus();
}

// Collectives are many small messages: send each at once (no Nagle delay).
void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits until fd is ready for `events` or the deadline passes.
absl::Status wait_fd(int fd, short events, absl::Time deadline, const char* what) {
  while (true) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = poll(&p, 1, poll_ms(deadline));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return errno_status(absl::StrCat("poll (", what, ")"));
    if (n == 0 && absl::Now() >= deadline)
      return absl::DeadlineExceededError(absl::StrCat("timed out ", what));
  }
}

absl::Status recv_exact(int fd, char* out, size_t n, absl::Time deadline, bool* began) {
  size_t got = 0;
  while (got < n) {
    const ssize_t k = recv(fd, out + got, n - got, 0);
    if (k > 0) {
      got += static_cast<size_t>(k);
      *began = true;
      continue;
    }
    if (k == 0)
      return absl::UnavailableError(*began ? "connection closed mid-frame" : "connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("recv");
    if (absl::Status st = wait_fd(fd, POLLIN, deadline, "receiving"); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<HostPort> parse_host_port(const std::string& s, const char* flag) {
  const size_t colon = s.rfind(':');
  HostPort hp;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(s.substr(colon + 1), &hp.port) || hp.port < 1 || hp.port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", s,
                     ": expected HOST:PORT (an IPv4 address or name, a port "
                     "in [1, 65535])"));
  hp.host = s.substr(0, colon);
  return hp;
}

absl::StatusOr<Socket> listen_tcp(int port) {
  Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return errno_status("socket");
  const int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) < 0)
    return errno_status(absl::StrCat("binding port ", port));
  if (listen(s.fd(), 128) < 0) return errno_status("listen");
  if (absl::Status st = make_nonblocking(s.fd()); !st.ok()) return st;
  return s;
}

int local_port(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) < 0) return -1;
  return ntohs(a.sin_port);
}

absl::StatusOr<Socket> accept_tcp(const Socket& listener, absl::Time deadline) {
  while (true) {
    Socket c(accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.valid()) {
      if (absl::Status st = make_nonblocking(c.fd()); !st.ok()) return st;
      set_nodelay(c.fd());
      return c;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("accept");
    if (absl::Status st = wait_fd(listener.fd(), POLLIN, deadline, "waiting for nodes to connect");
        !st.ok())
      return st;
  }
}

absl::StatusOr<Socket> connect_tcp(const HostPort& to, absl::Time deadline) {
  std::string last = "no attempt";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = getaddrinfo(to.host.c_str(), std::to_string(to.port).c_str(), &hints, &res);
    if (gai != 0) {
      last = absl::StrCat("resolving ", to.host, ": ", gai_strerror(gai));
    } else {
      Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      const int rc = s.valid() ? connect(s.fd(), res->ai_addr, res->ai_addrlen) : -1;
      const int e = errno;
      freeaddrinfo(res);
      if (rc == 0) {
        if (absl::Status st = make_nonblocking(s.fd()); !st.ok()) return st;
        set_nodelay(s.fd());
        return s;
      }
      last = std::strerror(e);
    }
    // The coordinator may still be starting (or resolving may need its DNS entry): retry.
    if (absl::Now() + absl::Milliseconds(200) >= deadline)
      return absl::DeadlineExceededError(
          absl::StrCat("could not connect to the coordinator ", to.host, ":", to.port,
                       " before the timeout (last attempt: ", last, ")"));
    absl::SleepFor(absl::Milliseconds(200));
  }
}

std::string peer_address(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getpeername(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) < 0) return "?";
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return absl::StrCat(buf, ":", ntohs(a.sin_port));
}

absl::Status send_bytes(const Socket& s, std::span<const std::span<const char>> parts,
                        absl::Time deadline) {
  for (std::span<const char> part : parts) {
    size_t sent = 0;
    while (sent < part.size()) {
      const ssize_t k = send(s.fd(), part.data() + sent, part.size() - sent, MSG_NOSIGNAL);
      if (k > 0) {
        sent += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("send");
      if (absl::Status st = wait_fd(s.fd(), POLLOUT, deadline, "sending"); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status send_frame(const Socket& s, NodeFrame type,
                        std::span<const std::span<const char>> payload, absl::Time deadline) {
  uint64_t bytes = 0;
  for (std::span<const char> p : payload) bytes += p.size();
  const std::string header = encode_frame_header(type, bytes);
  std::vector<std::span<const char>> parts{std::span<const char>(header)};
  parts.insert(parts.end(), payload.begin(), payload.end());
  return send_bytes(s, parts, deadline);
}

absl::Status send_frame(const Socket& s, NodeFrame type, const std::string& payload,
                        absl::Time deadline) {
  const std::span<const char> part(payload);
  return send_frame(s, type, std::span<const std::span<const char>>(&part, 1), deadline);
}

absl::StatusOr<ReceivedFrame> recv_frame(const Socket& s, absl::Time deadline) {
  char header[kNodeFrameHeaderBytes];
  bool began = false;
  if (absl::Status st = recv_exact(s.fd(), header, sizeof(header), deadline, &began); !st.ok())
    return st;
  absl::StatusOr<NodeFrameHeader> h = decode_frame_header(header);
  if (!h.ok()) return h.status();
  ReceivedFrame f;
  f.type = h->type;
  f.payload.resize(h->payload_bytes);
  if (absl::Status st = recv_exact(s.fd(), f.payload.data(), f.payload.size(), deadline, &began);
      !st.ok())
    return st;
  return f;
}

absl::Status poll_readable(std::span<const int> fds, absl::Duration wait, std::span<bool> ready) {
  std::vector<pollfd> p;
  for (int fd : fds) p.push_back({.fd = fd, .events = POLLIN, .revents = 0});
  const int n = poll(p.data(), p.size(), static_cast<int>(absl::ToInt64Milliseconds(wait)));
  if (n < 0 && errno != EINTR) return errno_status("poll");
  for (size_t i = 0; i < p.size(); ++i)
    ready[i] = fds[i] >= 0 && (p[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  return absl::OkStatus();
}

}  // namespace loom
