#include "handoff_remote.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <string>

#include <fmt/core.h>

#include "handoff_wire.h"

namespace baton::cli {

using nlohmann::json;

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::start(const std::string& role, std::uint64_t page_bytes,
                                                            std::uint32_t pages, int input_timeout_ms) {
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return std::unexpected(Status::unavailable("handoff-worker: pipe failed"));
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    return std::unexpected(Status::unavailable("handoff-worker: pipe failed"));
  }
  std::vector<std::string> storage{"baton",         "handoff-worker", "--role", role, "--page-bytes",
                                   std::to_string(page_bytes), "--pages", std::to_string(pages)};
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return std::unexpected(Status::unavailable("handoff-worker: fork failed"));
  if (pid == 0) {
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  std::unique_ptr<WorkerProcess> p(new WorkerProcess());
  p->pid_ = pid;
  p->in_ = to_child[1];
  p->input_timeout_ms_ = input_timeout_ms;
  // Written with a bound (post): a stopped worker's full pipe held the
  // bench in write() for good.
  (void)::fcntl(p->in_, F_SETFL, ::fcntl(p->in_, F_GETFL) | O_NONBLOCK);
  p->out_ = from_child[0];
  // The hello line, within a bound, before the reader thread takes over.
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  char c = 0;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd fd{p->out_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&fd, 1, static_cast<int>(left.count())) <= 0) {
      return std::unexpected(Status::unavailable("handoff-worker ({}, pid {}) said nothing within 20 s", role, pid));
    }
    if (::read(p->out_, &c, 1) != 1) {  // it exited (its stderr said why): not silence
      int status = 0;
      if (::waitpid(pid, &status, 0) == pid) p->pid_ = -1;
      return std::unexpected(Status::unavailable(
          "handoff-worker ({}, pid {}) exited before its hello ({} {})", role, pid,
          WIFSIGNALED(status) ? "signal" : "exit status", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)));
    }
    if (c == '\n') break;
    line += c;
  }
  json hello = json::parse(line, nullptr, false);
  if (hello.is_discarded() || !hello.is_object() || !hello.contains("address") || !hello["address"].is_string() ||
      !hello.contains("region") || !hello["region"].is_number_unsigned()) {
    return std::unexpected(Status::unavailable("handoff-worker: unexpected hello \"{}\"", shown(line)));
  }
  p->address_ = hello["address"].get<std::string>();
  p->region_ = hello["region"].get<engine::RegionHandle>();
  p->reader_ = std::thread([raw = p.get()] { raw->read_lines(); });
  return p;
}

WorkerProcess::~WorkerProcess() {
  close_input();
  if (pid_ > 0) {
    // A worker drains its loads and exits on EOF; one that does not (stopped,
    // wedged) is killed after 10 s. Reaped before the reader is joined: the
    // reader ends only at the child's EOF, which a stopped child never sends.
    bool reaped = false;
    for (int i = 0; i < 200 && !reaped; ++i) {
      reaped = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
      if (!reaped) ::usleep(50'000);
    }
    if (!reaped) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  if (reader_.joinable()) reader_.join();
  if (out_ >= 0) ::close(out_);
}

void WorkerProcess::read_lines() {
  std::string buffer;
  char chunk[65536];
  while (true) {
    const ssize_t n = ::read(out_, chunk, sizeof chunk);
    if (n <= 0) break;
    buffer.append(chunk, static_cast<std::size_t>(n));
    std::size_t start = 0, end = 0;
    bool completed = false;
    std::unique_lock lock(mutex_);
    while ((end = buffer.find('\n', start)) != std::string::npos) {
      json j = json::parse(std::string_view(buffer).substr(start, end - start), nullptr, false);
      start = end + 1;
      if (j.is_discarded()) continue;
      if (j.contains("completion")) {
        if (auto c = completion_from_json(j["completion"])) {
          completions_.push_back(std::move(*c));
          completed = true;
        }
      } else if (j.contains("id") && j["id"].is_number_unsigned() && j["id"].get<std::uint64_t>() != 0) {
        const auto id = j["id"].get<std::uint64_t>();  // before the move below
        answers_[id] = std::move(j);
      } else if (j.contains("status")) {
        // Nobody waits for it (calls have ids from 1): said, not kept.
        fmt::print(stderr, "handoff-worker pid {}: {}\n", pid_, status_from_json(j["status"]).to_string());
      }
    }
    buffer.erase(0, start);
    cv_.notify_all();
    std::function<void()> wake = completed ? wake_ : nullptr;
    lock.unlock();
    if (wake) wake();
  }
  bool asked = false;
  {
    std::lock_guard lock(write_mutex_);
    asked = in_ < 0;
  }
  std::function<void()> gone;
  {
    std::lock_guard lock(mutex_);
    gone_ = true;
    cv_.notify_all();
    if (!asked) gone = std::move(gone_hook_);
  }
  if (gone) gone();
}

bool WorkerProcess::alive() const {
  std::lock_guard lock(mutex_);
  return !gone_;
}

void WorkerProcess::kill() {
  if (pid_ > 0) ::kill(pid_, SIGKILL);
}

void WorkerProcess::stop() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void WorkerProcess::close_input() {
  std::lock_guard lock(write_mutex_);
  if (in_ >= 0) ::close(std::exchange(in_, -1));
}

Result<std::uint64_t> WorkerProcess::send(json request) {
  std::uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    if (gone_) return std::unexpected(Status::unavailable("handoff-worker pid {} is gone", pid_));
    id = next_id_++;
  }
  request["id"] = id;
  if (auto s = post(request); !s.is_ok()) return std::unexpected(s);
  return id;
}

Status WorkerProcess::post(const json& message) {
  const std::string text = message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard lock(write_mutex_);
  if (in_ < 0) return Status::unavailable("handoff-worker pid {}: its stdin is closed", pid_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(input_timeout_ms_);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(in_, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::unavailable("handoff-worker pid {}: its stdin closed", pid_);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd writable{in_, POLLOUT, 0};
    if (left.count() <= 0 || (::poll(&writable, 1, static_cast<int>(left.count())) == 0 &&
                              std::chrono::steady_clock::now() >= deadline)) {
      // Stopped or wedged, and its input now ends mid-line: killed, so that
      // it neither reads half an order nor writes our memory later.
      kill();
      return Status::timeout("handoff-worker pid {}: took no input for {} ms (stopped or wedged); killed", pid_,
                             input_timeout_ms_);
    }
  }
  return Status::ok();
}

Status WorkerProcess::wait(std::uint64_t id, json* answer, int timeout_ms) {
  std::unique_lock lock(mutex_);
  const bool arrived = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                    [&] { return answers_.contains(id) || gone_; });
  auto it = answers_.find(id);
  if (it == answers_.end()) {
    return arrived ? Status::unavailable("handoff-worker pid {} is gone", pid_)
                   : Status::timeout("handoff-worker pid {}: no answer to call {} within {} ms", pid_, id, timeout_ms);
  }
  json a = std::move(it->second);
  answers_.erase(it);
  lock.unlock();
  Status s = a.contains("status") ? status_from_json(a["status"]) : Status::ok();
  if (answer != nullptr) *answer = std::move(a);
  return s;
}

Status WorkerProcess::call(json request, json* answer, int timeout_ms) {
  auto id = send(std::move(request));
  if (!id) return id.error();
  return wait(*id, answer, timeout_ms);
}

void WorkerProcess::on_completion(std::function<void()> wake) {
  std::lock_guard lock(mutex_);
  wake_ = std::move(wake);
}

void WorkerProcess::on_exit(std::function<void()> gone) {
  std::lock_guard lock(mutex_);
  gone_hook_ = std::move(gone);
}

std::vector<handoff::LoadCompletion> WorkerProcess::take_completions() {
  std::lock_guard lock(mutex_);
  return std::exchange(completions_, {});
}

// Not answered: the worker reports a refused order as the load's completion,
// so dispatch costs no round trip.
Status RemoteConsumerRank::load(const handoff::LoadOrder& order) {
  return p_.post({{"op", "load"}, {"order", to_json(order)}});
}

}  // namespace baton::cli
