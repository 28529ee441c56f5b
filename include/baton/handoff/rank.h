// The ranks of a serving stage as the handoff sees them: a producer rank
// hands out source pages it generates KV into; a consumer rank hands out
// destination pages and loads (pulls) a row of a request into them.
// The orchestrator talks to ranks through these interfaces only, so a rank
// may live in this process (ProducerWorker, ConsumerWorker over an Engine)
// or behind any RPC a serving framework already has.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/engine/engine.h"
#include "baton/handoff/layout.h"
#include "baton/handoff/page_pool.h"

namespace baton::handoff {

using TicketId = std::uint64_t;

// One producer rank's pages of one row: where a consumer reads them.
struct SourcePages {
  std::string address;  // the rank's engine (Engine::address())
  engine::RegionHandle region = 0;
  std::vector<std::uint32_t> pages;  // pages of layout.page_bytes() each
};

// Load row `row` of ticket `ticket` into consumer rank `rank`'s `pages`
// from the producer ranks' pages (`sources`, indexed by producer rank).
struct LoadOrder {
  TicketId ticket = 0;
  std::uint32_t row = 0;
  std::uint32_t tokens = 0;
  KvLayout producer;
  KvLayout consumer;
  std::uint32_t rank = 0;
  std::vector<SourcePages> sources;
  std::vector<std::uint32_t> pages;
  TimeNs timeout_ns = 0;  // each transfer's (Request::timeout_ns)
};

struct LoadCompletion {
  TicketId ticket = 0;
  std::uint32_t row = 0;
  std::uint32_t rank = 0;
  Status status;
};

class ProducerRank {
 public:
  virtual ~ProducerRank() = default;
  // The size of its pages: the orchestrator refuses a rank whose pages are
  // not its replica layout's (consumers would read the wrong bytes).
  [[nodiscard]] virtual std::uint64_t page_bytes() const = 0;
  [[nodiscard]] virtual std::string address() const = 0;
  [[nodiscard]] virtual engine::RegionHandle region() const = 0;
  [[nodiscard]] virtual Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) = 0;
  [[nodiscard]] virtual Status free(std::span<const std::uint32_t> pages) = 0;
};

class ConsumerRank {
 public:
  virtual ~ConsumerRank() = default;
  // As ProducerRank::page_bytes.
  [[nodiscard]] virtual std::uint64_t page_bytes() const = 0;
  // The size of its pool, in pages (what allocate() answers is checked
  // against it).
  [[nodiscard]] virtual std::uint32_t pool_pages() const = 0;
  [[nodiscard]] virtual Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) = 0;
  [[nodiscard]] virtual Status free(std::span<const std::uint32_t> pages) = 0;
  // Starts the load and returns; its end comes from take_completions().
  // An error here means nothing was started. The orchestrator calls it
  // without its mutex (its other calls on ranks hold it), so loads of
  // different tickets may come from several threads at once, beside this
  // rank's other calls.
  [[nodiscard]] virtual Status load(const LoadOrder& order) = 0;
  [[nodiscard]] virtual std::vector<LoadCompletion> take_completions() = 0;
  // Asks the rank to call `wake` (from any thread, holding none of its
  // locks) whenever completions are ready to take; an empty function stops
  // it. A rank that cannot tell (its completions are found by polling)
  // answers false, and the orchestrator polls it.
  [[nodiscard]] virtual bool on_completion(std::function<void()> wake) {
    (void)wake;
    return false;
  }
};

// A producer rank over an Engine: a pool of `pages` pages of `page_bytes`
// in memory the engine allocates (a memfd same-host peers map) and exports
// to every peer.
class ProducerWorker final : public ProducerRank {
 public:
  [[nodiscard]] static Result<std::unique_ptr<ProducerWorker>> create(engine::Engine& engine,
                                                                      std::uint64_t page_bytes,
                                                                      std::uint32_t pages);
  // The same over memory the caller registered with `engine` (a serving
  // framework's KV cache, GPU memory included): the pool is the region's
  // first `pages` pages. The worker exports the whole region to `peers`
  // (Engine::export_region: their listen addresses; empty, every peer that
  // proved the deployment secret — exports add up) and never unregisters
  // it; the caller keeps it registered while the worker lives.
  // invalid_argument for no pages, or pages beyond the region; not_found
  // for a region the engine does not have.
  [[nodiscard]] static Result<std::unique_ptr<ProducerWorker>> create_over(
      engine::Engine& engine, engine::RegionHandle region, std::uint64_t page_bytes, std::uint32_t pages,
      const std::vector<std::string>& peers = {});
  ~ProducerWorker() override;

  [[nodiscard]] std::uint64_t page_bytes() const override { return pool_.page_bytes(); }
  [[nodiscard]] std::string address() const override { return engine_.address(); }
  [[nodiscard]] engine::RegionHandle region() const override { return region_.handle; }
  [[nodiscard]] Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) override { return pool_.allocate(pages); }
  [[nodiscard]] Status free(std::span<const std::uint32_t> pages) override { return pool_.free(pages); }
  // The bytes of page `page` (where generation writes); empty outside the
  // pool. In GPU memory, a device address: for the GPU's kernels and
  // copies, not for the CPU.
  [[nodiscard]] std::span<std::byte> page(std::uint32_t page) const;
  [[nodiscard]] const PagePool& pool() const { return pool_; }
  [[nodiscard]] const engine::Region& memory() const { return region_; }

 private:
  ProducerWorker(engine::Engine& engine, engine::Region region, bool owned, std::uint64_t page_bytes,
                 std::uint32_t pages)
      : engine_(engine), region_(region), owned_(owned), pool_(page_bytes, pages) {}
  engine::Engine& engine_;
  engine::Region region_;
  const bool owned_;  // allocated by create(): unregistered with the worker
  PagePool pool_;
};

// Who keeps a consumer rank's page table. kWorker: the worker's own pool
// (allocate()/free() here; a load's pages must be allocated). kCaller: a
// scheduler elsewhere keeps it, as vLLM's keeps one block table for all its
// workers — the worker only holds the memory and checks that a load's pages
// lie inside it, and allocation costs the scheduler no round trip.
enum class PageTable : std::uint8_t { kWorker, kCaller };

// A consumer rank over an Engine: its pool as ProducerWorker's, and loads as
// engine batches of reads from the producer ranks, one per row, built from
// the layout pair's reshape plan (computed once, PlanCache) with
// neighbouring ranges merged into one request.
class ConsumerWorker final : public ConsumerRank {
 public:
  [[nodiscard]] static Result<std::unique_ptr<ConsumerWorker>> create(engine::Engine& engine,
                                                                      std::uint64_t page_bytes,
                                                                      std::uint32_t pages,
                                                                      PageTable table = PageTable::kWorker);
  // The same over memory the caller registered with `engine` (the pool is
  // its first `pages` pages), as ProducerWorker::create_over; a consumer's
  // pages are only read into, so the region is not exported.
  [[nodiscard]] static Result<std::unique_ptr<ConsumerWorker>> create_over(engine::Engine& engine,
                                                                           engine::RegionHandle region,
                                                                           std::uint64_t page_bytes,
                                                                           std::uint32_t pages,
                                                                           PageTable table = PageTable::kWorker);
  ~ConsumerWorker() override;

  [[nodiscard]] std::uint64_t page_bytes() const override { return pool_.page_bytes(); }
  [[nodiscard]] std::uint32_t pool_pages() const override { return pool_.pages(); }
  [[nodiscard]] Result<std::vector<std::uint32_t>> allocate(std::uint32_t pages) override { return pool_.allocate(pages); }
  [[nodiscard]] Status free(std::span<const std::uint32_t> pages) override { return pool_.free(pages); }
  // invalid_argument for an order that does not fit the layouts (rank out
  // of range, a source or page count off, page bytes not the pool's, a
  // layout pair ReshapePlan refuses, more than kMaxLoadRequests requests);
  // out_of_range / failed_precondition for destination pages outside the
  // pool or not allocated. Transfer errors (an unreachable producer) come
  // as the completion's status.
  [[nodiscard]] Status load(const LoadOrder& order) override;
  [[nodiscard]] std::vector<LoadCompletion> take_completions() override;

  // The most engine requests one load may take (pages x the plan's pieces
  // of a page, before neighbours merge): ~0.4 GB of them.
  static constexpr std::uint64_t kMaxLoadRequests = std::uint64_t{1} << 22;
  // The engine batch a load submits (for a plain-batch baseline of the same
  // bytes), with load()'s errors; submitting it needs connect_sources().
  [[nodiscard]] Result<engine::Batch> batch_for(const LoadOrder& order);
  // Connects to the order's producer ranks (once each); the engine's errors.
  [[nodiscard]] Status connect_sources(const LoadOrder& order);
  // As ProducerWorker::page (a device address in GPU memory).
  [[nodiscard]] std::span<std::byte> page(std::uint32_t page) const;
  [[nodiscard]] const PagePool& pool() const { return pool_; }
  [[nodiscard]] const engine::Region& memory() const { return region_; }
  [[nodiscard]] const PlanCache& plans() const { return plans_; }

 private:
  struct Pending {
    engine::BatchHandle batch;
    LoadCompletion completion;
  };
  ConsumerWorker(engine::Engine& engine, engine::Region region, bool owned, std::uint64_t page_bytes,
                 std::uint32_t pages, PageTable table)
      : engine_(engine), region_(region), owned_(owned), pool_(page_bytes, pages), table_(table) {}
  Result<engine::Peer> peer(const std::string& address);  // takes mutex_, not while it connects

  engine::Engine& engine_;
  engine::Region region_;
  const bool owned_;
  PagePool pool_;
  const PageTable table_;
  PlanCache plans_;
  std::mutex mutex_;  // guards the two below
  std::map<std::string, engine::Peer> peers_;
  std::vector<Pending> pending_;
  std::vector<LoadCompletion> ended_;  // loads that failed before submit
};

}  // namespace baton::handoff
