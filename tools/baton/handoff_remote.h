// The bench's side of a `baton handoff-worker` process: the child started
// with pipes on its stdin and stdout, calls answered by id, completions
// queued; and the orchestrator's rank interfaces over it.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "baton/common/status.h"
#include "baton/handoff/rank.h"

namespace baton::cli {

class WorkerProcess {
 public:
  // Starts `<this binary> handoff-worker --role … --page-bytes … --pages …`
  // and waits (20 s at most) for its hello line (address, region).
  // A worker that takes none of a post() for `input_timeout_ms` is killed.
  [[nodiscard]] static Result<std::unique_ptr<WorkerProcess>> start(const std::string& role,
                                                                    std::uint64_t page_bytes, std::uint32_t pages,
                                                                    int input_timeout_ms = 60'000);
  ~WorkerProcess();  // closes its stdin (it exits), then reaps it

  // Sends `request` with a fresh id and waits for the answer: its
  // "status" as a Status, the whole answer in `answer`. unavailable once
  // the process is gone; timeout after `timeout_ms`.
  [[nodiscard]] Status call(nlohmann::json request, nlohmann::json* answer = nullptr, int timeout_ms = 60'000);
  // Sends without waiting for the answer (its id is returned); wait() takes it.
  [[nodiscard]] Result<std::uint64_t> send(nlohmann::json request);
  // Sends a message that has no answer (a load: its end is a completion).
  // A worker that takes none of it for the input timeout (its pipe full:
  // it is stopped or wedged) is killed, and the answer is timeout.
  [[nodiscard]] Status post(const nlohmann::json& message);
  [[nodiscard]] Status wait(std::uint64_t id, nlohmann::json* answer, int timeout_ms);
  [[nodiscard]] std::vector<handoff::LoadCompletion> take_completions();
  // Called (outside our locks) whenever completions arrived.
  void on_completion(std::function<void()> wake);
  // Called once (on the reader's thread, outside our locks) when the
  // process's output ends before close_input() asked it to: it died. A
  // caller blocked elsewhere (a receive) learns of it then, not at its next look.
  void on_exit(std::function<void()> gone);

  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] engine::RegionHandle region() const { return region_; }
  [[nodiscard]] pid_t pid() const { return pid_; }
  [[nodiscard]] bool alive() const;
  void kill();  // SIGKILL, for fault injection
  void stop();  // SIGSTOP, for fault injection: it neither reads nor answers
  // Closes its stdin: it drains its loads and exits. The destructor does
  // it too; called first on every worker, they all exit at once.
  void close_input();

 private:
  WorkerProcess() = default;
  void read_lines();

  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  int input_timeout_ms_ = 60'000;  // post()
  std::string address_;
  engine::RegionHandle region_ = 0;
  std::mutex write_mutex_;  // one message at a time on the child's stdin
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::uint64_t, nlohmann::json> answers_;
  std::vector<handoff::LoadCompletion> completions_;
  std::function<void()> wake_;
  std::function<void()> gone_hook_;
  std::uint64_t next_id_ = 1;
  bool gone_ = false;
  std::thread reader_;
};

// A producer rank whose page table is kept here, as the producer stage's
// scheduler keeps its block table: returning a ticket's source pages costs
// the orchestrator no round trip. The worker holds the memory.
class RemoteProducerRank final : public handoff::ProducerRank {
 public:
  RemoteProducerRank(WorkerProcess& p, std::uint64_t page_bytes, std::uint32_t pool_pages)
      : p_(p), pool_(page_bytes, pool_pages) {}
  [[nodiscard]] std::uint64_t page_bytes() const override { return pool_.page_bytes(); }
  [[nodiscard]] std::string address() const override { return p_.address(); }
  [[nodiscard]] engine::RegionHandle region() const override { return p_.region(); }
  [[nodiscard]] Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) override {
    return pool_.allocate(pages);
  }
  [[nodiscard]] Status free(std::span<const std::uint32_t> pages) override { return pool_.free(pages); }
  [[nodiscard]] const handoff::PagePool& pool() const { return pool_; }

 private:
  WorkerProcess& p_;
  handoff::PagePool pool_;
};

// A consumer rank whose page table is kept here (the worker runs
// PageTable::kCaller), as a serving scheduler keeps its workers' block
// table: allocating costs no round trip.
class RemoteConsumerRank final : public handoff::ConsumerRank {
 public:
  RemoteConsumerRank(WorkerProcess& p, std::uint64_t page_bytes, std::uint32_t pool_pages)
      : p_(p), pool_(page_bytes, pool_pages) {}
  [[nodiscard]] std::uint64_t page_bytes() const override { return pool_.page_bytes(); }
  [[nodiscard]] std::uint32_t pool_pages() const override { return pool_.pages(); }
  [[nodiscard]] Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) override {
    return pool_.allocate(pages);
  }
  [[nodiscard]] Status free(std::span<const std::uint32_t> pages) override { return pool_.free(pages); }
  [[nodiscard]] Status load(const handoff::LoadOrder& order) override;
  [[nodiscard]] std::vector<handoff::LoadCompletion> take_completions() override { return p_.take_completions(); }
  [[nodiscard]] bool on_completion(std::function<void()> wake) override {
    p_.on_completion(std::move(wake));
    return true;
  }
  [[nodiscard]] const handoff::PagePool& pool() const { return pool_; }

 private:
  WorkerProcess& p_;
  handoff::PagePool pool_;
};

}  // namespace baton::cli
