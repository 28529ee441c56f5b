// The engine loop: the one owner of scheduling state. Other threads post
// commands; tick(now) drains them, feeds transport completions to the
// scheduler and dispatches. Its only time source is the `now` it is given.
// Private to engine/.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
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

  // Thread-safe. Wakes a sleeping wall-clock driver.
  void post(Command command);
  // Thread-safe, without waking the loop: bookkeeping that may wait for its
  // next turn (at the latest the idle sleep bound). Runs in order with the
  // other commands, so a call posted after it sees its effect.
  void post_quietly(Command command);
  // Called after each post (the wall-clock driver's wake-up).
  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }
  // Runs at the end of every turn, on the loop (the engine's datapath
  // resolves connects and ends batches there). True when it left work for
  // the next turn, which then comes at once. Set before the loop starts.
  void set_on_turn(std::function<bool(TimeNs now_ns)> on_turn) { on_turn_ = std::move(on_turn); }

  // One turn of the loop at `now_ns`. True when it had something to do
  // (commands or completions).
  bool tick(TimeNs now_ns);

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
  std::function<void()> wake_;
  std::function<bool(TimeNs)> on_turn_;
  bool more_ = false;  // on_turn_ left work for the next turn
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

// Runs the loop on its own thread against the steady clock: tick, then sleep
// until the next instant anything is due — on the transport's event fd when
// it has one, else on a timer — or until a command is posted. An idle engine
// does not spin. now_ns() is steady-clock time since start().
class WallClockDriver {
 public:
  WallClockDriver(EngineLoop& loop, transport::Transport& transport);
  ~WallClockDriver();  // stops and joins
  WallClockDriver(const WallClockDriver&) = delete;
  WallClockDriver& operator=(const WallClockDriver&) = delete;

  [[nodiscard]] Status start();
  void stop();
  void wake();  // thread-safe
  [[nodiscard]] TimeNs now_ns() const;
  // Loop turns so far: a test's measure of "no busy polling when idle".
  [[nodiscard]] std::uint64_t turns() const { return turns_.load(); }

  // The longest sleep when nothing is scheduled (a bound, not a poll rate).
  static constexpr TimeNs kIdleSleepNs = 100'000'000;
  // How long the loop keeps turning after a turn with work before it goes
  // to sleep: the next command or completion usually follows within
  // microseconds, and a sleep plus a wake-up costs tens of them (most on a
  // VM). Idle engines still sleep: this only follows activity.
  static constexpr TimeNs kStayAwakeNs = 50'000;

 private:
  void run();

  EngineLoop& loop_;
  transport::Transport& transport_;
  SteadyClock clock_;
  TimeNs start_ns_ = 0;
  int wake_fd_ = -1;  // eventfd
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};  // about to wait, or waiting, in ppoll
  std::atomic<std::uint64_t> turns_{0};
  std::thread thread_;
};

}  // namespace baton::engine
