#include "transport/ucx/control_channel.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "baton/common/log.h"

namespace baton::transport::ucx {
namespace {

constexpr std::size_t kReadChunk = 64U << 10;

// Frames go out at once (TCP_NODELAY), and a peer that vanished without a
// word (its host down, a partition: no FIN, no RST) is found by the
// kernel's keepalive: an idle connection is probed after 10 s, every 2 s,
// and fails after 9 probes go unanswered (ETIMEDOUT on the next read), so
// the path or the session closes. Without it a listener kept the session
// of an initiator gone behind a partition for good — one of its
// max_sessions — and an idle initiator never learned its holder was gone.
void set_socket_options(int fd) {
  const int one = 1, idle_s = kKeepaliveIdleS, interval_s = kKeepaliveIntervalS, probes = kKeepaliveProbes;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::int64_t free_fds() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return INT64_MAX;
  std::error_code error;
  std::int64_t open = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end; it.increment(error)) {
    ++open;
  }
  if (error) return 0;  // no fd to read the directory with: none left
  return static_cast<std::int64_t>(limit.rlim_cur) - open;
}

Result<UniqueFd> make_eventfd() {
  UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (fd.get() < 0) return std::unexpected(Status::unavailable("eventfd: {}", std::strerror(errno)));
  return fd;
}

void notify_eventfd(int fd) {
  const std::uint64_t one = 1;
  (void)!::write(fd, &one, sizeof one);
}

void reset_eventfd(int fd) {
  std::uint64_t n = 0;
  (void)!::read(fd, &n, sizeof n);
}

Result<std::unique_ptr<ControlConnection>> ControlConnection::dial(const SocketAddress& to) {
  UniqueFd fd(::socket(to.get()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return std::unexpected(Status::unavailable("control channel: socket: {}", std::strerror(errno)));
  set_socket_options(fd.get());
  const std::string remote = format_socket_address(to.get());
  bool connecting = false;
  if (::connect(fd.get(), to.get(), to.length) != 0) {
    if (errno != EINPROGRESS) {
      return std::unexpected(Status::unavailable("control channel: connect to {}: {}", remote, std::strerror(errno)));
    }
    connecting = true;
  }
  return std::make_unique<ControlConnection>(std::move(fd), remote, connecting);
}

ControlConnection::ControlConnection(UniqueFd fd, std::string remote, bool connecting)
    : fd_(std::move(fd)), remote_(std::move(remote)), connecting_(connecting) {}

Result<std::optional<Frame>> ControlConnection::next(std::uint32_t max_body) {
  std::size_t taken = 0;
  auto frame = take_frame(std::span<const std::uint8_t>(in_).subspan(in_at_), taken, max_body);
  in_at_ += taken;
  if (in_at_ == in_.size()) {
    in_.clear();
    in_at_ = 0;
  }
  return frame;
}

Status ControlConnection::receive(std::size_t max_buffered) {
  // What frames took is dropped once it is half the buffer, or when no whole
  // frame waits (the next needs room): a move per read of a full buffer
  // taken 1024 frames a turn would be quadratic again.
  if (in_at_ > 0 && (in_at_ >= in_.size() / 2 || !frame_waiting())) {
    in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(in_at_));
    in_at_ = 0;
  }
  while (in_.size() < max_buffered) {
    const std::size_t at = in_.size();
    const std::size_t want = std::min(kReadChunk, max_buffered - at);
    in_.resize(at + want);
    const ssize_t n = ::recv(fd_.get(), in_.data() + at, want, 0);
    in_.resize(at + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) continue;
    if (n == 0) return Status::unavailable("control channel: {} closed the connection", remote_);
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
    if (errno == EINTR) continue;
    return Status::unavailable("control channel: reading from {}: {}", remote_, std::strerror(errno));
  }
  return Status::ok();
}

ControlConnection::~ControlConnection() {
  if (queued_total_ != nullptr) *queued_total_ -= queued();
}

void ControlConnection::count_queued_in(std::size_t* total) {
  if (queued_total_ != nullptr) *queued_total_ -= queued();
  queued_total_ = total;
  if (queued_total_ != nullptr) *queued_total_ += queued();
}

void ControlConnection::drop_queued() {
  if (queued_total_ != nullptr) *queued_total_ -= queued();
  out_.clear();
  out_at_ = 0;
}

Status ControlConnection::send(ControlKind kind, std::span<const std::uint8_t> body) {
  if (out_.size() - out_at_ + kFrameHeaderBytes + body.size() > kMaxQueuedBytes) {
    return Status::resource_exhausted("control channel: {} bytes wait for {}, which does not read", out_.size() - out_at_,
                                      remote_);
  }
  const auto frame = encode_frame(kind, body);
  out_.insert(out_.end(), frame.begin(), frame.end());
  if (queued_total_ != nullptr) *queued_total_ += frame.size();
  return Status::ok();
}

Status ControlConnection::flush() {
  if (connecting_) {
    int error = 0;
    socklen_t length = sizeof error;
    if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error == EINPROGRESS || error == EALREADY) return Status::ok();
    if (error != 0) return Status::unavailable("control channel: connect to {}: {}", remote_, std::strerror(error));
    connecting_ = false;
  }
  while (out_at_ < out_.size()) {
    const ssize_t n = ::send(fd_.get(), out_.data() + out_at_, out_.size() - out_at_, MSG_NOSIGNAL);
    if (n > 0) {
      out_at_ += static_cast<std::size_t>(n);
      if (queued_total_ != nullptr) *queued_total_ -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    return Status::unavailable("control channel: writing to {}: {}", remote_, std::strerror(errno));
  }
  if (out_at_ == out_.size()) {
    out_.clear();
    out_at_ = 0;
  }
  return Status::ok();
}

Result<ControlListener> ControlListener::open(const SocketAddress& at) {
  ControlListener l;
  auto fd = listen_tcp(at, 256);
  if (!fd) return std::unexpected(fd.error());
  l.fd_ = UniqueFd(*fd);
  auto bound = bound_address(l.fd_.get());
  if (!bound) return std::unexpected(Status::unavailable("control channel: {}", bound.error().message()));
  l.address_ = format_socket_address(bound->get());
  l.spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  return l;
}

std::unique_ptr<ControlConnection> ControlListener::accept() {
  sockaddr_storage from{};
  socklen_t length = sizeof from;
  for (;;) {
    const int fd = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&from), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      set_socket_options(fd);
      return std::make_unique<ControlConnection>(UniqueFd(fd), format_socket_address(reinterpret_cast<sockaddr*>(&from)),
                                                 false);
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return nullptr;
    const int error = errno;
    // Taken back if another thread took the descriptor it freed last time.
    if (spare_.get() < 0) spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if ((error == EMFILE || error == ENFILE) && spare_.get() >= 0) {
      spare_ = UniqueFd();
      const int unserved = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (unserved >= 0) {
        ::close(unserved);
        ++dropped_;
      }
      spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    // At most a line a second, with what it left out.
    const auto now = std::chrono::steady_clock::now();
    if (now - warned_at_ >= std::chrono::seconds(1)) {
      warned_at_ = now;
      const std::uint64_t warned_before = std::exchange(dropped_warned_, dropped_);
      // Formatted only when logged (nothing is built out of descriptors
      // with the level off).
      if (dropped_ > warned_before) {
        baton::logger().warn("control channel: accept on {}: {} ({} connections closed unserved since the last line)",
                             address_, std::strerror(error), dropped_ - warned_before);
      } else {
        baton::logger().warn("control channel: accept on {}: {}", address_, std::strerror(error));
      }
    }
    return nullptr;
  }
}

Result<Poller> Poller::create() {
  Poller p;
  p.fd_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  if (p.fd_.get() < 0) return std::unexpected(Status::unavailable("epoll_create1: {}", std::strerror(errno)));
  return p;
}

namespace {
void epoll_apply(int epoll, int op, int fd, bool write) {
  epoll_event ev{};
  ev.events = EPOLLIN | (write ? EPOLLOUT : 0U);
  ev.data.fd = fd;
  if (::epoll_ctl(epoll, op, fd, &ev) != 0 && op != EPOLL_CTL_DEL) {
    baton::logger().warn("control channel: epoll_ctl({}) on fd {}: {}", op, fd, std::strerror(errno));
  }
}
}  // namespace

void Poller::watch(int fd, bool write) { epoll_apply(fd_.get(), EPOLL_CTL_ADD, fd, write); }
void Poller::change(int fd, bool write) { epoll_apply(fd_.get(), EPOLL_CTL_MOD, fd, write); }
void Poller::forget(int fd) { epoll_apply(fd_.get(), EPOLL_CTL_DEL, fd, false); }

bool Poller::ready(std::vector<int>& out) const {
  std::array<epoll_event, 64> events{};
  out.clear();
  const int n = ::epoll_wait(fd_.get(), events.data(), static_cast<int>(events.size()), 0);
  if (n < 0) return false;  // EINTR and the like: look at everything this time
  for (int i = 0; i < n; ++i) out.push_back(events[static_cast<std::size_t>(i)].data.fd);
  return n < static_cast<int>(events.size());
}

}  // namespace baton::transport::ucx
