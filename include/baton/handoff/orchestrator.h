// The handoff of one request's KV from a producer stage to a consumer stage
// (prefill → decode, autoregressive → diffusion), as a ticket with a
// lifecycle: created for a request and a consumer replica, bound to a
// producer replica (source pages allocated on each of its ranks), generated
// (the producer's engine addresses resolved), loading (destination pages
// allocated on every consumer rank — all or none — then each rank pulls each
// row), and ended: completed on every rank, or timed out, cancelled or
// failed for the caller while in-flight pages stay retained until every
// load settled. docs/handoff.md has the state diagram and who owns each
// page when.
//
// Threads: every call may come from any thread (one mutex); receive()
// waits without holding it, so cancel() from another thread is queued and
// runs when that receive returns; start() gives each load to its rank
// without holding it, so a rank slow to take a load (an RPC, a connect to
// the producer) delays only that start(). Destroying the orchestrator while
// another thread is inside one of its calls is undefined, as for any object.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/engine/metrics.h"
#include "baton/handoff/layout.h"
#include "baton/handoff/rank.h"

namespace baton::handoff {

enum class TicketState : std::uint8_t {
  kCreated,    // a request and its consumer replica
  kBound,      // a producer replica, source pages allocated on each rank
  kGenerated,  // source pages written, the producer's addresses resolved
  kLoading,    // destination pages on every consumer rank, loads given (start() gives them one by one)
  kCompleted,  // every row loaded on every rank; the caller uses the pages until finish()
  kTimedOut,   // ended for the caller; pages retained until the loads settle
  kCancelled,  // likewise
  kFailed,     // likewise (a load failed, or its producer died)
  kReleased,   // every page returned to its pool
};
[[nodiscard]] std::string_view to_string(TicketState state);

struct HandoffConfig {
  // How long receive() waits by default.
  TimeNs transfer_timeout_ns = 60'000'000'000;
  // Each load's engine timeout (Request::timeout_ns; 0: the engine
  // policy's transfer_timeout): the bound on how long pages stay retained
  // behind a transfer that never ends. Keep it above transfer_timeout_ns,
  // so a slow load ends the ticket timed out (retained), not failed.
  TimeNs load_timeout_ns = 0;
  // Where the handoff's gauges and histograms go (optional; they are
  // declared there).
  engine::MetricsRegistry* metrics = nullptr;
  const Clock* clock = nullptr;  // a SteadyClock when null

  // invalid_argument for a transfer_timeout_ns not above 0 or a negative
  // load_timeout_ns. An orchestrator made with an invalid config answers
  // add_producer, add_consumer and create_ticket with this error.
  [[nodiscard]] Status validate() const;
};

struct TicketSpec {
  std::string request;
  std::string consumer;  // a consumer replica's name
  std::uint32_t tokens = 0;
};

// A snapshot of a ticket: the request, the replicas, both layouts, and the
// pages per row and rank (the byte ranges follow from the layouts).
struct Ticket {
  TicketId id = 0;
  std::string request;
  std::string producer;  // empty until bound
  std::string consumer;
  std::uint32_t tokens = 0;
  KvLayout producer_layout;
  KvLayout consumer_layout;
  TicketState state = TicketState::kCreated;
  Status status;  // why it ended, once it did
  std::vector<std::vector<SourcePages>> sources;                     // [row][producer rank]
  std::vector<std::vector<std::vector<std::uint32_t>>> destination;  // [row][consumer rank]
  std::uint32_t loads_pending = 0;  // (row, rank) loads not yet completed (given or still to give)
  TimeNs started_ns = 0;  // when start() dispatched the loads (HandoffConfig::clock)
  TimeNs ended_ns = 0;    // when it stopped loading: completed, or ended for the caller
};

// A consumer replica's pages by owner: reserved by a ticket still loading,
// in use by a completed ticket's caller, retained by a ticket that ended
// while loads were in flight.
struct PageCounts {
  std::uint64_t reserved = 0;
  std::uint64_t in_use = 0;
  std::uint64_t retained = 0;
};

class Orchestrator {
 public:
  explicit Orchestrator(HandoffConfig config = {});
  ~Orchestrator();
  Orchestrator(const Orchestrator&) = delete;
  Orchestrator& operator=(const Orchestrator&) = delete;

  // A replica with one rank per layout rank (index = rank index); the
  // ranks outlive the orchestrator. invalid_argument for an empty name, an
  // invalid layout, a rank count that is not the layout's (a missing worker
  // rank), a null rank, one rank object given twice, or a rank whose
  // page_bytes() is not the layout's; already_exists for a name taken.
  [[nodiscard]] Status add_producer(std::string name, const KvLayout& layout, std::vector<ProducerRank*> ranks);
  [[nodiscard]] Status add_consumer(std::string name, const KvLayout& layout, std::vector<ConsumerRank*> ranks);

  // not_found for an unknown consumer; invalid_argument for 0 tokens or an
  // empty request name; failed_precondition when the consumer stopped.
  [[nodiscard]] Result<TicketId> create_ticket(const TicketSpec& spec);
  // Binds to a producer replica and allocates the source pages of every
  // row on each of its ranks (all or none). not_found for an unknown ticket
  // or producer; invalid_argument when its layout does not describe the
  // consumer's KV; unavailable for a failed producer; resource_exhausted
  // when a rank has too few pages (the ticket stays created). A rank that
  // answers the wrong count or a page twice, or a rollback that fails,
  // marks the producer failed (internal).
  [[nodiscard]] Status bind(TicketId ticket, std::string_view producer);
  // After generation wrote the source pages: resolves the producer ranks'
  // engine addresses into the ticket.
  [[nodiscard]] Status generated(TicketId ticket);
  // Allocates the destination pages on every consumer rank — a failure on
  // one rolls back the others before any load is dispatched — then tells
  // each rank to load each row (the ticket is loading from then on, for
  // every other call). Short of pages while loads are owed, it first takes
  // the completions that arrived (progress()) and tries again; still short:
  // resource_exhausted, the ticket stays generated. A rank that refuses its
  // load fails the ticket (receive() says why); rows not yet given then are
  // not, nor are any once the replica stopped.
  [[nodiscard]] Status start(TicketId ticket);
  // Until every row is loaded on every rank (ok), a load failed (its
  // error), or `timeout_ns` passed (0: transfer_timeout): the ticket then
  // ends timed out, its pages retained until the late completions arrive.
  [[nodiscard]] Status receive(TicketId ticket, TimeNs timeout_ns = 0);
  // Ends the ticket cancelled; loads in flight are not interrupted and keep
  // their pages retained until they complete. During a receive() of the
  // ticket it is queued and runs when that receive returns (a ticket that
  // completed meanwhile is then released, and receive answers cancelled).
  // invalid_argument for a ticket that ended already, completed included
  // (finish() returns a completed ticket's pages), or whose cancel is
  // queued already.
  [[nodiscard]] Status cancel(TicketId ticket);
  // The caller is done with a completed ticket's pages: every page returns.
  [[nodiscard]] Status finish(TicketId ticket);
  // Takes the ranks' completions (only while tickets are loading or
  // retained) and returns the pages of tickets whose loads all settled.
  void progress();

  // A producer replica died: tickets bound to it that did not start loading
  // fail (their source pages died with it) and later binds are refused.
  // Tickets already loading from it still return their source pages to its
  // ranks (free()) when their loads settle: a dead rank's object must stay
  // alive and may refuse them.
  [[nodiscard]] Status producer_failed(std::string_view producer, const Status& why);
  // A consumer rank is gone: its replica stops (its pages may still be
  // written by a remote, so none is reused).
  [[nodiscard]] Status consumer_rank_failed(std::string_view consumer, std::uint32_t rank, const Status& why);
  // ok, or why the consumer replica stopped (every later call on its
  // tickets answers failed_precondition with it). not_found for a name.
  [[nodiscard]] Status consumer_status(std::string_view consumer) const;

  [[nodiscard]] Result<Ticket> ticket(TicketId ticket) const;
  [[nodiscard]] Result<PageCounts> pages(std::string_view consumer) const;
  [[nodiscard]] std::uint64_t tickets_in(TicketState state) const;
  // Forgets released tickets (a long-running orchestrator does not grow),
  // except one a receive() is still returning from or a start() is still
  // dispatching.
  void forget_released();

  // The first stop error of a consumer replica, else ok. Pages of a
  // stopped replica are left as they are.
  [[nodiscard]] Status shutdown();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace baton::handoff
