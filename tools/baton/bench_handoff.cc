// `baton bench handoff --spawn`: KV handed from producer replicas to
// consumer replicas, one process per rank (`baton handoff-worker`), through
// the handoff orchestrator, every byte checked; next to the same bytes moved
// by plain engine batches (the same reads, from the same source pages,
// without tickets, pools or completions) in the same run.
//
// Requests go in waves of --window: the producers generate a wave's KV
// (untimed: that is prefill's work), then the wave is moved twice — plain
// batches into scratch pages, and handoffs — in alternating order, each
// timed from its first message to its last answer.
#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "baton/common/stats.h"
#include "baton/common/units.h"
#include "baton/engine/metrics.h"
#include "baton/handoff/orchestrator.h"
#include "commands.h"
#include "handoff_remote.h"
#include "handoff_wire.h"
#include "json_output.h"

namespace baton::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct HandoffOptions {
  bool spawn = false;
  std::uint32_t producers = 2, producer_tp = 2, producer_sp = 1;
  std::uint32_t consumers = 2, consumer_tp = 2, consumer_sp = 1;
  std::uint32_t cfg = 1;
  std::uint32_t requests = 200, tokens = 256, window = 16;
  std::uint32_t layers = 32, kv_heads = 8, head_dim = 128, dtype_bytes = 2, page_tokens = 16;
  std::string order = "hnd";
  std::string timeout = "60s";
  bool timeout_given = false;  // --timeout named on the command line
  std::string worker_timeout = "60s";
  std::int64_t kill_producer_at = -1;
  std::int64_t kill_consumer_at = -1;
  std::int64_t stop_consumer_at = -1;
  std::int64_t stall_consumer_rank = -1;
  std::uint32_t cancel_every = 0;
  std::string json;
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One wave's two passes: seconds and bytes of each.
struct WaveTimes {
  double raw_s, handoff_s, raw_bytes, handoff_bytes;
};

// How far overhead_ratio could move by chance: a 95% bootstrap interval
// over the waves (2000 resamples, fixed seed). On a machine where the ranks
// share few cores one wave in five is slowed by scheduling, in either pass;
// an interval that holds 0.01 says the figure cannot tell 1% from parity.
// Each wave's two pass times, [plain ms, handoff ms]: where the noise is.
json waves_ms(const std::vector<WaveTimes>& waves) {
  json out = json::array();
  for (const WaveTimes& w : waves) out.push_back({w.raw_s * 1e3, w.handoff_s * 1e3});
  return out;
}

// Null where there is nothing to resample (fewer than two waves, or no
// handoff bytes in any): no interval stands in for a missing sample.
json overhead_ci95(const std::vector<WaveTimes>& waves) {
  if (waves.size() < 2) return nullptr;
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::size_t> pick(0, waves.size() - 1);
  std::vector<double> overheads;
  for (int b = 0; b < 2000; ++b) {
    WaveTimes sum{0, 0, 0, 0};
    for (std::size_t i = 0; i < waves.size(); ++i) {
      const WaveTimes& w = waves[pick(rng)];
      sum = {sum.raw_s + w.raw_s, sum.handoff_s + w.handoff_s, sum.raw_bytes + w.raw_bytes,
             sum.handoff_bytes + w.handoff_bytes};
    }
    if (sum.raw_bytes > 0 && sum.handoff_s > 0) {
      overheads.push_back(1.0 - (sum.handoff_bytes / sum.handoff_s) / (sum.raw_bytes / sum.raw_s));
    }
  }
  const auto low = percentile(overheads, 2.5), high = percentile(overheads, 97.5);
  if (!low || !high) return nullptr;
  return json::array({*low, *high});
}

// A figure or null (the report says "n/a"): a sample that is empty has none.
json or_null(const Result<double>& v) {
  return v ? json(*v) : json(nullptr);
}

std::string text_of(const json& v, const char* format) {
  return v.is_null() ? std::string("n/a") : fmt::format(fmt::runtime(format), v.get<double>());
}

struct Replica {
  std::string name;
  handoff::KvLayout layout;
  std::vector<std::unique_ptr<WorkerProcess>> processes;
  std::vector<std::unique_ptr<RemoteProducerRank>> producer_ranks;
  std::vector<std::unique_ptr<RemoteConsumerRank>> consumer_ranks;
  std::vector<std::vector<std::uint32_t>> scratch;  // consumer: raw baseline pages per rank
  bool failed = false;
};

struct Request {
  handoff::TicketId ticket = 0;
  std::uint32_t consumer = 0;
  bool generated = false;
  bool started = false;
  std::optional<Status> final;  // every request ends with one
  double ms = 0;
  bool verified = false;
};

class Bench {
 public:
  explicit Bench(const HandoffOptions& o) : o_(o) {}
  int run();

 private:
  int fail(int code, const std::string& why) {
    fmt::print(stderr, "baton bench handoff: {}\n", why);
    return code;
  }
  Status spawn();
  Status generate(Request& r, std::uint32_t index);
  Clock::duration raw_pass(const std::vector<std::uint32_t>& wave, std::uint64_t* bytes);
  Clock::duration handoff_pass(const std::vector<std::uint32_t>& wave);
  std::pair<Clock::duration, Clock::duration> run_wave(const std::vector<std::uint32_t>& wave, std::uint32_t wave_no,
                                                       std::uint64_t* raw_bytes);
  void verify(Request& r, std::uint32_t index);
  void notice_deaths();
  // A rank that died, or did not answer a call within call_timeout_ms_ (a
  // stopped or wedged process: killed here, so it cannot write later): its
  // replica stops for the orchestrator and the bench.
  void fail_rank(Replica& replica, std::size_t rank, const Status& why);
  // waits for a call's answer; a rank that does not answer in time fails.
  Status wait_call(Replica& replica, std::size_t rank, std::uint64_t id);
  // Asks every rank of a replica that has not failed to answer.
  void ping(Replica& replica);
  // Tickets that can still settle: timed out, cancelled, failed or loading,
  // on a consumer replica that did not fail.
  [[nodiscard]] bool settling();
  int call_timeout_ms_ = 60'000;  // --worker-timeout
  static constexpr std::uint32_t kWarmupWaves = 2;
  static constexpr std::uint64_t kMaxWorkers = 128;
  std::uint64_t retained();
  std::uint64_t row_bytes() const { return std::uint64_t{pl_.pages_for(o_.tokens)} * pl_.page_bytes() * pl_.tp; }

  const HandoffOptions& o_;
  handoff::KvLayout pl_, cl_;
  TimeNs timeout_ns_ = 0;
  engine::MetricsRegistry metrics_;
  std::unique_ptr<handoff::Orchestrator> orch_;
  std::vector<Replica> producers_, consumers_;
  std::vector<Request> requests_;
  std::uint32_t next_producer_ = 0;
  std::uint64_t retained_peak_ = 0;
  std::uint64_t bytes_done_ = 0;
  bool baseline_failed_ = false;  // the plain-batch pass: its figure is not a baseline then
};

Status Bench::spawn() {
  const std::uint32_t total = pl_.pages_for(o_.tokens);
  std::uint32_t per_producer_rank = 0, per_consumer_rank = 0;
  for (std::uint32_t r = 0; r < pl_.ranks(); ++r) per_producer_rank = std::max(per_producer_rank, pl_.rank_pages(r, total));
  for (std::uint32_t r = 0; r < cl_.ranks(); ++r) per_consumer_rank = std::max(per_consumer_rank, cl_.rank_pages(r, total));
  // A producer may carry a whole wave when the other died, besides a wave
  // of sources held by retained tickets; a consumer holds a wave of
  // handoffs and a wave of scratch pages for the baseline.
  const std::uint64_t producer_wide = std::uint64_t{2} * o_.window * o_.cfg * per_producer_rank;
  const std::uint64_t consumer_wide = std::uint64_t{2} * o_.window * o_.cfg * per_consumer_rank;
  if (producer_wide > UINT32_MAX || consumer_wide > UINT32_MAX) {  // 32-bit page ids
    return Status::invalid_argument("a rank's pool would hold {} pages (at most {}): lower --window or --tokens",
                                    std::max(producer_wide, consumer_wide), UINT32_MAX);
  }
  const auto producer_pages = static_cast<std::uint32_t>(producer_wide);
  const auto consumer_pages = static_cast<std::uint32_t>(consumer_wide);
  for (std::uint32_t p = 0; p < o_.producers; ++p) {
    Replica rep{fmt::format("p{}", p), pl_, {}, {}, {}, {}, false};
    std::vector<handoff::ProducerRank*> ranks;
    for (std::uint32_t r = 0; r < pl_.ranks(); ++r) {
      auto w = WorkerProcess::start("producer", pl_.page_bytes(), producer_pages, call_timeout_ms_);
      if (!w) return w.error();
      rep.producer_ranks.push_back(std::make_unique<RemoteProducerRank>(**w, pl_.page_bytes(), producer_pages));
      ranks.push_back(rep.producer_ranks.back().get());
      rep.processes.push_back(std::move(*w));
    }
    if (auto s = orch_->add_producer(rep.name, pl_, ranks); !s.is_ok()) return s;
    producers_.push_back(std::move(rep));
  }
  for (std::uint32_t c = 0; c < o_.consumers; ++c) {
    Replica rep{fmt::format("c{}", c), cl_, {}, {}, {}, {}, false};
    std::vector<handoff::ConsumerRank*> ranks;
    for (std::uint32_t r = 0; r < cl_.ranks(); ++r) {
      auto w = WorkerProcess::start("consumer", cl_.page_bytes(), consumer_pages, call_timeout_ms_);
      if (!w) return w.error();
      // A rank that dies stops its replica at once: a receive waiting on one
      // of its tickets ends then, not after its timeout (each of the
      // replica's tickets waited its own in turn: minutes at the default).
      (*w)->on_exit([this, name = rep.name, r] {
        (void)orch_->consumer_rank_failed(name, r, Status::unavailable("rank {} exited", r));
      });
      rep.consumer_ranks.push_back(std::make_unique<RemoteConsumerRank>(**w, cl_.page_bytes(), consumer_pages));
      ranks.push_back(rep.consumer_ranks.back().get());
      auto scratch = rep.consumer_ranks.back()->allocate(o_.window * o_.cfg * per_consumer_rank);
      if (!scratch) return scratch.error();
      rep.scratch.push_back(std::move(*scratch));
      rep.processes.push_back(std::move(*w));
    }
    if (auto s = orch_->add_consumer(rep.name, cl_, ranks); !s.is_ok()) return s;
    consumers_.push_back(std::move(rep));
  }
  return Status::ok();
}

void Bench::notice_deaths() {
  for (std::vector<Replica>* replicas : {&producers_, &consumers_}) {
    for (Replica& rep : *replicas) {
      for (std::size_t r = 0; r < rep.processes.size() && !rep.failed; ++r) {
        if (!rep.processes[r]->alive()) fail_rank(rep, r, Status::unavailable("exited"));
      }
    }
  }
}

void Bench::fail_rank(Replica& replica, std::size_t rank, const Status& why) {
  if (replica.failed) return;
  replica.failed = true;
  WorkerProcess& p = *replica.processes[rank];
  p.kill();
  const Status s = Status::unavailable("rank {} (pid {}): {}", rank, p.pid(), why.to_string());
  if (replica.consumer_ranks.empty()) {
    (void)orch_->producer_failed(replica.name, s);
  } else {
    (void)orch_->consumer_rank_failed(replica.name, static_cast<std::uint32_t>(rank), s);
  }
  // Said whatever failed it; the verdict fails the run unless a fault flag
  // of ours did.
  fmt::print(stderr, "baton bench handoff: {} {} failed: {}\n",
             replica.consumer_ranks.empty() ? "producer" : "consumer", replica.name, s.to_string());
}

Status Bench::wait_call(Replica& replica, std::size_t rank, std::uint64_t id) {
  Status s = replica.processes[rank]->wait(id, nullptr, call_timeout_ms_);
  if (s.code() == StatusCode::kTimeout) fail_rank(replica, rank, s);
  return s;
}

void Bench::ping(Replica& replica) {
  std::vector<std::pair<std::size_t, std::uint64_t>> calls;
  for (std::size_t k = 0; k < replica.processes.size() && !replica.failed; ++k) {
    auto id = replica.processes[k]->send({{"op", "ping"}});
    if (!id) {
      fail_rank(replica, k, id.error());
      return;
    }
    calls.emplace_back(k, *id);
  }
  for (auto [k, id] : calls) {
    if (!replica.failed) (void)wait_call(replica, k, id);
  }
}

bool Bench::settling() {
  notice_deaths();
  constexpr std::array kUnsettled{handoff::TicketState::kTimedOut, handoff::TicketState::kCancelled,
                                  handoff::TicketState::kFailed, handoff::TicketState::kLoading};
  std::uint64_t open = 0;
  for (auto state : kUnsettled) open += orch_->tickets_in(state);
  if (open == 0) return false;
  if (std::ranges::none_of(consumers_, &Replica::failed)) return true;
  // A stopped replica's tickets stay as they are: count only the others'.
  return std::ranges::any_of(requests_, [&](const Request& r) {
    if (r.ticket == 0 || consumers_[r.consumer].failed) return false;
    auto t = orch_->ticket(r.ticket);
    return t && std::ranges::find(kUnsettled, t->state) != kUnsettled.end();
  });
}

std::uint64_t Bench::retained() {
  std::uint64_t n = 0;
  for (auto& c : consumers_) {
    if (auto pages = orch_->pages(c.name)) n += pages->retained;
  }
  retained_peak_ = std::max(retained_peak_, n);
  return n;
}

// Binds a ticket to the next live producer and writes its KV there (every
// rank and row at once).
Status Bench::generate(Request& r, std::uint32_t index) {
  notice_deaths();
  Replica* producer = nullptr;
  for (std::uint32_t k = 0; k < producers_.size() && producer == nullptr; ++k) {
    Replica& p = producers_[(next_producer_ + k) % producers_.size()];
    if (!p.failed) producer = &p;
  }
  if (producer == nullptr) return Status::unavailable("every producer replica failed");
  ++next_producer_;
  if (auto s = orch_->bind(r.ticket, producer->name); !s.is_ok()) return s;
  auto t = orch_->ticket(r.ticket);
  if (!t) return t.error();
  std::vector<std::pair<std::uint32_t, std::uint64_t>> calls;  // rank, call
  for (std::uint32_t w = 0; w < pl_.cfg; ++w) {
    for (std::uint32_t k = 0; k < pl_.ranks(); ++k) {
      auto id = producer->processes[k]->send({{"op", "fill"},
                                              {"layout", to_json(pl_)},
                                              {"rank", k},
                                              {"tokens", o_.tokens},
                                              {"row", w},
                                              {"salt", index + 1},
                                              {"pages", t->sources[w][k].pages}});
      if (!id) return id.error();
      calls.emplace_back(k, *id);
    }
  }
  Status status;
  for (auto [k, id] : calls) {
    if (auto s = wait_call(*producer, k, id); !s.is_ok() && status.is_ok()) status = s;
  }
  if (!status.is_ok()) return status;
  return orch_->generated(r.ticket);
}

Clock::duration Bench::raw_pass(const std::vector<std::uint32_t>& wave, std::uint64_t* bytes) {
  // Per consumer rank, the same orders a handoff gives it, into scratch pages.
  struct Order {
    std::uint32_t consumer, rank;
    handoff::LoadOrder order;
  };
  std::vector<Order> plain;
  std::vector<std::uint32_t> slot(consumers_.size(), 0);
  const std::uint32_t total = cl_.pages_for(o_.tokens);
  for (std::uint32_t i : wave) {
    Request& r = requests_[i];
    if (!r.generated || consumers_[r.consumer].failed) continue;
    auto t = orch_->ticket(r.ticket);
    if (!t) continue;
    const std::uint32_t s = slot[r.consumer]++;
    Replica& c = consumers_[r.consumer];
    for (std::uint32_t w = 0; w < cl_.cfg; ++w) {
      for (std::uint32_t k = 0; k < cl_.ranks(); ++k) {
        const std::uint32_t n = cl_.rank_pages(k, total);
        if (n == 0) continue;  // an sp group holding none of a short request's pages: nothing to move
        const auto first = c.scratch[k].begin() + (s * cl_.cfg + w) * n;
        plain.push_back({r.consumer, k, {r.ticket, w, o_.tokens, pl_, cl_, k, t->sources[w], {first, first + n}, 0}});
      }
      *bytes += row_bytes();
    }
  }
  // Encoding the orders is on the clock, as a handoff's is: both cross the
  // same pipes; what differs is tickets, page tables and completions.
  const auto start = Clock::now();
  std::map<std::pair<std::uint32_t, std::uint32_t>, json> orders;
  for (const Order& o : plain) orders[{o.consumer, o.rank}].push_back(to_json(o.order));
  std::vector<std::pair<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t>> calls;  // (consumer, rank), call
  for (auto& [key, list] : orders) {
    WorkerProcess* p = consumers_[key.first].processes[key.second].get();
    if (auto id = p->send({{"op", "raw"}, {"orders", list}})) calls.emplace_back(key, *id);
  }
  for (auto [key, id] : calls) {
    if (auto s = wait_call(consumers_[key.first], key.second, id); !s.is_ok()) {
      fmt::print(stderr, "baseline batch: {}\n", s.to_string());
      baseline_failed_ = true;
    }
  }
  return Clock::now() - start;
}

Clock::duration Bench::handoff_pass(const std::vector<std::uint32_t>& wave) {
  const auto start = Clock::now();
  for (std::uint32_t i : wave) {
    Request& r = requests_[i];
    if (r.final || !r.generated) continue;
    if (auto s = orch_->start(r.ticket); !s.is_ok()) {
      r.final = s;  // nothing dispatched: rolled back
      (void)orch_->cancel(r.ticket);
      continue;
    }
    r.started = true;
    if (i < o_.requests && o_.kill_producer_at == static_cast<std::int64_t>(i)) {
      auto t = orch_->ticket(r.ticket);
      for (auto& p : producers_) {
        if (t && p.name == t->producer) p.processes[0]->kill();
      }
    }
    if (i < o_.requests && o_.stop_consumer_at == static_cast<std::int64_t>(i)) {
      // Wedged, not dead: found by --worker-timeout (an order it does not
      // take, a call or ping it does not answer), then killed.
      consumers_[r.consumer].processes[0]->stop();
    }
    if (i < o_.requests && o_.kill_consumer_at == static_cast<std::int64_t>(i)) {
      consumers_[r.consumer].processes[0]->kill();  // its receive below must end, not wait out its timeout
    }
    if (i < o_.requests && o_.cancel_every > 0 && (i + 1) % o_.cancel_every == 0) {
      auto s = orch_->cancel(r.ticket);
      r.final = s.is_ok() ? Status::cancelled("cancelled by the bench") : s;
    }
  }
  retained();  // cancels retain pages here, with no receive after them
  for (std::uint32_t i : wave) {
    Request& r = requests_[i];
    if (!r.started || r.final) continue;
    Status s = orch_->receive(r.ticket);
    // A receive ends at its ticket's timeout whether the consumer is slow
    // or stopped; a stopped one would cost each of its tickets that timeout
    // in turn (with the default 60 s, hours). One that does not answer a
    // ping within --worker-timeout fails, and its other receives end at once.
    if (s.code() == StatusCode::kTimeout) ping(consumers_[r.consumer]);
    // From dispatch to the last rank's completion, as the orchestrator saw
    // it (not when this loop got round to the ticket).
    if (auto t = orch_->ticket(r.ticket); t && t->ended_ns > 0) r.ms = static_cast<double>(t->ended_ns - t->started_ns) / 1e6;
    r.final = s;
    if (s.is_ok() && i < o_.requests) bytes_done_ += row_bytes() * cl_.cfg;
    retained();
  }
  return Clock::now() - start;
}

void Bench::verify(Request& r, std::uint32_t index) {
  auto t = orch_->ticket(r.ticket);
  if (!t) return;
  Replica& c = consumers_[r.consumer];
  std::vector<std::pair<std::uint32_t, std::uint64_t>> calls;  // rank, call
  bool sent = !c.failed;
  for (std::uint32_t w = 0; w < cl_.cfg && sent; ++w) {
    for (std::uint32_t k = 0; k < cl_.ranks(); ++k) {
      auto id = c.processes[k]->send({{"op", "check"},
                                      {"layout", to_json(cl_)},
                                      {"rank", k},
                                      {"tokens", o_.tokens},
                                      {"row", w},
                                      {"salt", index + 1},
                                      {"pages", t->destination[w][k]}});
      if (!id) {
        sent = false;
        break;
      }
      calls.emplace_back(k, *id);
    }
  }
  bool ok = sent;
  bool rank_gone = !sent;
  bool wrong = false;
  for (auto [k, id] : calls) {
    if (auto s = wait_call(c, k, id); !s.is_ok()) {
      ok = false;
      // A rank that exited (--kill-consumer-at lands after the loads it
      // answered) cannot be asked: its KV died with it, no byte was wrong.
      // A wrong answer, or no answer in time, is the check failing.
      if (!c.processes[k]->alive() && s.code() == StatusCode::kUnavailable) {
        rank_gone = true;
      } else {
        wrong = true;
        fmt::print(stderr, "request {}: data check FAILED: {}\n", index, s.to_string());
      }
    }
  }
  r.verified = ok;
  if (rank_gone && !wrong) {
    r.final = Status::unavailable("request {}: a rank of consumer {} died after loading it, before its bytes were "
                                  "checked",
                                  index, c.name);
  }
}

// Generates a wave, moves it both ways (alternating which goes first),
// checks and finishes what completed: the two passes' times.
std::pair<Clock::duration, Clock::duration> Bench::run_wave(const std::vector<std::uint32_t>& wave,
                                                          std::uint32_t wave_no, std::uint64_t* raw_bytes) {
  for (std::uint32_t i : wave) {
    Request& r = requests_[i];
    // The warm-up's requests (after the counted ones) pair consumers and
    // producers as the counted waves will: see run().
    r.consumer = (i >= o_.requests ? i - o_.requests : i) % o_.consumers;
    auto ticket = orch_->create_ticket({fmt::format("req-{}", i), consumers_[r.consumer].name, o_.tokens});
    if (!ticket) {
      r.final = ticket.error();
      continue;
    }
    r.ticket = *ticket;
    if (auto s = generate(r, i); !s.is_ok()) {
      r.final = s;
      (void)orch_->cancel(r.ticket);
      continue;
    }
    r.generated = true;
  }
  Clock::duration raw{}, handoff{};
  if (wave_no % 2 == 0) {
    raw = raw_pass(wave, raw_bytes);
    handoff = handoff_pass(wave);
  } else {
    handoff = handoff_pass(wave);
    raw = raw_pass(wave, raw_bytes);
  }
  for (std::uint32_t i : wave) {
    Request& r = requests_[i];
    if (r.final && r.final->is_ok()) {
      verify(r, i);
      if (auto s = orch_->finish(r.ticket); !s.is_ok() && r.final->is_ok()) {
        fmt::print(stderr, "finish {}: {}\n", i, s.to_string());
      }
    }
  }
  notice_deaths();
  orch_->progress();
  orch_->forget_released();
  return {raw, handoff};
}

int Bench::run() {
  if (!o_.spawn) return fail(2, "--spawn is required: the bench starts one process per rank itself");
  if (o_.order != "hnd" && o_.order != "nhd") return fail(2, fmt::format("--order \"{}\": expected hnd or nhd", o_.order));
  auto timeout = parse_flag_duration(o_.timeout);
  if (!timeout || *timeout <= 0) return fail(2, fmt::format("--timeout \"{}\": expected a positive duration", o_.timeout));
  timeout_ns_ = *timeout;
  auto worker_timeout = parse_duration(o_.worker_timeout);
  if (!worker_timeout || *worker_timeout < 1'000'000 || *worker_timeout > 3'600'000'000'000) {
    return fail(2, fmt::format("--worker-timeout \"{}\": expected 1ms .. 1h", o_.worker_timeout));
  }
  call_timeout_ms_ = static_cast<int>(*worker_timeout / 1'000'000);
  const handoff::KvOrder order = o_.order == "hnd" ? handoff::KvOrder::kHnd : handoff::KvOrder::kNhd;
  pl_ = {o_.layers, o_.kv_heads, o_.head_dim * o_.dtype_bytes, o_.page_tokens, order, o_.producer_tp, o_.producer_sp,
         o_.cfg};
  cl_ = {o_.layers, o_.kv_heads, o_.head_dim * o_.dtype_bytes, o_.page_tokens, order, o_.consumer_tp, o_.consumer_sp,
         o_.cfg};
  auto plan = handoff::ReshapePlan::compute(pl_, cl_);
  if (!plan) return fail(2, plan.error().message());
  // Each consumer rank loads its pages as one engine batch: a layout that
  // cuts them into more requests than a load takes would fail every
  // request at run time.
  const std::uint32_t pages = cl_.pages_for(o_.tokens);
  for (std::uint32_t r = 0; r < cl_.ranks(); ++r) {
    const std::uint64_t pieces = plan->runs(r % cl_.tp).size();
    if (const std::uint64_t most = std::uint64_t{cl_.rank_pages(r, pages)} * pieces;
        most > handoff::ConsumerWorker::kMaxLoadRequests) {
      return fail(2, fmt::format("consumer rank {} would load {} pages of {} pieces each, {} engine requests (at most "
                                 "{}): fewer --tokens, larger heads (--head-dim, --dtype-bytes), or one --order",
                                 r, cl_.rank_pages(r, pages), pieces, most, handoff::ConsumerWorker::kMaxLoadRequests));
    }
  }
  // One process per rank, each with an engine (tens of MB): the flags'
  // ranges allowed 16 replicas of 16 × 16 ranks a side, 8192 processes.
  const std::uint64_t processes = std::uint64_t{o_.producers} * pl_.ranks() + std::uint64_t{o_.consumers} * cl_.ranks();
  if (processes > kMaxWorkers) {
    return fail(2, fmt::format("{} rank processes ({} producers × {} ranks + {} consumers × {} ranks; at most {})",
                               processes, o_.producers, pl_.ranks(), o_.consumers, cl_.ranks(), kMaxWorkers));
  }
  if (o_.stall_consumer_rank >= static_cast<std::int64_t>(cl_.ranks())) {
    return fail(2, fmt::format("--stall-consumer-rank {}: a consumer replica has ranks 0..{}", o_.stall_consumer_rank,
                               cl_.ranks() - 1));
  }
  if (o_.stall_consumer_rank >= 0 && !o_.timeout_given) {
    // Each of the stalled rank's tickets waits the timeout in full, one
    // receive after another: at the default 60 s a run takes hours.
    return fail(2, "--stall-consumer-rank needs a --timeout too (each stalled ticket waits it in full), e.g. 200ms");
  }
  for (auto [flag, at] : {std::pair{"--kill-producer-at", o_.kill_producer_at},
                          {"--kill-consumer-at", o_.kill_consumer_at}, {"--stop-consumer-at", o_.stop_consumer_at}}) {
    if (at >= static_cast<std::int64_t>(o_.requests)) {
      return fail(2, fmt::format("{} {}: there are {} requests", flag, at, o_.requests));
    }
  }
  // Sources (two waves), destinations and scratch: four waves in memfd
  // pages (RAM). Checked: a wave of 2^62 bytes made four of them 0.
  std::uint64_t wave_bytes = 0;
  if (__builtin_mul_overflow(std::uint64_t{o_.window} * o_.cfg, row_bytes(), &wave_bytes) ||
      wave_bytes > (std::uint64_t{6} << 30) / 4) {
    return fail(2, fmt::format("a wave of {} requests holds {} MiB four times over (sources and retained sources, "
                               "destinations, baseline); lower --window or --tokens to stay under 6 GiB",
                               o_.window, wave_bytes >> 20));
  }
  orch_ = std::make_unique<handoff::Orchestrator>(handoff::HandoffConfig{.transfer_timeout_ns = timeout_ns_, .metrics = &metrics_});
  if (auto s = spawn(); !s.is_ok()) return fail(1, s.to_string());

  // Two untimed waves first (indices after the counted ones), pairing
  // consumer and producer replicas as the counted waves do: a consumer rank
  // connects to a producer rank and maps its pages on its first read from
  // it, and the pools hold two waves of pages. With an odd --requests the
  // one warm-up wave there was had paired them the other way round, and
  // the first counted plain pass paid every connect and mapping (300-1400
  // ms a rank: --requests 17 gave an "overhead" of -18).
  requests_.resize(o_.requests + kWarmupWaves * o_.window);
  std::uint64_t ignored = 0;
  for (std::uint32_t w = 0; w < kWarmupWaves; ++w) {
    std::vector<std::uint32_t> warmup;
    for (std::uint32_t i = 0; i < o_.window; ++i) warmup.push_back(o_.requests + w * o_.window + i);
    (void)run_wave(warmup, w, &ignored);
  }
  next_producer_ = 0;
  if (o_.stall_consumer_rank >= 0) {
    WorkerProcess& stalled = *consumers_[0].processes[o_.stall_consumer_rank];
    if (auto s = stalled.call({{"op", "stall"}, {"on", true}}, nullptr, call_timeout_ms_); !s.is_ok()) {
      return fail(1, s.to_string());
    }
  }
  Clock::duration raw_time{}, handoff_time{};
  std::uint64_t raw_bytes = 0;
  std::vector<double> wave_ratios;  // handoff GB/s over plain GB/s, per wave (noise shows here)
  std::vector<WaveTimes> waves;
  for (std::uint32_t first = 0, wave_no = 0; first < o_.requests; first += o_.window, ++wave_no) {
    std::vector<std::uint32_t> wave;
    for (std::uint32_t i = first; i < std::min(o_.requests, first + o_.window); ++i) wave.push_back(i);
    const std::uint64_t raw_before = raw_bytes, handoff_before = bytes_done_;
    const auto [raw, handoff] = run_wave(wave, wave_no, &raw_bytes);
    raw_time += raw;
    handoff_time += handoff;
    wave_ratios.push_back(seconds(raw) / seconds(handoff));
    waves.push_back({seconds(raw), seconds(handoff), static_cast<double>(raw_bytes - raw_before),
                     static_cast<double>(bytes_done_ - handoff_before)});
  }

  // The stalled rank's late completions arrive; every retained page returns.
  if (o_.stall_consumer_rank >= 0) {
    WorkerProcess& stalled = *consumers_[0].processes[o_.stall_consumer_rank];
    (void)stalled.call({{"op", "stall"}, {"on", false}}, nullptr, call_timeout_ms_);
  }
  const auto settle_by = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < settle_by && settling()) {
    orch_->progress();
    retained();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const std::uint64_t retained_at_end = retained();
  const Status stopped = orch_->shutdown();

  // Pages neither in use nor free: every ticket ended, so each page table
  // should be whole once the baseline's scratch pages are back. A failed
  // consumer's pages are left as they were (a remote may still write
  // them), and so are the sources of its tickets: counted apart.
  std::uint64_t leaked = 0, stopped_pages = 0;
  std::string consumer_failed;
  for (auto& c : consumers_) {
    for (std::size_t k = 0; k < c.processes.size(); ++k) {
      (void)c.consumer_ranks[k]->free(c.scratch[k]);
      const handoff::PagePool& pool = c.consumer_ranks[k]->pool();
      (c.failed ? stopped_pages : leaked) += pool.pages() - pool.free_pages();
    }
    if (c.failed && consumer_failed.empty()) consumer_failed = c.name;
  }
  std::string producer_failed;
  for (const Replica& p : producers_) {
    if (p.failed && producer_failed.empty()) producer_failed = p.name;
  }
  for (auto& p : producers_) {
    for (auto& rank : p.producer_ranks) leaked += rank->pool().pages() - rank->pool().free_pages();
  }
  if (!consumer_failed.empty()) {
    // A failed consumer's tickets keep their source pages too.
    for (const Request& r : requests_) {
      if (r.ticket == 0 || !consumers_[r.consumer].failed) continue;
      auto t = orch_->ticket(r.ticket);
      if (!t || t->state == handoff::TicketState::kReleased) continue;
      for (const auto& row : t->sources) {
        for (const handoff::SourcePages& src : row) {
          leaked -= std::min<std::uint64_t>(leaked, src.pages.size());
          stopped_pages += src.pages.size();
        }
      }
    }
  }


  std::map<std::string, std::uint64_t> statuses;
  std::vector<double> ms;
  std::uint64_t completed = 0, verified = 0;
  for (std::uint32_t i = 0; i < o_.requests; ++i) {
    const Request& r = requests_[i];
    const Status s = r.final.value_or(Status::internal("no final status"));
    ++statuses[std::string(to_string(s.code()))];
    if (s.is_ok()) {
      ++completed;
      ms.push_back(r.ms);
      verified += r.verified ? 1 : 0;
    }
  }
  const double handoff_gbps = seconds(handoff_time) > 0 ? bytes_done_ / seconds(handoff_time) / 1e9 : 0;
  const double raw_gbps = seconds(raw_time) > 0 ? raw_bytes / seconds(raw_time) / 1e9 : 0;
  auto summary = summarize(ms);
  // Parity is defined only in a run without faults where every request
  // completed and both passes moved bytes: in a fault run (a rank killed or
  // stalled, timeouts, cancels) both passes wait on the fault (a stalled
  // rank's 60 s made the "overhead" -105), and on one host a killed
  // producer's pages may still be read, so every request can complete
  // while its plain pass failed or waited.
  const bool faults = o_.kill_producer_at >= 0 || o_.kill_consumer_at >= 0 || o_.stop_consumer_at >= 0 ||
                      o_.stall_consumer_rank >= 0 ||
                      o_.cancel_every > 0;
  const bool clean = completed == o_.requests && !faults && !baseline_failed_;
  const json ci = clean ? overhead_ci95(waves) : json(nullptr);
  const json overhead =
      clean && raw_gbps > 0 && handoff_gbps > 0 ? json(1.0 - handoff_gbps / raw_gbps) : json(nullptr);
  json statuses_json = json::object();
  for (const auto& [k, v] : statuses) statuses_json[k] = v;
  json j{{"requests", o_.requests},
         {"completed", completed},
         {"verified", verified},
         {"handoff_gbps", handoff_gbps},
         {"raw_gbps", raw_gbps},
         {"overhead_ratio", overhead},
         {"overhead_ratio_ci95", ci},
         {"waves_ms", waves_ms(waves)},
         {"pages_leaked", leaked},
         {"pages_of_failed_consumers", stopped_pages},
         {"p50_ms", summary ? json(summary->p50) : json(nullptr)},
         {"p99_ms", summary ? json(summary->p99) : json(nullptr)},
         {"statuses", statuses_json},
         {"pages_retained_peak", retained_peak_},
         {"pages_retained_at_end", retained_at_end},
         {"replica_stopped", stopped.is_ok() ? "" : stopped.to_string()},
         {"bytes_per_request", row_bytes() * o_.cfg},
         {"producer_layout", to_json(pl_)},
         {"consumer_layout", to_json(cl_)},
         {"window", o_.window},
         {"wave_ratio_p50", or_null(percentile(wave_ratios, 50))},
         {"wave_ratio_min", or_null(percentile(wave_ratios, 0))},
         {"wave_ratio_max", or_null(percentile(wave_ratios, 100))},
         {"warmup_requests", kWarmupWaves * o_.window}};
  fmt::print("{} requests, {} completed, {} verified; handoff {:.2f} GB/s vs plain batches {:.2f} GB/s "
             "(overhead {}, 95% interval {}); p50 {} p99 {}; {} pages leaked\n",
             o_.requests, completed, verified, handoff_gbps, raw_gbps, text_of(j["overhead_ratio"], "{:.4f}"),
             ci.is_null() ? std::string("n/a") : fmt::format("{:.4f} .. {:.4f}", ci[0].get<double>(), ci[1].get<double>()),
             text_of(j["p50_ms"], "{:.2f} ms"), text_of(j["p99_ms"], "{:.2f} ms"), leaked);
  // The report first: a worker slow to exit cannot cost it.
  const int rc = emit_json("bench handoff", j.dump(2), o_.json);
  for (std::vector<Replica>* replicas : {&producers_, &consumers_}) {
    for (Replica& rep : *replicas) {
      for (auto& p : rep.processes) p->close_input();  // all exit at once, then each is reaped
    }
  }
  producers_.clear();
  consumers_.clear();
  if (rc != 0) return rc;
  // Faults end requests on purpose; a completed request whose bytes are
  // wrong, a baseline that did not run (unless a rank was killed: the wave
  // it died in uses it both ways), a page leaked or a consumer that failed
  // without --kill-consumer-at is the run failing.
  std::string failed;
  if (!consumer_failed.empty() && o_.kill_consumer_at < 0 && o_.stop_consumer_at < 0) {
    failed = fmt::format("consumer {} failed (above)", consumer_failed);
  } else if (!producer_failed.empty() && o_.kill_producer_at < 0) {
    failed = fmt::format("producer {} failed (above)", producer_failed);
  } else if (verified < completed) {
    failed = fmt::format("{} of {} completed requests failed the data check", completed - verified, completed);
  } else if (baseline_failed_ && o_.kill_producer_at < 0 && o_.kill_consumer_at < 0 && o_.stop_consumer_at < 0) {
    failed = "the plain-batch baseline failed (above)";
  } else if (leaked > 0) {
    failed = fmt::format("{} pages leaked", leaked);
  }
  if (!failed.empty()) {
    fmt::print(stderr, "baton bench handoff: {}\n", failed);
    return 1;
  }
  return 0;
}

}  // namespace

Command add_bench_handoff(CLI::App& bench) {
  auto o = std::make_shared<HandoffOptions>();
  CLI::App* app = bench.add_subcommand("handoff",
                                       "KV handoff from producer to consumer replicas, one process per rank, every "
                                       "byte checked, against plain engine batches of the same bytes");
  app->add_flag("--spawn", o->spawn, "Start the rank processes here (required)");
  app->add_option("--producers", o->producers, "Producer replicas")->check(CLI::Range(1, 16));
  app->add_option("--producer-tp", o->producer_tp, "Producer tensor parallelism")->check(CLI::Range(1, 16));
  app->add_option("--producer-sp", o->producer_sp, "Producer sequence parallelism")->check(CLI::Range(1, 16));
  app->add_option("--consumers", o->consumers, "Consumer replicas")->check(CLI::Range(1, 16));
  app->add_option("--consumer-tp", o->consumer_tp, "Consumer tensor parallelism")->check(CLI::Range(1, 16));
  app->add_option("--consumer-sp", o->consumer_sp, "Consumer sequence parallelism (token split)")->check(CLI::Range(1, 16));
  app->add_option("--cfg", o->cfg, "Classifier-free guidance rows per request")->check(CLI::Range(1, 8));
  app->add_option("--requests", o->requests, "Requests handed off")->check(CLI::Range(1, 1'000'000));
  app->add_option("--tokens", o->tokens, "Tokens per request")->check(CLI::Range(1, 1'000'000));
  app->add_option("--window", o->window, "Requests in flight per wave")->check(CLI::Range(1, 1024));
  app->add_option("--layers", o->layers, "Model layers (vLLM shape; default Llama-3-8B)")->check(CLI::Range(1, 1024));
  app->add_option("--kv-heads", o->kv_heads, "KV heads")->check(CLI::Range(1, 1024));
  app->add_option("--head-dim", o->head_dim, "Head dimension")->check(CLI::Range(1, 4096));
  app->add_option("--dtype-bytes", o->dtype_bytes, "Bytes per element")->check(CLI::Range(1, 8));
  app->add_option("--page-tokens", o->page_tokens, "Tokens per page (vLLM block size)")->check(CLI::Range(1, 4096));
  app->add_option("--order", o->order, "Page layout: hnd or nhd");
  app->add_option("--timeout", o->timeout, "transfer_timeout: how long a receive waits (duration)")
      ->check(kPositiveDuration);
  // Each fault is off unless its flag is given (-1 / 0 inside).
  app->add_option("--kill-producer-at", o->kill_producer_at, "SIGKILL rank 0 of request N's producer once it started")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1'000'000}));
  app->add_option("--stop-consumer-at", o->stop_consumer_at,
                  "SIGSTOP rank 0 of request N's consumer once it started: wedged, it is found and killed after "
                  "--worker-timeout (that replica stops; the run goes on)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1'000'000}));
  app->add_option("--kill-consumer-at", o->kill_consumer_at,
                  "SIGKILL rank 0 of request N's consumer once it started (that replica stops; the run goes on)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1'000'000}));
  app->add_option("--stall-consumer-rank", o->stall_consumer_rank,
                  "Rank R of consumer replica c0 withholds its completions until the end")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{256}));
  app->add_option("--cancel-every", o->cancel_every, "Cancel every Nth request once it started")
      ->check(CLI::Range(1, 1'000'000));
  app->add_option("--worker-timeout", o->worker_timeout,
                  "A rank process that answers no call, or takes no input, within it (stopped or wedged) is killed "
                  "and its replica fails (duration)")
      ->check(kPositiveDuration);
  app->add_option("--json", o->json, "Write the figures as JSON to PATH (- for stdout)");
  return {app, [o, app] {
            o->timeout_given = app->count("--timeout") > 0;
            Bench b(*o);
            return b.run();
          }};
}

}  // namespace baton::cli
