// A `baton serve` child process on loopback, for the commands that bring
// their own peer (`--spawn`): started with the same binary, stopped with
// SIGTERM, its exit status checked.
#pragma once

#include <signal.h>

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/status.h"

namespace baton::cli {

// The salt of the pattern `baton serve` fills its buffer with
// (engine/pattern.h).
inline constexpr std::uint64_t kServeSalt = 0;

class ServeChild {
 public:
  // Runs `<binary> <command> <args>` (by default this very binary's `serve`;
  // `store` prints the same first line) and waits (up to 20 s) for its
  // address line; inside network namespace `netns` (`ip netns exec`) when
  // one is named. unavailable when it cannot start or exits first;
  // invalid_argument when it exits 2 (it refused the arguments it was
  // given). The child gets SIGTERM if the thread that started it dies
  // (PR_SET_PDEATHSIG): start it from a thread that outlives it.
  [[nodiscard]] static Result<ServeChild> start(const std::vector<std::string>& args,
                                                const std::string& binary = "/proc/self/exe",
                                                const std::string& netns = "", const std::string& command = "serve");
  ServeChild(ServeChild&& other) noexcept;
  ServeChild& operator=(ServeChild&&) = delete;
  ~ServeChild();  // kills it if stop() was not called

  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  // `signal` (SIGTERM, or SIGINT or SIGHUP: each stops serve cleanly), then
  // waits; internal unless it exited 0.
  [[nodiscard]] Status stop(int signal = SIGTERM);
  // SIGKILL, without waiting (the destructor reaps it): a peer that dies
  // without a word, in a fault drill. Do not stop() it afterwards.
  void kill();

 private:
  ServeChild(pid_t pid, int out) : pid_(pid), out_(out) {}
  pid_t pid_ = -1;
  int out_ = -1;  // the child's stdout, kept open so its later lines do not SIGPIPE it
  std::string address_;
};

}  // namespace baton::cli
