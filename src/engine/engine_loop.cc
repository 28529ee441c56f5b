#include "engine/engine_loop.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

namespace baton::engine {

void EngineLoop::post(Command command) {
  {
    std::lock_guard lock(mutex_);
    commands_.push_back(std::move(command));
  }
  if (wake_) wake_();
}

void EngineLoop::post_quietly(Command command) {
  std::lock_guard lock(mutex_);
  commands_.push_back(std::move(command));
}

bool EngineLoop::has_commands() {
  std::lock_guard lock(mutex_);
  return !commands_.empty();
}

bool EngineLoop::tick(TimeNs now_ns) {
  {
    std::lock_guard lock(mutex_);
    draining_.swap(commands_);
  }
  bool busy = !draining_.empty();
  for (Command& c : draining_) c(admission_, now_ns);
  draining_.clear();
  completions_.clear();
  transport_.poll(now_ns, completions_);
  busy = busy || !completions_.empty();
  for (const transport::Completion& c : completions_) {
    admission_.on_completion(c, scheduler_.on_completion(c, now_ns), now_ns);
  }
  admission_.tick(now_ns);
  scheduler_.dispatch(now_ns);
  more_ = on_turn_ && on_turn_(now_ns);
  return busy || more_;
}

std::optional<TimeNs> EngineLoop::next_event_ns() const {
  if (more_) return 0;  // at once
  const auto t = transport_.next_event_ns();
  const auto a = admission_.next_timer_ns();
  if (t && a) return std::min(*t, *a);
  return t ? t : a;
}

Status VirtualClockDriver::run_until(TimeNs t_ns) {
  if (t_ns < clock_.now_ns()) {
    return Status::out_of_range("run_until: {} ns is before now ({} ns)", t_ns, clock_.now_ns());
  }
  loop_.tick(clock_.now_ns());
  while (true) {
    const auto next = loop_.next_event_ns();
    if (!next || *next > t_ns) break;
    // A transport never schedules in the past; never move the clock back.
    (void)clock_.advance_to(std::max(*next, clock_.now_ns()));
    loop_.tick(clock_.now_ns());
  }
  (void)clock_.advance_to(t_ns);
  loop_.tick(t_ns);
  return Status::ok();
}

Status VirtualClockDriver::run_until_idle(TimeNs limit_ns, const std::function<bool()>& idle) {
  const TimeNs end = clock_.now_ns() + limit_ns;
  loop_.tick(clock_.now_ns());
  while (!(idle() && !loop_.has_commands())) {
    const auto next = loop_.next_event_ns();
    if (!next) {
      loop_.tick(clock_.now_ns());
      if (!loop_.next_event_ns() && !idle()) {
        return Status::internal("run_until_idle: work is queued but nothing will ever happen");
      }
      continue;
    }
    if (*next > end) {
      return Status::timeout("run_until_idle: still busy after {} ns of virtual time", limit_ns);
    }
    (void)clock_.advance_to(std::max(*next, clock_.now_ns()));
    loop_.tick(clock_.now_ns());
  }
  return Status::ok();
}

}  // namespace baton::engine

namespace baton::engine {

WallClockDriver::WallClockDriver(EngineLoop& loop, transport::Transport& transport)
    : loop_(loop), transport_(transport) {}

WallClockDriver::~WallClockDriver() {
  stop();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status WallClockDriver::start() {
  if (thread_.joinable()) return Status::already_exists("WallClockDriver: already running");
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Status::internal("WallClockDriver: eventfd failed: {}", std::strerror(errno));
  start_ns_ = clock_.now_ns();
  loop_.set_wake([this] { wake(); });
  thread_ = std::thread([this] { run(); });
  return Status::ok();
}

void WallClockDriver::stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  thread_.join();
  loop_.set_wake({});
}

void WallClockDriver::wake() {
  // A loop that is awake sees the command on its next turn (it checks for
  // commands after announcing a sleep, so none is missed).
  if (wake_fd_ < 0 || !sleeping_.load()) return;
  const std::uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);  // a full counter still wakes the reader
}

TimeNs WallClockDriver::now_ns() const { return clock_.now_ns() - start_ns_; }

void WallClockDriver::run() {
  TimeNs awake_until = 0;
  while (!stop_) {
    ++turns_;
    TimeNs now = now_ns();
    if (loop_.tick(now)) awake_until = now + kStayAwakeNs;
    const auto next = loop_.next_event_ns();
    now = now_ns();
    TimeNs sleep_ns = next ? std::max<TimeNs>(0, *next - now) : kIdleSleepNs;
    sleep_ns = std::min(sleep_ns, kIdleSleepNs);
    if (sleep_ns == 0 || now < awake_until) continue;
    sleeping_ = true;  // from here a post wakes us; then look once more
    if (stop_ || loop_.has_commands() || !transport_.arm()) {  // work came in, or the transport has some
      sleeping_ = false;
      continue;
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {transport_.event_fd(), POLLIN, 0}};
    const nfds_t count = fds[1].fd >= 0 ? 2 : 1;
    const timespec timeout{static_cast<time_t>(sleep_ns / 1'000'000'000), static_cast<long>(sleep_ns % 1'000'000'000)};
    if (::ppoll(fds, count, &timeout, nullptr) > 0 && (fds[0].revents & POLLIN) != 0) {
      std::uint64_t drained = 0;
      (void)!::read(wake_fd_, &drained, sizeof drained);
    }
    sleeping_ = false;
  }
}

}  // namespace baton::engine
