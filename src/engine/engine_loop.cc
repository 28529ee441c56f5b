#include "engine/engine_loop.h"

#include <algorithm>

namespace baton::engine {

void EngineLoop::post(Command command) {
  std::lock_guard lock(mutex_);
  commands_.push_back(std::move(command));
}

bool EngineLoop::has_commands() {
  std::lock_guard lock(mutex_);
  return !commands_.empty();
}

void EngineLoop::tick(TimeNs now_ns) {
  {
    std::lock_guard lock(mutex_);
    draining_.swap(commands_);
  }
  for (Command& c : draining_) c(admission_, now_ns);
  draining_.clear();
  completions_.clear();
  transport_.poll(now_ns, completions_);
  for (const transport::Completion& c : completions_) {
    admission_.on_completion(c, scheduler_.on_completion(c, now_ns), now_ns);
  }
  admission_.tick(now_ns);
  scheduler_.dispatch(now_ns);
}

std::optional<TimeNs> EngineLoop::next_event_ns() const {
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
