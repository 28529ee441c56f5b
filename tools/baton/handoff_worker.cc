// `baton handoff-worker`: one rank of a serving stage for `baton bench
// handoff`, in its own process with its own engine — a producer rank
// (ProducerWorker: pages the bench generates KV into) or a consumer rank
// (ConsumerWorker: pages it loads into). The bench keeps both page tables,
// as a serving scheduler keeps its workers' block table: a worker holds
// the memory and checks that pages lie inside it. Driven by JSON lines on stdin
// (handoff_wire.h); answers and load completions go to stdout (a load is
// not answered: its completion is the answer). Calls are
// answered on the reading thread; loads run in order on a loader thread, so
// an allocation never waits behind a copy. Exits when stdin closes.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <deque>
#include <iostream>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/core.h>

#include "baton/engine/engine.h"
#include "baton/handoff/kv_pattern.h"
#include "baton/handoff/rank.h"
#include "commands.h"
#include "handoff_wire.h"

namespace baton::cli {
namespace {

using nlohmann::json;

struct WorkerOptions {
  std::string role;
  std::uint64_t page_bytes = 0;
  std::uint32_t pages = 0;
};

class Output {
 public:
  void line(const json& j) { lines({j}); }
  // In one write: the reader on the other end wakes once for all of them.
  void lines(const std::vector<json>& all) {
    std::string text;
    for (const json& j : all) text += j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";  // a bad byte echoed back is replaced, not thrown
    std::lock_guard lock(mutex_);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }

 private:
  std::mutex mutex_;
};

// The consumer's loads, in order, on their own thread; completions are
// written as they end, or held while the rank is told to stall. The thread
// sleeps on the engine's batch event fd and its own eventfd for new work:
// a timed poll of pending loads took a core's share from the copies on a
// machine where the ranks share few cores.
class Loader {
 public:
  Loader(engine::Engine& engine, handoff::ConsumerWorker& worker, Output& out)
      : engine_(engine), worker_(worker), out_(out), thread_([this] { run(); }) {}
  ~Loader() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    notify();
    thread_.join();
    if (work_fd_ >= 0) ::close(work_fd_);
  }
  void load(handoff::LoadOrder order) { push({std::move(order), {}, 0}); }
  // Plain engine batches of the same orders (the baseline): answered with
  // `id` once every batch ended.
  void raw(std::vector<handoff::LoadOrder> orders, std::uint64_t id) { push({{}, std::move(orders), id}); }
  void stall(bool on) {
    std::vector<handoff::LoadCompletion> late;
    {
      std::lock_guard lock(mutex_);
      stalled_ = on;
      if (!on) late.swap(held_);
    }
    for (const auto& c : late) out_.line({{"completion", to_json(c)}});
  }

 private:
  struct Work {
    handoff::LoadOrder order;
    std::vector<handoff::LoadOrder> raw;
    std::uint64_t raw_id = 0;
  };
  void push(Work w) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(w));
    }
    notify();
  }
  void notify() {
    const std::uint64_t one = 1;
    (void)!::write(work_fd_, &one, sizeof one);
  }
  // Until new work is queued or a batch ends (either fd readable); where
  // the kernel refused either eventfd, a 1 ms poll instead.
  void sleep() {
    pollfd fds[2] = {{work_fd_, POLLIN, 0}, {engine_.batch_event_fd(), POLLIN, 0}};
    if (::poll(fds, 2, fds[0].fd < 0 || fds[1].fd < 0 ? 1 : 1000) <= 0) return;
    std::uint64_t count = 0;
    for (const pollfd& f : fds) {
      if (f.fd >= 0 && (f.revents & POLLIN) != 0) (void)!::read(f.fd, &count, sizeof count);
    }
  }

  void emit(std::vector<handoff::LoadCompletion> done) {
    std::unique_lock lock(mutex_);
    pending_ -= done.size();
    if (stalled_) {
      held_.insert(held_.end(), done.begin(), done.end());
      return;
    }
    lock.unlock();
    if (done.empty()) return;
    std::vector<json> lines;
    for (const auto& c : done) lines.push_back({{"completion", to_json(c)}});
    out_.lines(lines);
  }

  void run_raw(const Work& w) {
    std::vector<engine::BatchHandle> handles;
    Status status;
    for (const auto& order : w.raw) {
      auto batch = worker_.batch_for(order);
      if (batch) {
        if (auto s = worker_.connect_sources(order); !s.is_ok()) batch = std::unexpected(s);
      }
      auto h = batch ? engine_.submit(*batch) : Result<engine::BatchHandle>(std::unexpected(batch.error()));
      if (!h) {
        status = h.error();
        break;
      }
      handles.push_back(*h);
    }
    for (auto h : handles) {
      if (auto s = engine_.wait(h, 600'000'000'000); !s.is_ok() && status.is_ok()) status = s;
      (void)engine_.release(h);
    }
    out_.line({{"id", w.raw_id}, {"status", to_json(status)}});
  }

  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      if (!queue_.empty()) {
        Work w = std::move(queue_.front());
        queue_.pop_front();
        if (w.raw_id == 0) ++pending_;
        lock.unlock();
        if (w.raw_id != 0) {
          run_raw(w);
        } else {
          // Completions go out together once the queue is drained (below),
          // or every kEmitEvery loads while it is not: a write per load woke
          // the orchestrator's reader once per load.
          if (auto s = worker_.load(w.order); !s.is_ok()) emit({{w.order.ticket, w.order.row, w.order.rank, s}});
          if (++loads_unreported_ >= kEmitEvery) {
            emit(worker_.take_completions());
            loads_unreported_ = 0;
          }
        }
        lock.lock();
        continue;
      }
      if (stop_ && pending_ == 0) {
        // stdin closed: completions a stall still holds go out, not lost.
        std::vector<handoff::LoadCompletion> late;
        late.swap(held_);
        lock.unlock();
        std::vector<json> lines;
        for (const auto& c : late) lines.push_back({{"completion", to_json(c)}});
        if (!lines.empty()) out_.lines(lines);
        return;
      }
      lock.unlock();
      if (pending_ > 0) emit(worker_.take_completions());  // every load that ended since the queue was last empty
      loads_unreported_ = 0;
      sleep();  // resets the fds only after it woke, then looks again: no wakeup is lost
      lock.lock();
    }
  }

  engine::Engine& engine_;
  handoff::ConsumerWorker& worker_;
  Output& out_;
  std::mutex mutex_;
  std::deque<Work> queue_;
  static constexpr int kEmitEvery = 16;
  std::size_t pending_ = 0;
  int loads_unreported_ = 0;  // the loader thread's alone
  bool stop_ = false;
  bool stalled_ = false;
  std::vector<handoff::LoadCompletion> held_;
  const int work_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::thread thread_;  // last: starts once the rest exists
};

// The spans of `pages` of a worker, or an error for one outside its pool.
template <typename Worker>
Result<std::vector<std::span<std::byte>>> spans(const Worker& worker, const std::vector<std::uint32_t>& pages) {
  std::vector<std::span<std::byte>> out;
  for (auto p : pages) {
    auto s = worker.page(p);
    if (s.empty()) return std::unexpected(Status::out_of_range("page {} is outside the pool", p));
    out.push_back(s);
  }
  return out;
}

template <typename Worker>
Status pattern_call(const Worker& worker, const json& j, bool fill) {
  auto layout = layout_from_json(j.at("layout"));
  if (!layout) return layout.error();
  auto s = spans(worker, wire_u32_list(j, "pages"));
  if (!s) return s.error();
  handoff::RankPages pages{*layout, wire_u32(j, "rank"), wire_u32(j, "tokens"), wire_u32(j, "row"), *s};
  const auto salt = wire_u64(j, "salt");
  return fill ? handoff::fill_kv(pages, salt) : handoff::check_kv(pages, salt);
}

int run_worker(const WorkerOptions& o) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the bench
  auto engine = engine::Engine::create({});
  if (!engine) {
    fmt::print(stderr, "baton handoff-worker: {}\n", engine.error().to_string());
    return 1;
  }
  Output out;
  std::unique_ptr<handoff::ProducerWorker> producer;
  std::unique_ptr<handoff::ConsumerWorker> consumer;
  std::unique_ptr<Loader> loader;
  engine::RegionHandle region = 0;
  if (o.role == "producer") {
    auto w = handoff::ProducerWorker::create(**engine, o.page_bytes, o.pages);
    if (!w) {
      fmt::print(stderr, "baton handoff-worker: {}\n", w.error().to_string());
      return 1;
    }
    producer = std::move(*w);
    region = producer->region();
  } else {
    // The bench keeps the consumer's page table, as a serving scheduler does.
    auto w = handoff::ConsumerWorker::create(**engine, o.page_bytes, o.pages, handoff::PageTable::kCaller);
    if (!w) {
      fmt::print(stderr, "baton handoff-worker: {}\n", w.error().to_string());
      return 1;
    }
    consumer = std::move(*w);
    loader = std::make_unique<Loader>(**engine, *consumer, out);
  }
  out.line({{"address", (*engine)->address()}, {"region", region}, {"pid", ::getpid()}});

  std::string text;
  while (std::getline(std::cin, text)) {
    // nlohmann stops at a NUL byte and would take the text before it.
    json j = text.find('\0') == std::string::npos ? json::parse(text, nullptr, /*allow_exceptions=*/false)
                                                  : json(json::value_t::discarded);
    if (j.is_discarded() || !j.is_object()) {
      out.line({{"status", to_json(Status::invalid_argument("not a JSON object: {}", text.substr(0, 80)))}});
      continue;
    }
    json answer = json::object();
    try {
      const std::uint64_t id = j.contains("id") ? wire_u64(j, "id") : 0;
      answer["id"] = id;
      const std::string op = j.at("op").get<std::string>();
      Status status;
      if (op == "fill" && producer) {
        status = pattern_call(*producer, j, /*fill=*/true);
      } else if (op == "check" && consumer) {
        status = pattern_call(*consumer, j, /*fill=*/false);
      } else if (op == "load" && consumer) {
        // Not answered: a refused order ends as its load's completion.
        auto order = order_from_json(j.at("order"));
        if (order) {
          loader->load(std::move(*order));
        } else {
          // Reported on the order's ticket only when it names one exactly: a
          // ticket of 1.5 read as 1 would end another request's load.
          const json& o = j.at("order");
          json line;
          try {
            line = {{"completion", to_json(handoff::LoadCompletion{wire_u64(o, "ticket"), wire_u32(o, "row"),
                                                                    wire_u32(o, "rank"), order.error()})}};
          } catch (const json::exception&) {
            line = {{"status", to_json(Status::invalid_argument(
                                   "load: {} (and no ticket, row and rank to report it on)", order.error().message()))}};
          }
          out.line(line);
        }
        continue;
      } else if (op == "raw" && consumer && id == 0) {
        status = Status::invalid_argument("raw needs an \"id\" of 1 or more: its answer carries it");
      } else if (op == "raw" && consumer) {
        std::vector<handoff::LoadOrder> orders;
        if (!j.at("orders").is_array()) throw WireError("\"orders\" is not an array");
        for (const auto& item : j.at("orders")) {
          auto order = order_from_json(item);
          if (!order) {
            status = order.error();
            break;
          }
          orders.push_back(std::move(*order));
        }
        if (status.is_ok()) {
          loader->raw(std::move(orders), id);
          continue;  // answered by the loader
        }
      } else if (op == "stall" && consumer) {
        loader->stall(j.at("on").get<bool>());
      } else if (op == "ping") {
        // Answered: the process runs (a stalled loader still answers).
      } else {
        status = Status::invalid_argument("unknown op \"{}\" for a {}", op.substr(0, 80), o.role);
      }
      answer["status"] = to_json(status);
    } catch (const json::exception& e) {
      answer["status"] = to_json(Status::invalid_argument("{}", wire_message(e)));
    }
    out.line(answer);
  }
  loader.reset();
  consumer.reset();
  producer.reset();
  (*engine)->shutdown();
  return 0;
}

}  // namespace

Command add_handoff_worker_command(CLI::App& parent) {
  auto opts = std::make_shared<WorkerOptions>();
  CLI::App* app = parent.add_subcommand("handoff-worker",
                                        "(internal) one producer or consumer rank of `baton bench handoff`, driven "
                                        "by JSON lines on stdin");
  app->add_option("--role", opts->role, "producer or consumer")->required()->check(CLI::IsMember({"producer", "consumer"}));
  // Integer ranges: CLI::PositiveNumber's message printed the bound as a
  // 300-digit double.
  app->add_option("--page-bytes", opts->page_bytes, "bytes per page")
      ->required()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app->add_option("--pages", opts->pages, "pages in the pool")
      ->required()
      ->check(CLI::Range(std::uint32_t{1}, std::numeric_limits<std::uint32_t>::max()));
  return {app, [opts] { return run_worker(*opts); }};
}

}  // namespace baton::cli
