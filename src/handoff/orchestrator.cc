#include "baton/handoff/orchestrator.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <random>
#include <set>

namespace baton::handoff {

std::string_view to_string(TicketState state) {
  switch (state) {
    case TicketState::kCreated: return "created";
    case TicketState::kBound: return "bound";
    case TicketState::kGenerated: return "generated";
    case TicketState::kLoading: return "loading";
    case TicketState::kCompleted: return "completed";
    case TicketState::kTimedOut: return "timed_out";
    case TicketState::kCancelled: return "cancelled";
    case TicketState::kFailed: return "failed";
    case TicketState::kReleased: return "released";
  }
  return "unknown";
}

namespace {

constexpr TicketState kAllStates[] = {TicketState::kCreated,   TicketState::kBound,     TicketState::kGenerated,
                                      TicketState::kLoading,   TicketState::kCompleted, TicketState::kTimedOut,
                                      TicketState::kCancelled, TicketState::kFailed,    TicketState::kReleased};

bool ended_for_caller(TicketState s) {
  return s == TicketState::kTimedOut || s == TicketState::kCancelled || s == TicketState::kFailed;
}

// Which PageCounts field a ticket's destination pages count in.
enum class Owner : std::uint8_t { kNone, kReserved, kInUse, kRetained };

std::vector<double> latency_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

// A replica as add_producer / add_consumer take it: a name, a valid layout,
// one distinct rank per layout rank, each with the layout's pages (a rank
// with other pages would be read or written at the wrong offsets).
template <typename Rank>
Status check_replica(const char* call, const std::string& name, const KvLayout& layout,
                     const std::vector<Rank*>& ranks) {
  if (name.empty()) return Status::invalid_argument("{}: an empty replica name", call);
  if (auto s = layout.validate(); !s.is_ok()) return Status::invalid_argument("{} {}: {}", call, name, s.message());
  if (ranks.size() != layout.ranks() || std::ranges::count(ranks, nullptr) > 0) {
    return Status::invalid_argument("{} {}: {} ranks given (some null?), the layout has tp {} × sp {}", call, name,
                                    ranks.size(), layout.tp, layout.sp);
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    if (std::count(ranks.begin(), ranks.end(), ranks[r]) > 1) {
      return Status::invalid_argument("{} {}: rank {} is the same object as another rank", call, name, r);
    }
    if (ranks[r]->page_bytes() != layout.page_bytes()) {
      return Status::invalid_argument("{} {}: rank {}'s pages are {} bytes, the layout's {}", call, name, r,
                                      ranks[r]->page_bytes(), layout.page_bytes());
    }
  }
  return Status::ok();
}

// A rank belongs to one replica: shared, one replica's completions and
// pages would be taken for the other's (its tickets then time out).
template <typename Rank, typename Replicas>
Status check_unshared(const char* call, const std::string& name, const std::vector<Rank*>& ranks,
                      const Replicas& replicas) {
  for (const auto& [other, replica] : replicas) {
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (std::ranges::find(replica.ranks, ranks[r]) != replica.ranks.end()) {
        return Status::invalid_argument("{} {}: rank {} is a rank of replica {} already", call, name, r, other);
      }
    }
  }
  return Status::ok();
}

// The pages rank `rank` holds of a request of `tokens` tokens, every CFG
// row: 64 bits, as cfg × pages wraps 32.
std::uint64_t request_pages(const KvLayout& l, std::uint32_t rank, std::uint32_t tokens) {
  return std::uint64_t{l.cfg} * l.rank_pages(rank, l.pages_for(tokens));
}

}  // namespace

Status HandoffConfig::validate() const {
  if (transfer_timeout_ns <= 0) {
    return Status::invalid_argument("handoff config: transfer_timeout_ns {} (expected above 0)", transfer_timeout_ns);
  }
  if (load_timeout_ns < 0) {
    return Status::invalid_argument("handoff config: load_timeout_ns {} (expected 0, the engine's, or above)",
                                    load_timeout_ns);
  }
  return Status::ok();
}

struct ProducerReplica {
  KvLayout layout;
  std::vector<ProducerRank*> ranks;
  Status failed;
};

struct ConsumerReplica {
  KvLayout layout;
  std::vector<ConsumerRank*> ranks;
  Status stopped;
  PageCounts pages;
};

struct Entry {
  Ticket t;
  std::vector<std::vector<bool>> loaded;  // [row][rank]
  std::vector<std::vector<bool>> given;   // [row][rank]: handed to the rank (start() gives them one by one)
  std::uint64_t dest_pages = 0;
  bool sources_held = false;  // source pages allocated and not yet freed
  bool receiving = false;
  bool dispatching = false;  // start() is giving its loads without the mutex
  bool cancel_queued = false;
  TimeNs dispatched_ns = 0;
};

// What receive() sleeps on: a count that ranks which report completions
// themselves (ConsumerRank::on_completion) and every state change bump.
// Shared, so a rank may call it after the orchestrator is gone.
struct Wakeup {
  std::mutex mutex;
  std::condition_variable cv;
  std::uint64_t count = 0;

  std::uint64_t seen() {
    std::lock_guard lock(mutex);
    return count;
  }
  void wake() {
    {
      std::lock_guard lock(mutex);
      ++count;
    }
    cv.notify_all();
  }
  void wait(std::uint64_t seen, TimeNs timeout_ns) {
    std::unique_lock lock(mutex);
    cv.wait_for(lock, std::chrono::nanoseconds(std::min(timeout_ns, kForeverNs)), [&] { return count != seen; });
  }
};

struct Orchestrator::State {
  HandoffConfig config;
  Status config_error;  // config.validate(), answered by the calls that set up
  SteadyClock steady;
  const Clock* clock = nullptr;
  mutable std::mutex mutex;
  std::shared_ptr<Wakeup> wakeup = std::make_shared<Wakeup>();
  bool polled = false;  // some consumer rank's completions must be polled for
  std::map<std::string, ProducerReplica, std::less<>> producers;
  std::map<std::string, ConsumerReplica, std::less<>> consumers;
  std::map<TicketId, Entry> tickets;
  std::map<TicketState, std::uint64_t> by_state;
  std::uint64_t loading = 0;  // tickets with loads pending: progress() polls only then
  // Ticket ids start at a random multiple of 2^32 (below 2^52, exact in any
  // JSON): a completion that a predecessor's load reports after a restart
  // over the same ranks names no ticket of ours, and stops the replica as
  // any unaccounted load does. From 1, it was taken for our ticket 1, which
  // then read ok before its own bytes had landed.
  TicketId next = ((std::random_device{}() & 0xFFFFF) | 1) * (TicketId{1} << 32) + 1;
  PlanCache plans;

  TimeNs now() const { return clock->now_ns(); }

  static Owner owner(const Entry& e, TicketState s) {
    if (e.dest_pages == 0) return Owner::kNone;
    if (s == TicketState::kLoading) return Owner::kReserved;
    if (s == TicketState::kCompleted) return Owner::kInUse;
    if (ended_for_caller(s)) return Owner::kRetained;
    return Owner::kNone;
  }

  static std::uint64_t* field(PageCounts& c, Owner o) {
    switch (o) {
      case Owner::kReserved: return &c.reserved;
      case Owner::kInUse: return &c.in_use;
      case Owner::kRetained: return &c.retained;
      case Owner::kNone: break;
    }
    return nullptr;
  }

  // The consumer's page gauges and the gauges of `states` (every state
  // when empty).
  void publish(const std::string& consumer, std::initializer_list<TicketState> states = {}) {
    if (config.metrics == nullptr) return;
    const PageCounts& c = consumers.at(consumer).pages;
    config.metrics->set("baton_handoff_pages", {{"consumer", consumer}, {"owner", "reserved"}}, c.reserved);
    config.metrics->set("baton_handoff_pages", {{"consumer", consumer}, {"owner", "in_use"}}, c.in_use);
    config.metrics->set("baton_handoff_pages", {{"consumer", consumer}, {"owner", "retained"}}, c.retained);
    for (TicketState s : states.size() == 0 ? std::span<const TicketState>(kAllStates) : std::span(states)) {
      config.metrics->set("baton_handoff_tickets", {{"state", std::string(to_string(s))}}, by_state[s]);
    }
  }

  // Moves a ticket and its destination pages' owner together.
  void set_state(Entry& e, TicketState s) {
    if (e.t.state == TicketState::kLoading && s != TicketState::kLoading) e.t.ended_ns = now();
    ConsumerReplica& c = consumers.at(e.t.consumer);
    if (auto* from = field(c.pages, owner(e, e.t.state))) *from -= e.dest_pages;
    if (s == TicketState::kReleased) e.dest_pages = 0;
    if (auto* to = field(c.pages, owner(e, s))) *to += e.dest_pages;
    const TicketState from = e.t.state;
    --by_state[from];
    ++by_state[s];
    e.t.state = s;
    // Once per ticket: one cancelled during the receive that saw it complete
    // was counted completed, then cancelled too.
    if (config.metrics != nullptr && (s == TicketState::kCompleted || ended_for_caller(s)) &&
        from != TicketState::kCompleted) {
      config.metrics->add("baton_handoff_tickets_ended_total", {{"state", std::string(to_string(s))}});
    }
    publish(e.t.consumer, {from, s});
    wakeup->wake();
  }

  // Stops a consumer replica. Its tickets that never started loading have
  // no destination pages and no write in flight: they fail now and return
  // their producers' source pages (they stayed held, and every later call
  // on them was refused, so a healthy producer ran out of pages).
  void stop(ConsumerReplica& c, Status why) {
    if (c.stopped.is_ok()) c.stopped = std::move(why);
    for (auto& [id, e] : tickets) {
      if (&consumers.at(e.t.consumer) != &c) continue;
      const TicketState s = e.t.state;
      if (s == TicketState::kCreated || s == TicketState::kBound || s == TicketState::kGenerated) {
        end(e, TicketState::kFailed,
            Status::unavailable("ticket {}: consumer {} stopped before the load: {}", id, e.t.consumer,
                                c.stopped.to_string()));
      }
    }
    wakeup->wake();
  }

  // failed_precondition when the ticket's consumer stopped.
  Status usable(const Entry& e) {
    const Status& s = consumers.at(e.t.consumer).stopped;
    if (s.is_ok()) return s;
    return Status::failed_precondition("ticket {}: consumer {} stopped: {}", e.t.id, e.t.consumer, s.to_string());
  }

  Result<Entry*> find(TicketId id, const char* call) {
    auto it = tickets.find(id);
    if (it == tickets.end()) return std::unexpected(Status::not_found("{}: no ticket {}", call, id));
    if (auto s = usable(it->second); !s.is_ok()) return std::unexpected(s);
    return &it->second;
  }

  void free_sources(Entry& e) {
    if (!e.sources_held) return;
    e.sources_held = false;
    auto p = producers.find(e.t.producer);
    if (p == producers.end()) return;
    // A failed replica's dead ranks refuse (their pages died with them);
    // its live ones still take theirs back.
    for (auto& row : e.t.sources) {
      for (std::size_t r = 0; r < row.size(); ++r) {
        if (auto s = p->second.ranks[r]->free(row[r].pages); !s.is_ok() && p->second.failed.is_ok()) {
          p->second.failed = Status::internal("producer {} rank {} refused its pages back: {}", e.t.producer, r,
                                              s.to_string());
        }
      }
    }
  }

  // Returns every destination page; a refusal stops the replica (a page we
  // cannot account for must never be handed out again).
  bool free_destination(Entry& e) {
    ConsumerReplica& c = consumers.at(e.t.consumer);
    for (std::uint32_t r = 0; r < c.ranks.size(); ++r) {
      std::vector<std::uint32_t> pages;
      for (const auto& row : e.t.destination) pages.insert(pages.end(), row[r].begin(), row[r].end());
      if (pages.empty()) continue;
      if (auto s = c.ranks[r]->free(pages); !s.is_ok()) {
        stop(c, Status::internal("ticket {}: rank {} refused {} pages back: {}", e.t.id, r, pages.size(),
                                 s.to_string()));
        return false;
      }
    }
    return true;
  }

  // Once no load is pending: a loading ticket completed (its source pages
  // go back), an ended one returns every page.
  void settle(Entry& e) {
    if (e.t.loads_pending != 0) return;
    if (e.t.state == TicketState::kLoading) {
      free_sources(e);
      set_state(e, TicketState::kCompleted);
      return;
    }
    if (!ended_for_caller(e.t.state)) return;
    if (!free_destination(e)) return;
    free_sources(e);
    set_state(e, TicketState::kReleased);
  }

  void end(Entry& e, TicketState s, Status why) {
    e.t.status = std::move(why);
    set_state(e, s);
    settle(e);
  }

  // `ran`: the rank took the load and reported its end (a load refused or
  // never given has no latency to observe).
  void complete(Entry& e, std::uint32_t row, std::uint32_t rank, const Status& status, bool ran) {
    e.loaded[row][rank] = true;
    --e.t.loads_pending;
    if (e.t.loads_pending == 0) --loading;
    if (ran && config.metrics != nullptr) {
      config.metrics->observe("baton_handoff_rank_load_seconds",
                              {{"consumer", e.t.consumer}, {"rank", std::to_string(rank)}},
                              static_cast<double>(now() - e.dispatched_ns) / 1e9);
    }
    if (!status.is_ok() && e.t.state == TicketState::kLoading) {
      e.t.status = Status(status.code(), fmt::format("ticket {} row {} consumer rank {}: {}", e.t.id, row, rank,
                                                     status.message()));
      set_state(e, TicketState::kFailed);
    }
    settle(e);
    wakeup->wake();
  }

  void progress() {
    if (loading == 0) return;  // late completions are polled only while some are owed
    for (auto& [name, c] : consumers) {
      if (!c.stopped.is_ok()) continue;
      for (std::uint32_t r = 0; r < c.ranks.size() && c.stopped.is_ok(); ++r) {
        for (const LoadCompletion& done : c.ranks[r]->take_completions()) {
          auto it = tickets.find(done.ticket);
          // Given (a start() still dispatching has not given every load yet)
          // and not reported before.
          const bool expected = it != tickets.end() && it->second.t.consumer == name && done.rank == r &&
                                done.row < it->second.loaded.size() && it->second.given[done.row][r] &&
                                !it->second.loaded[done.row][r];
          if (!expected) {
            stop(c, Status::internal("consumer {} rank {} reported a load it was not given or twice (ticket {} row "
                                     "{} rank {})",
                                     name, r, done.ticket, done.row, done.rank));
            break;
          }
          complete(it->second, done.row, r, done.status, true);
        }
      }
    }
  }

  // Allocates the destination pages on every rank (all or none) and moves
  // the ticket to loading with every (row, rank) load counted pending;
  // dispatch() then gives the loads.
  Status reserve(Entry& e) {
    ConsumerReplica& c = consumers.at(e.t.consumer);
    const KvLayout& cl = c.layout;
    std::vector<std::vector<std::uint32_t>> got(c.ranks.size());
    for (std::uint32_t r = 0; r < c.ranks.size(); ++r) {
      const auto want = static_cast<std::uint32_t>(request_pages(cl, r, e.t.tokens));  // ≤ its pool: create_ticket
      auto pages = want == 0 ? Result<std::vector<std::uint32_t>>{} : c.ranks[r]->allocate(want);
      if (pages) {
        std::set<std::uint32_t> distinct(pages->begin(), pages->end());
        if (pages->size() != want || distinct.size() != want ||
            (!distinct.empty() && *distinct.rbegin() >= c.ranks[r]->pool_pages())) {
          const Status why = Status::internal(
              "ticket {}: consumer {} rank {} answered {} pages ({} distinct, highest {}) for {} from a pool of {}",
              e.t.id, e.t.consumer, r, pages->size(), distinct.size(), distinct.empty() ? 0 : *distinct.rbegin(),
              want, c.ranks[r]->pool_pages());
          stop(c, why);
          return Status::failed_precondition("{}", why.to_string());
        }
        got[r] = std::move(*pages);
        continue;
      }
      // Roll back the ranks that allocated, before any load is dispatched.
      for (std::uint32_t k = 0; k < r; ++k) {
        if (got[k].empty()) continue;
        if (auto s = c.ranks[k]->free(got[k]); !s.is_ok()) {
          stop(c, Status::internal("ticket {}: rolling back rank {}'s pages failed: {} (after rank {}: {})", e.t.id,
                                   k, s.to_string(), r, pages.error().to_string()));
          return Status::failed_precondition("ticket {}: consumer {} stopped: {}", e.t.id, e.t.consumer,
                                             c.stopped.to_string());
        }
      }
      return Status(pages.error().code(),
                    fmt::format("start ticket {}: consumer {} rank {}: {} (rolled back; nothing dispatched)", e.t.id,
                                e.t.consumer, r, pages.error().message()));
    }
    e.t.destination.assign(cl.cfg, std::vector<std::vector<std::uint32_t>>(c.ranks.size()));
    e.dest_pages = 0;
    for (std::uint32_t r = 0; r < c.ranks.size(); ++r) {
      const std::size_t per_row = got[r].size() / cl.cfg;
      for (std::uint32_t w = 0; w < cl.cfg; ++w) {
        e.t.destination[w][r].assign(got[r].begin() + w * per_row, got[r].begin() + (w + 1) * per_row);
      }
      e.dest_pages += got[r].size();
    }
    e.loaded.assign(cl.cfg, std::vector<bool>(c.ranks.size(), false));
    e.given = e.loaded;
    e.t.loads_pending = cl.cfg * static_cast<std::uint32_t>(c.ranks.size());
    ++loading;
    e.dispatched_ns = now();
    e.t.started_ns = e.dispatched_ns;
    set_state(e, TicketState::kLoading);
    return Status::ok();
  }

  // Gives each rank its loads without the mutex: a rank behind an RPC, or a
  // worker that connects to a producer or copies on the calling thread,
  // must not stall the other tickets' calls (a receive past its timeout
  // waited for another replica's stalled load). Every load counts pending
  // already, so a completion, cancel or timeout meanwhile finds the ticket
  // loading, and forget_released leaves it while `dispatching`.
  void dispatch(std::unique_lock<std::mutex>& lock, Entry& e) {
    ConsumerReplica& c = consumers.at(e.t.consumer);
    const KvLayout& cl = c.layout;
    e.dispatching = true;
    for (std::uint32_t w = 0; w < cl.cfg; ++w) {
      for (std::uint32_t r = 0; r < c.ranks.size(); ++r) {
        // A stopped replica's pages are left as they are: nothing more moves.
        if (!c.stopped.is_ok()) break;
        if (e.t.state != TicketState::kLoading) {
          // It ended meanwhile (a rank refused its order, a cancel, a
          // timeout): the rest need not move.
          complete(e, w, r, Status::cancelled("not dispatched: the ticket ended during its dispatch"), false);
          continue;
        }
        LoadOrder order{e.t.id, w, e.t.tokens, e.t.producer_layout, cl, r, e.t.sources[w], e.t.destination[w][r],
                        config.load_timeout_ns};
        ConsumerRank* rank = c.ranks[r];
        e.given[w][r] = true;  // before the unlock: its completion may come before load() returns
        lock.unlock();
        Status s;
        bool threw = false;
        try {
          s = rank->load(order);
        } catch (const std::exception& ex) {
          s = Status::internal("{}", ex.what());
          threw = true;
        }
        lock.lock();
        if (s.is_ok() || !c.stopped.is_ok()) continue;
        if (threw || e.loaded[w][r]) {
          // Whether the load started is unknown (it threw), or it was
          // reported and refused: its pages cannot be proven free.
          stop(c, Status::internal("consumer {} rank {} {} the load of ticket {} row {}: {}", e.t.consumer, r,
                                   threw ? "threw on" : "reported, then refused", e.t.id, w, s.to_string()));
          continue;
        }
        complete(e, w, r, s, false);  // the caller learns a refusal as any failed load's
      }
    }
    e.dispatching = false;
  }
};

Orchestrator::Orchestrator(HandoffConfig config) : state_(std::make_unique<State>()) {
  state_->config = config;
  state_->config_error = config.validate();
  state_->clock = config.clock != nullptr ? config.clock : &state_->steady;
  if (auto* m = config.metrics) {
    (void)m->declare_gauge("baton_handoff_pages",
                           "Destination pages of a consumer replica by owner: reserved (loading), in_use (completed, "
                           "until finish), retained (ended while loads were in flight).");
    (void)m->declare_gauge("baton_handoff_tickets", "Handoff tickets by state.");
    (void)m->declare_counter("baton_handoff_tickets_ended_total",
                             "Tickets that ended, by how: completed, timed_out, cancelled, failed (released ones "
                             "leave the gauge, not this).");
    (void)m->declare_histogram("baton_handoff_rank_load_seconds",
                               "From dispatch to a consumer rank's completion of one row.", latency_buckets());
  }
}

// Ranks may keep calling their wake function: it holds the Wakeup, not us.
Orchestrator::~Orchestrator() = default;

Status Orchestrator::add_producer(std::string name, const KvLayout& layout, std::vector<ProducerRank*> ranks) {
  if (!state_->config_error.is_ok()) return state_->config_error;
  if (auto s = check_replica("add_producer", name, layout, ranks); !s.is_ok()) return s;
  std::lock_guard lock(state_->mutex);
  if (state_->producers.contains(name)) return Status::already_exists("add_producer: {} exists", name);
  if (auto s = check_unshared("add_producer", name, ranks, state_->producers); !s.is_ok()) return s;
  state_->producers.emplace(std::move(name), ProducerReplica{layout, std::move(ranks), {}});
  return Status::ok();
}

Status Orchestrator::add_consumer(std::string name, const KvLayout& layout, std::vector<ConsumerRank*> ranks) {
  if (!state_->config_error.is_ok()) return state_->config_error;
  if (auto s = check_replica("add_consumer", name, layout, ranks); !s.is_ok()) return s;
  std::lock_guard lock(state_->mutex);
  if (state_->consumers.contains(name)) return Status::already_exists("add_consumer: {} exists", name);
  if (auto s = check_unshared("add_consumer", name, ranks, state_->consumers); !s.is_ok()) return s;
  for (ConsumerRank* rank : ranks) {
    if (!rank->on_completion([w = state_->wakeup] { w->wake(); })) state_->polled = true;
  }
  state_->consumers.emplace(name, ConsumerReplica{layout, std::move(ranks), {}, {}});
  state_->publish(name);
  return Status::ok();
}

Result<TicketId> Orchestrator::create_ticket(const TicketSpec& spec) {
  if (!state_->config_error.is_ok()) return std::unexpected(state_->config_error);
  if (spec.tokens == 0 || spec.request.empty()) {
    return std::unexpected(Status::invalid_argument("create_ticket: request \"{}\" with {} tokens (expected a name "
                                                    "and at least one token)",
                                                    spec.request, spec.tokens));
  }
  std::lock_guard lock(state_->mutex);
  auto c = state_->consumers.find(spec.consumer);
  if (c == state_->consumers.end()) {
    return std::unexpected(Status::not_found("create_ticket: no consumer replica \"{}\"", spec.consumer));
  }
  if (!c->second.stopped.is_ok()) {
    return std::unexpected(Status::failed_precondition("create_ticket: consumer {} stopped: {}", spec.consumer,
                                                       c->second.stopped.to_string()));
  }
  // A request no rank's pool can ever hold is refused now, not left to
  // wait for pages (and cfg × pages cannot wrap past a pool's size).
  const ConsumerReplica& replica = c->second;
  for (std::uint32_t r = 0; r < replica.ranks.size(); ++r) {
    const std::uint64_t want = request_pages(replica.layout, r, spec.tokens);
    if (want > replica.ranks[r]->pool_pages()) {
      return std::unexpected(Status::invalid_argument(
          "create_ticket: {} tokens × cfg {} need {} pages on consumer {} rank {}, whose pool holds {}", spec.tokens,
          replica.layout.cfg, want, spec.consumer, r, replica.ranks[r]->pool_pages()));
    }
  }
  Entry e;
  e.t.id = state_->next++;
  e.t.request = spec.request;
  e.t.consumer = spec.consumer;
  e.t.tokens = spec.tokens;
  e.t.consumer_layout = c->second.layout;
  ++state_->by_state[TicketState::kCreated];
  const TicketId id = e.t.id;
  state_->tickets.emplace(id, std::move(e));
  state_->publish(spec.consumer, {TicketState::kCreated});
  return id;
}

Status Orchestrator::bind(TicketId ticket, std::string_view producer) {
  std::lock_guard lock(state_->mutex);
  auto e = state_->find(ticket, "bind");
  if (!e) return e.error();
  Entry& entry = **e;
  if (entry.t.state != TicketState::kCreated) {
    return Status::failed_precondition("bind: ticket {} is {}", ticket, to_string(entry.t.state));
  }
  auto p = state_->producers.find(producer);
  if (p == state_->producers.end()) return Status::not_found("bind: no producer replica \"{}\"", producer);
  if (!p->second.failed.is_ok()) {
    return Status::unavailable("bind: producer {} failed: {}", producer, p->second.failed.to_string());
  }
  const KvLayout& pl = p->second.layout;
  if (auto plan = state_->plans.get(pl, entry.t.consumer_layout); !plan) {
    return Status::invalid_argument("bind ticket {} to {}: {}", ticket, producer, plan.error().message());
  }
  std::vector<std::vector<std::uint32_t>> got(p->second.ranks.size());
  for (std::uint32_t r = 0; r < p->second.ranks.size(); ++r) {
    const std::uint64_t wanted = request_pages(pl, r, entry.t.tokens);
    if (wanted > std::numeric_limits<std::uint32_t>::max()) {
      return Status::invalid_argument("bind ticket {} to {}: {} tokens need {} pages on rank {}", ticket, producer,
                                      entry.t.tokens, wanted, r);
    }
    const auto want = static_cast<std::uint32_t>(wanted);
    if (want == 0) continue;
    auto pages = p->second.ranks[r]->allocate(want);
    const bool distinct = pages && std::set<std::uint32_t>(pages->begin(), pages->end()).size() == pages->size();
    if (pages && pages->size() == want && distinct) {
      got[r] = std::move(*pages);
      continue;
    }
    const Status why = pages ? Status::internal("producer rank answered {} pages ({}) for {}", pages->size(),
                                                distinct ? "distinct" : "some twice", want)
                             : pages.error();
    bool rolled_back = true;
    for (std::uint32_t k = 0; k < r; ++k) {
      if (!got[k].empty() && !p->second.ranks[k]->free(got[k]).is_ok()) rolled_back = false;
    }
    if (pages || !rolled_back) {
      // A rank that answers wrongly, or will not take its pages back, is not
      // trusted with another ticket.
      p->second.failed = Status::internal("producer {} rank {}: {}{}", producer, r, why.message(),
                                          rolled_back ? "" : " (and a rollback failed)");
    }
    return Status(why.code(), fmt::format("bind ticket {}: producer {} rank {}: {} (rolled back)", ticket, producer, r,
                                          why.message()));
  }
  entry.t.producer = std::string(producer);
  entry.t.producer_layout = pl;
  entry.t.sources.assign(pl.cfg, std::vector<SourcePages>(p->second.ranks.size()));
  for (std::uint32_t r = 0; r < p->second.ranks.size(); ++r) {
    const std::size_t per_row = got[r].size() / pl.cfg;
    for (std::uint32_t w = 0; w < pl.cfg; ++w) {
      entry.t.sources[w][r].region = p->second.ranks[r]->region();
      entry.t.sources[w][r].pages.assign(got[r].begin() + w * per_row, got[r].begin() + (w + 1) * per_row);
    }
  }
  entry.sources_held = true;
  state_->set_state(entry, TicketState::kBound);
  return Status::ok();
}

Status Orchestrator::generated(TicketId ticket) {
  std::lock_guard lock(state_->mutex);
  auto e = state_->find(ticket, "generated");
  if (!e) return e.error();
  Entry& entry = **e;
  if (entry.t.state != TicketState::kBound) {
    return Status::failed_precondition("generated: ticket {} is {}", ticket, to_string(entry.t.state));
  }
  const ProducerReplica& p = state_->producers.at(entry.t.producer);
  if (!p.failed.is_ok()) return Status::unavailable("generated: producer {} failed", entry.t.producer);
  for (auto& row : entry.t.sources) {
    for (std::size_t r = 0; r < row.size(); ++r) row[r].address = p.ranks[r]->address();
  }
  state_->set_state(entry, TicketState::kGenerated);
  return Status::ok();
}

Status Orchestrator::start(TicketId ticket) {
  std::unique_lock lock(state_->mutex);
  auto e = state_->find(ticket, "start");
  if (!e) return e.error();
  if ((*e)->t.state != TicketState::kGenerated) {
    return Status::failed_precondition("start: ticket {} is {}", ticket, to_string((*e)->t.state));
  }
  Status started = state_->reserve(**e);
  if (started.code() == StatusCode::kResourceExhausted && state_->loading > 0) {
    // Short of pages while completions are owed: late ones may have come
    // back (a caller that never calls progress() must not find its pool
    // full of retained pages). Nothing was dispatched, so it can try again.
    state_->progress();
    if (auto s = state_->usable(**e); !s.is_ok()) return s;
    started = state_->reserve(**e);
  }
  if (started.is_ok()) state_->dispatch(lock, **e);
  return started;
}

Status Orchestrator::receive(TicketId ticket, TimeNs timeout_ns) {
  if (timeout_ns < 0) return Status::invalid_argument("receive: timeout {} ns is negative", timeout_ns);
  std::unique_lock lock(state_->mutex);
  auto found = state_->find(ticket, "receive");
  if (!found) return found.error();
  Entry& e = **found;
  const TicketState s0 = e.t.state;
  if (s0 == TicketState::kCreated || s0 == TicketState::kBound || s0 == TicketState::kGenerated) {
    return Status::failed_precondition("receive: ticket {} is {} (not started)", ticket, to_string(s0));
  }
  if (e.receiving) return Status::failed_precondition("receive: ticket {} is being received already", ticket);
  const TimeNs wait_ns = timeout_ns == 0 ? state_->config.transfer_timeout_ns : timeout_ns;
  const TimeNs deadline = time_after(state_->now(), wait_ns);  // INT64_MAX: no end
  e.receiving = true;
  while (e.t.state == TicketState::kLoading) {
    const std::uint64_t seen = state_->wakeup->seen();
    state_->progress();
    if (e.t.state != TicketState::kLoading || !state_->usable(e).is_ok()) break;
    const TimeNs left = deadline - state_->now();
    if (left <= 0) {
      state_->end(e, TicketState::kTimedOut,
                  Status::timeout("receive: ticket {} not loaded on every rank after {} ms ({} loads pending; their "
                                  "pages stay retained until they complete)",
                                  ticket, wait_ns / 1'000'000, e.t.loads_pending));
      break;
    }
    // Ranks that report completions wake us; those that cannot are polled
    // often enough not to add latency, rarely enough not to take a core
    // from them. The mutex is free meanwhile (cancel() queues).
    lock.unlock();
    state_->wakeup->wait(seen, std::min<TimeNs>(left, state_->polled ? 50'000 : 10'000'000));
    lock.lock();
  }
  e.receiving = false;
  if (auto s = state_->usable(e); !s.is_ok()) return s;
  if (e.cancel_queued) {
    e.cancel_queued = false;
    if (e.t.state == TicketState::kCompleted) {
      // The KV arrived; the caller no longer wants it.
      e.t.status = Status::cancelled("ticket {} cancelled during its receive (the KV had arrived; its pages are "
                                     "released)",
                                     ticket);
      if (!state_->free_destination(e)) return state_->usable(e);
      state_->set_state(e, TicketState::kCancelled);
      state_->set_state(e, TicketState::kReleased);
      return e.t.status;
    }
  }
  return e.t.state == TicketState::kCompleted ? Status::ok() : e.t.status;
}

Status Orchestrator::cancel(TicketId ticket) {
  std::lock_guard lock(state_->mutex);
  auto found = state_->find(ticket, "cancel");
  if (!found) return found.error();
  Entry& e = **found;
  if (e.receiving) {
    if (e.cancel_queued) return Status::invalid_argument("cancel: ticket {} has a cancel queued already", ticket);
    e.cancel_queued = true;  // runs when that receive returns; the loads go on
    return Status::ok();
  }
  switch (e.t.state) {
    case TicketState::kCreated:
    case TicketState::kBound:
    case TicketState::kGenerated:
    case TicketState::kLoading:
      state_->end(e, TicketState::kCancelled, Status::cancelled("ticket {} cancelled", ticket));
      return Status::ok();
    default:
      return Status::invalid_argument("cancel: ticket {} ended already ({})", ticket, to_string(e.t.state));
  }
}

Status Orchestrator::finish(TicketId ticket) {
  std::lock_guard lock(state_->mutex);
  auto found = state_->find(ticket, "finish");
  if (!found) return found.error();
  Entry& e = **found;
  if (e.t.state != TicketState::kCompleted) {
    return Status::failed_precondition("finish: ticket {} is {} (expected completed)", ticket, to_string(e.t.state));
  }
  if (!state_->free_destination(e)) return state_->usable(e);
  state_->set_state(e, TicketState::kReleased);
  return Status::ok();
}

void Orchestrator::progress() {
  std::lock_guard lock(state_->mutex);
  state_->progress();
}

Status Orchestrator::producer_failed(std::string_view producer, const Status& why) {
  std::lock_guard lock(state_->mutex);
  auto p = state_->producers.find(producer);
  if (p == state_->producers.end()) return Status::not_found("producer_failed: no producer replica \"{}\"", producer);
  if (p->second.failed.is_ok()) p->second.failed = why.is_ok() ? Status::unavailable("failed") : why;
  for (auto& [id, e] : state_->tickets) {
    if (e.t.producer != producer || !state_->usable(e).is_ok()) continue;
    if (e.t.state == TicketState::kBound || e.t.state == TicketState::kGenerated) {
      state_->end(e, TicketState::kFailed,
                  Status::unavailable("ticket {}: producer {} failed before the load: {}", id, producer,
                                      p->second.failed.to_string()));
    }
  }
  return Status::ok();
}

Status Orchestrator::consumer_rank_failed(std::string_view consumer, std::uint32_t rank, const Status& why) {
  std::lock_guard lock(state_->mutex);
  auto c = state_->consumers.find(consumer);
  if (c == state_->consumers.end()) return Status::not_found("consumer_rank_failed: no consumer \"{}\"", consumer);
  if (rank >= c->second.ranks.size()) {
    return Status::out_of_range("consumer_rank_failed: rank {} of consumer {} with {} ranks", rank, consumer,
                                c->second.ranks.size());
  }
  state_->stop(c->second, Status::unavailable("rank {} failed: {}", rank, why.to_string()));
  return Status::ok();
}

Status Orchestrator::consumer_status(std::string_view consumer) const {
  std::lock_guard lock(state_->mutex);
  auto c = state_->consumers.find(consumer);
  if (c == state_->consumers.end()) return Status::not_found("consumer_status: no consumer \"{}\"", consumer);
  return c->second.stopped;
}

Result<Ticket> Orchestrator::ticket(TicketId ticket) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->tickets.find(ticket);
  if (it == state_->tickets.end()) return std::unexpected(Status::not_found("ticket: no ticket {}", ticket));
  return it->second.t;
}

Result<PageCounts> Orchestrator::pages(std::string_view consumer) const {
  std::lock_guard lock(state_->mutex);
  auto c = state_->consumers.find(consumer);
  if (c == state_->consumers.end()) return std::unexpected(Status::not_found("pages: no consumer \"{}\"", consumer));
  return c->second.pages;
}

std::uint64_t Orchestrator::tickets_in(TicketState state) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->by_state.find(state);
  return it == state_->by_state.end() ? 0 : it->second;
}

void Orchestrator::forget_released() {
  std::lock_guard lock(state_->mutex);
  std::erase_if(state_->tickets, [&](const auto& kv) {
    // A receive() still waking up on it, or a start() still dispatching it,
    // holds a reference: it goes next time.
    if (kv.second.t.state != TicketState::kReleased || kv.second.receiving || kv.second.dispatching) return false;
    --state_->by_state[TicketState::kReleased];
    return true;
  });
  if (auto* m = state_->config.metrics) {
    m->set("baton_handoff_tickets", {{"state", "released"}}, state_->by_state[TicketState::kReleased]);
  }
}

Status Orchestrator::shutdown() {
  std::lock_guard lock(state_->mutex);
  for (const auto& [name, c] : state_->consumers) {
    if (!c.stopped.is_ok()) {
      return Status(c.stopped.code(), fmt::format("consumer {} stopped: {}", name, c.stopped.message()));
    }
  }
  return Status::ok();
}

}  // namespace baton::handoff
