// The engine loop: the one owner of scheduling state. Other threads post
// commands; tick(now) drains them, feeds transport completions to the
// scheduler and dispatches. Its only time source is the `now` it is given.
// Private to engine/.
#pragma once

#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "baton/admission/admission.h"
#include "baton/sched/scheduler.h"
#include "baton/transport/transport.h"

namespace baton::engine {

class EngineLoop {
 public:
  using Command = std::function<void(admission::AdmissionController&, TimeNs now_ns)>;

  EngineLoop(sched::Scheduler& scheduler, admission::AdmissionController& admission, transport::Transport& transport)
      : scheduler_(scheduler), admission_(admission), transport_(transport) {}

  // Thread-safe.
  void post(Command command);

  // One turn of the loop at `now_ns`.
  void tick(TimeNs now_ns);

  // The next instant the loop must run at without new commands.
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const;
  [[nodiscard]] bool has_commands();

 private:
  sched::Scheduler& scheduler_;
  admission::AdmissionController& admission_;
  transport::Transport& transport_;
  std::mutex mutex_;
  std::vector<Command> commands_;  // guarded by mutex_
  std::vector<Command> draining_;  // loop-owned
  std::vector<transport::Completion> completions_;
};

// Advances a VirtualClock straight from one interesting instant to the next,
// ticking the loop at each: a whole workload runs in milliseconds and is
// reproducible from its seed.
class VirtualClockDriver {
 public:
  explicit VirtualClockDriver(EngineLoop& loop) : loop_(loop) {}

  [[nodiscard]] Status run_until(TimeNs t_ns);
  // Runs until idle; timeout after `limit_ns` of virtual time.
  [[nodiscard]] Status run_until_idle(TimeNs limit_ns, const std::function<bool()>& idle);
  [[nodiscard]] const VirtualClock& clock() const { return clock_; }

 private:
  EngineLoop& loop_;
  VirtualClock clock_;
};

}  // namespace baton::engine
