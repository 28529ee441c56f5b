// Runs the `baton` binary as a user would and captures what it printed.
// Each run gets files of its own: ctest runs tests in parallel.
#pragma once

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace baton::testing {

// Held by tests that fill every core (many copying processes) and by tests
// whose assertions compare two throughputs of one run: ctest runs tests in
// parallel, and on 2 cores the first kind skews the second's ratios.
class CpuLock {
 public:
  CpuLock() : fd_(::open("/tmp/baton-cpu.lock", O_CREAT | O_RDWR, 0600)) {
    if (fd_ >= 0) (void)::flock(fd_, LOCK_EX);
  }
  ~CpuLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  CpuLock(const CpuLock&) = delete;
  CpuLock& operator=(const CpuLock&) = delete;

 private:
  int fd_;
};

struct CommandRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `prefix`: a command that runs the binary (e.g. "ip netns exec NS").
inline CommandRun run_baton(const std::string& args, const std::string& prefix = "") {
  static int runs = 0;
  const std::string stem = fmt::format("{}/baton_{}_{}_{}", ::testing::TempDir(), getpid(),
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name(), runs++);
  const int status = std::system(fmt::format("{} {} {} >{}.out 2>{}.err", prefix, BATON_BINARY, args, stem, stem).c_str());
  CommandRun run{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(stem + ".out"), slurp(stem + ".err")};
  std::remove((stem + ".out").c_str());  // read: nothing left in /tmp
  std::remove((stem + ".err").c_str());
  return run;
}

// A process's state letter in /proc ('T' stopped, 'Z' exited and not yet
// reaped), or '?' when there is no such process.
inline char process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '?';
}

// SIGSTOPs `pid` and waits (up to 1 s) until it has stopped: kill() returns
// before, and a call answered in between is not one the stop stalled.
inline bool stop_process(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  for (int i = 0; i < 1000 && process_state(pid) != 'T'; ++i) ::usleep(1000);
  return process_state(pid) == 'T';
}

// A deployment secret in a private file, for peers that listen beyond
// loopback (between network namespaces): pass it as --token-file.
// Removed when the test program exits.
inline std::string secret_file() {
  struct Removed {
    std::string path;
    ~Removed() { std::remove(path.c_str()); }
  };
  static const Removed made{fmt::format("{}/baton_secret_{}", ::testing::TempDir(), getpid())};
  std::ofstream(made.path) << "a test secret of enough bytes\n";
  ::chmod(made.path.c_str(), 0600);
  return made.path;
}

}  // namespace baton::testing
