#include "serve_child.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <chrono>
#include <thread>
#include <utility>

#include "baton/common/units.h"

namespace baton::cli {

Result<ServeChild> ServeChild::start(const std::vector<std::string>& args, const std::string& binary,
                                     const std::string& netns, const std::string& command) {
  // `ip netns exec` runs its command by path: /proc/self/exe would name ip.
  std::error_code ec;
  const std::string program = netns.empty() ? binary : std::filesystem::canonical(binary, ec).string();
  if (program.empty()) return std::unexpected(Status::unavailable("serve: cannot resolve {}: {}", binary, ec.message()));
  int out[2];
  if (::pipe(out) != 0) return std::unexpected(Status::unavailable("serve: pipe failed"));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return std::unexpected(Status::unavailable("serve: fork failed"));
  if (pid == 0) {
    // A bench killed without a word takes its peers with it (SIGTERM: they
    // stop cleanly), instead of leaving them serving forever.
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) ::_exit(127);
    ::dup2(out[1], STDOUT_FILENO);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<std::string> storage{"baton", command};
    if (!netns.empty()) storage = {"ip", "netns", "exec", netns, program, command};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : storage) argv.push_back(s.data());
    argv.push_back(nullptr);
    if (netns.empty()) {
      ::execv(program.c_str(), argv.data());
    } else {
      ::execvp("ip", argv.data());
    }
    ::_exit(127);
  }
  ::close(out[1]);
  ServeChild child(pid, out[0]);
  // Read until the "address …" line, within a bound. Lines before it are
  // passed on to our stderr: UCX prints its warnings on stdout.
  constexpr std::size_t kMostBeforeAddress = 64 << 10;
  std::string text;
  // 20 s, and 10 s more a GiB of buffer: it fills the buffer before it
  // answers (about 5 s a GiB on a slow VM).
  std::uint64_t buffer_bytes = 0;
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] != "--buffer-size") continue;
    if (auto b = parse_size(args[i + 1])) buffer_bytes = *b;
  }
  const auto wait_for = std::chrono::seconds(20 + 10 * (buffer_bytes >> 30));
  const auto deadline = std::chrono::steady_clock::now() + wait_for;
  for (;;) {
    if (const auto eol = text.find('\n'); eol != std::string::npos) {
      const std::string line = text.substr(0, eol);
      text.erase(0, eol + 1);
      if (line.starts_with("address ")) {
        child.address_ = line.substr(8);
        return child;
      }
      std::fprintf(stderr, "serve (pid %d): %s\n", static_cast<int>(pid), line.c_str());
      continue;
    }
    if (text.size() > kMostBeforeAddress) {
      return std::unexpected(Status::unavailable("serve: the child (pid {}) wrote {} bytes without an address line",
                                                 pid, text.size()));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd fd{out[0], POLLIN, 0};
    char chunk[256];
    ssize_t n = 0;
    if (left.count() <= 0 || ::poll(&fd, 1, static_cast<int>(left.count())) <= 0) {
      return std::unexpected(
          Status::unavailable("serve: the child (pid {}) gave no address within {} s", pid, wait_for.count()));
    }
    if ((n = ::read(out[0], chunk, sizeof chunk)) <= 0) {
      // It closed its stdout: it is exiting. Exit code 2 is a `baton`
      // command refusing its input, so the settings we passed on were bad:
      // say so as bad input (our exit code 2 too), not as a peer that failed.
      int status = 0;
      pid_t reaped = 0;
      for (int i = 0; i < 200 && (reaped = ::waitpid(pid, &status, WNOHANG)) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // at most 2 s; else the destructor kills it
      }
      if (reaped == pid) child.pid_ = -1;
      if (reaped == pid && WIFEXITED(status) && WEXITSTATUS(status) == 2) {
        return std::unexpected(Status::invalid_argument(
            "serve: the child (pid {}) refused the settings passed on to it (its error is above)", pid));
      }
      return std::unexpected(
          Status::unavailable("serve: the child (pid {}) exited before giving its address (its error is above)", pid));
    }
    text.append(chunk, static_cast<std::size_t>(n));
  }
}

ServeChild::ServeChild(ServeChild&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), out_(std::exchange(other.out_, -1)), address_(std::move(other.address_)) {}

ServeChild::~ServeChild() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) ::close(out_);
}

void ServeChild::kill() {
  if (pid_ > 0) ::kill(pid_, SIGKILL);  // reaped by the destructor: a drill must not wait on it here
}

Status ServeChild::stop(int signal) {
  if (pid_ <= 0) return Status::ok();
  ::kill(pid_, signal);
  int status = 0;
  ::waitpid(std::exchange(pid_, -1), &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::ok();
  return Status::internal("serve: the child ended with {} {}", WIFEXITED(status) ? "exit code" : "signal",
                          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

}  // namespace baton::cli
