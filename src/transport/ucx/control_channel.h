// Baton's own handshake socket: a nonblocking TCP listener and connections
// that carry control frames (control_wire.h), driven by the transport's
// poll() on the engine loop. No threads, no blocking calls. Private to
// transport/ucx.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "baton/common/status.h"
#include "transport/ucx/control_wire.h"
#include "baton/common/socket_address.h"

namespace baton::transport::ucx {

// The control connection's TCP keepalive: probes after this many idle
// seconds, this far apart, this many unanswered before it fails (28 s for
// a peer that vanished). Many probes close together rather than a few far
// apart: on a link that drops 30% of packets each way half the probes go
// unanswered, and 3 of them misjudged a live peer dead in 13% of idle
// spells (a lossy-link test failed so in CI); 9 do in 0.2%.
inline constexpr int kKeepaliveIdleS = 10;
inline constexpr int kKeepaliveIntervalS = 2;
inline constexpr int kKeepaliveProbes = 9;

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// File descriptors this process may still open: its limit less those open
// (a walk of /proc/self/fd: for a handshake, not per turn). UCX aborts when
// it runs out of them, so a listener and an initiator check before lanes.
[[nodiscard]] std::int64_t free_fds();

// A nonblocking eventfd, the way a thread wakes another's poll or epoll:
// notify() makes it readable, reset() drains it.
[[nodiscard]] Result<UniqueFd> make_eventfd();
void notify_eventfd(int fd);
void reset_eventfd(int fd);

// One TCP connection carrying frames each way. Sends are queued and written
// as the socket takes them.
class ControlConnection {
 public:
  // Starts a nonblocking connect; wants_write() until it finished.
  [[nodiscard]] static Result<std::unique_ptr<ControlConnection>> dial(const SocketAddress& to);
  ControlConnection(UniqueFd fd, std::string remote, bool connecting);
  ~ControlConnection();
  ControlConnection(const ControlConnection&) = delete;
  ControlConnection& operator=(const ControlConnection&) = delete;

  [[nodiscard]] int fd() const { return fd_.get(); }
  // The other end's address ("10.0.0.2:51234"), for logs.
  [[nodiscard]] const std::string& remote() const { return remote_; }

  // Reads what the socket holds, keeping at most `max_buffered` bytes
  // unframed; unavailable when the peer closed or the socket failed.
  Status receive(std::size_t max_buffered);
  // The next whole frame received, if any (take_frame's errors). Frames
  // are taken from a read offset, the buffer compacted by receive() when
  // the taken part is half of it:
  // erased one by one, 16 MiB of 13-byte frames cost minutes (quadratic).
  [[nodiscard]] Result<std::optional<Frame>> next(std::uint32_t max_body);
  // Bytes received and not yet taken as frames.
  [[nodiscard]] std::size_t buffered() const { return in_.size() - in_at_; }
  // Whether a whole frame waits to be taken (a caller that takes a bounded
  // number a turn comes back for it without new bytes).
  [[nodiscard]] bool frame_waiting() const {
    return whole_frame(std::span<const std::uint8_t>(in_).subspan(in_at_));
  }
  // Queues a frame; refused (resource_exhausted) when more than kMaxQueuedBytes
  // wait for a peer that does not read.
  Status send(ControlKind kind, std::span<const std::uint8_t> body);
  // Finishes a connect and writes what is queued; unavailable on failure.
  Status flush();
  [[nodiscard]] bool wants_write() const { return connecting_ || !out_.empty(); }
  // Bytes queued and not yet taken by the socket.
  [[nodiscard]] std::size_t queued() const { return out_.size() - out_at_; }
  // Keeps *total counting queued() (added as frames are queued, taken back
  // as the socket takes them or when the connection goes): a listener
  // bounds all its connections' queues without summing them each time.
  void count_queued_in(std::size_t* total);
  // Forgets what is queued and not yet taken (a peer that reads nothing).
  void drop_queued();
  // Whether a connect has not completed yet (no TCP connection so far).
  [[nodiscard]] bool connecting() const { return connecting_; }

  static constexpr std::size_t kMaxQueuedBytes = 64U << 20;

 private:
  UniqueFd fd_;
  std::string remote_;
  bool connecting_ = false;
  std::vector<std::uint8_t> in_;
  std::size_t in_at_ = 0;  // in_[0, in_at_) were taken as frames
  std::vector<std::uint8_t> out_;
  std::size_t out_at_ = 0;
  std::size_t* queued_total_ = nullptr;  // count_queued_in
};

class ControlListener {
 public:
  // Binds and listens (SO_REUSEADDR, so a restarted engine gets its port back).
  [[nodiscard]] static Result<ControlListener> open(const SocketAddress& at);
  [[nodiscard]] int fd() const { return fd_.get(); }
  // The bound address ("127.0.0.1:41234").
  [[nodiscard]] const std::string& address() const { return address_; }
  // A connection waiting to be accepted, or null when none is. Out of file
  // descriptors, one waiting is closed unserved (through a descriptor kept
  // spare for it): left in the backlog, it kept the level-triggered
  // listener readable, and the loop spun on it, a warning each turn.
  [[nodiscard]] std::unique_ptr<ControlConnection> accept();
  // Connections closed unserved for want of a descriptor.
  [[nodiscard]] std::uint64_t dropped() const { return dropped_; }

 private:
  UniqueFd fd_;
  UniqueFd spare_;  // /dev/null, given up to accept one when none is left
  std::string address_;
  std::uint64_t dropped_ = 0;
  std::uint64_t dropped_warned_ = 0;
  std::chrono::steady_clock::time_point warned_at_{};
};

// The epoll set behind the transport's event_fd(): the UCP worker's fd and
// every control socket, level-triggered.
class Poller {
 public:
  [[nodiscard]] static Result<Poller> create();
  [[nodiscard]] int fd() const { return fd_.get(); }
  void watch(int fd, bool write);
  void change(int fd, bool write);
  void forget(int fd);
  // The fds ready now (no waiting), into `out`; false when there may be
  // more than it holds (then treat every fd as ready).
  bool ready(std::vector<int>& out) const;

 private:
  UniqueFd fd_;
};

}  // namespace baton::transport::ucx
