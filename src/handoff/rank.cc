#include "baton/handoff/rank.h"

#include <limits>
#include <utility>

namespace baton::handoff {
namespace {

Status check_pages(std::uint64_t page_bytes, std::uint32_t pages, const char* call) {
  if (page_bytes == 0 || pages == 0) return Status::invalid_argument("{}: {} pages of {} bytes", call, pages, page_bytes);
  if (pages > PagePool::kMaxPages) {
    return Status::invalid_argument("{}: {} pages (a pool holds at most {})", call, pages, PagePool::kMaxPages);
  }
  return Status::ok();
}

Result<engine::Region> allocate_exported(engine::Engine& engine, std::uint64_t page_bytes, std::uint32_t pages,
                                         const char* call) {
  if (auto s = check_pages(page_bytes, pages, call); !s.is_ok()) return std::unexpected(s);
  if (page_bytes > std::numeric_limits<std::uint64_t>::max() / pages) {
    return std::unexpected(Status::invalid_argument("{}: {} pages of {} bytes overflow", call, pages, page_bytes));
  }
  auto region = engine.allocate_memory(page_bytes * pages);
  if (!region) return region;
  if (auto s = engine.export_region(region->handle); !s.is_ok()) {
    (void)engine.unregister(region->handle);
    return std::unexpected(s);
  }
  return region;
}

// The caller's region, when `pages` pages of `page_bytes` fit in it.
Result<engine::Region> caller_region(engine::Engine& engine, engine::RegionHandle handle, std::uint64_t page_bytes,
                                     std::uint32_t pages, const char* call) {
  if (auto s = check_pages(page_bytes, pages, call); !s.is_ok()) return std::unexpected(s);
  auto region = engine.region(handle);
  if (!region) return std::unexpected(Status(region.error().code(), std::string(call) + ": " + region.error().message()));
  if (page_bytes > region->length / pages) {
    return std::unexpected(Status::invalid_argument("{}: {} pages of {} bytes do not fit region {} ({} bytes)", call,
                                                    pages, page_bytes, handle, region->length));
  }
  return region;
}

std::span<std::byte> page_span(const engine::Region& region, const PagePool& pool, std::uint32_t page) {
  if (page >= pool.pages()) return {};
  return {reinterpret_cast<std::byte*>(region.base) + page * pool.page_bytes(), pool.page_bytes()};
}

}  // namespace

Result<std::unique_ptr<ProducerWorker>> ProducerWorker::create(engine::Engine& engine, std::uint64_t page_bytes,
                                                               std::uint32_t pages) {
  auto region = allocate_exported(engine, page_bytes, pages, "ProducerWorker::create");
  if (!region) return std::unexpected(region.error());
  return std::unique_ptr<ProducerWorker>(new ProducerWorker(engine, *region, true, page_bytes, pages));
}

Result<std::unique_ptr<ProducerWorker>> ProducerWorker::create_over(engine::Engine& engine,
                                                                    engine::RegionHandle region,
                                                                    std::uint64_t page_bytes, std::uint32_t pages,
                                                                    const std::vector<std::string>& peers) {
  auto r = caller_region(engine, region, page_bytes, pages, "ProducerWorker::create_over");
  if (!r) return std::unexpected(r.error());
  if (auto s = engine.export_region(region, peers); !s.is_ok()) return std::unexpected(s);
  return std::unique_ptr<ProducerWorker>(new ProducerWorker(engine, *r, false, page_bytes, pages));
}

ProducerWorker::~ProducerWorker() {
  if (owned_) (void)engine_.unregister(region_.handle);
}

std::span<std::byte> ProducerWorker::page(std::uint32_t page) const { return page_span(region_, pool_, page); }

Result<std::unique_ptr<ConsumerWorker>> ConsumerWorker::create(engine::Engine& engine, std::uint64_t page_bytes,
                                                               std::uint32_t pages, PageTable table) {
  auto region = allocate_exported(engine, page_bytes, pages, "ConsumerWorker::create");
  if (!region) return std::unexpected(region.error());
  return std::unique_ptr<ConsumerWorker>(new ConsumerWorker(engine, *region, true, page_bytes, pages, table));
}

Result<std::unique_ptr<ConsumerWorker>> ConsumerWorker::create_over(engine::Engine& engine,
                                                                    engine::RegionHandle region,
                                                                    std::uint64_t page_bytes, std::uint32_t pages,
                                                                    PageTable table) {
  auto r = caller_region(engine, region, page_bytes, pages, "ConsumerWorker::create_over");
  if (!r) return std::unexpected(r.error());
  return std::unique_ptr<ConsumerWorker>(new ConsumerWorker(engine, *r, false, page_bytes, pages, table));
}

ConsumerWorker::~ConsumerWorker() {
  // Loads still running land in the region: let them end before it goes.
  std::lock_guard lock(mutex_);
  for (auto& p : pending_) {
    (void)engine_.cancel(p.batch);
    (void)engine_.wait(p.batch, 10'000'000'000);
    (void)engine_.release(p.batch);
  }
  if (owned_) (void)engine_.unregister(region_.handle);
}

std::span<std::byte> ConsumerWorker::page(std::uint32_t page) const { return page_span(region_, pool_, page); }

// The connect runs without mutex_: to a producer that is gone it takes the
// whole handshake timeout, and take_completions() (called under the
// orchestrator's mutex) must not wait for it. Two loads that race to the
// same new producer both connect; the engine has the second wait for the
// same handshake, and the first answer is kept.
Result<engine::Peer> ConsumerWorker::peer(const std::string& address) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = peers_.find(address); it != peers_.end()) return it->second;
  }
  auto p = engine_.connect(address);
  if (!p) return p;
  std::lock_guard lock(mutex_);
  return peers_.emplace(address, *p).first->second;
}

Result<engine::Batch> ConsumerWorker::batch_for(const LoadOrder& o) {
  const KvLayout& pl = o.producer;
  const KvLayout& cl = o.consumer;
  // The cheap checks first: a plan for absurd layouts is work before it is refused.
  if (auto s = pl.validate(); !s.is_ok()) return std::unexpected(Status::invalid_argument("load: producer {}", s.message()));
  if (auto s = cl.validate(); !s.is_ok()) return std::unexpected(Status::invalid_argument("load: consumer {}", s.message()));
  if (cl.page_bytes() != pool_.page_bytes()) {
    return std::unexpected(Status::invalid_argument("load: the consumer layout's pages are {} bytes, the pool's {}",
                                                    cl.page_bytes(), pool_.page_bytes()));
  }
  if (o.rank >= cl.ranks() || o.row >= cl.cfg || o.tokens == 0) {
    return std::unexpected(Status::invalid_argument("load: rank {} of {}, row {} of {}, {} tokens", o.rank,
                                                    cl.ranks(), o.row, cl.cfg, o.tokens));
  }
  const std::uint32_t total = cl.pages_for(o.tokens);
  if (o.sources.size() != pl.ranks()) {
    return std::unexpected(
        Status::invalid_argument("load: {} producer ranks named, the layout has {}", o.sources.size(), pl.ranks()));
  }
  for (std::uint32_t r = 0; r < pl.ranks(); ++r) {
    if (o.sources[r].pages.size() != pl.rank_pages(r, total)) {
      return std::unexpected(Status::invalid_argument("load: producer rank {} names {} pages (expected {})", r,
                                                      o.sources[r].pages.size(), pl.rank_pages(r, total)));
    }
  }
  if (o.pages.size() != cl.rank_pages(o.rank, total)) {
    return std::unexpected(Status::invalid_argument("load: {} destination pages for rank {} (expected {})",
                                                    o.pages.size(), o.rank, cl.rank_pages(o.rank, total)));
  }
  if (auto s = table_ == PageTable::kWorker ? pool_.check(o.pages) : pool_.check_range(o.pages); !s.is_ok()) {
    return std::unexpected(s);
  }
  // Only now the plan: a refused order costs no plan, and leaves none cached.
  auto plan = plans_.get(o.producer, o.consumer);
  if (!plan) return std::unexpected(plan.error());
  const std::uint32_t ct = o.rank % cl.tp;
  if (const std::uint64_t most = std::uint64_t{o.pages.size()} * (*plan)->runs(ct).size(); most > kMaxLoadRequests) {
    return std::unexpected(Status::invalid_argument(
        "load: {} pages of {} pieces each would be {} engine requests (at most {}): split the request, or use one KV "
        "order on both sides",
        o.pages.size(), (*plan)->runs(ct).size(), most, kMaxLoadRequests));
  }

  engine::Batch batch;
  const std::uint32_t first = cl.first_page(o.rank / cl.tp, total);
  for (std::uint32_t i = 0; i < o.pages.size(); ++i) {
    const std::uint32_t page = first + i;
    std::uint32_t ps = 0;  // the producer's sp group holding `page`
    while (pl.first_page(ps + 1, total) <= page) ++ps;
    const std::uint32_t local = page - pl.first_page(ps, total);
    for (const PageRun& run : (*plan)->runs(ct)) {
      const SourcePages& src = o.sources[ps * pl.tp + run.producer_tp];
      const std::uint64_t remote = src.pages[local] * pl.page_bytes() + run.src_offset;
      const std::uint64_t mine = o.pages[i] * pool_.page_bytes() + run.dst_offset;
      if (!batch.requests.empty()) {
        engine::Request& last = batch.requests.back();
        if (last.peer == src.address && last.remote_region == src.region &&
            last.remote_offset + last.length == remote && last.local_offset + last.length == mine) {
          last.length += run.length;
          continue;
        }
      }
      engine::Request r;
      r.op = engine::Op::kRead;
      r.local_region = region_.handle;
      r.local_offset = mine;
      r.peer = src.address;
      r.remote_region = src.region;
      r.remote_offset = remote;
      r.length = run.length;
      r.timeout_ns = o.timeout_ns;
      batch.requests.push_back(std::move(r));
    }
  }
  return batch;
}

Status ConsumerWorker::connect_sources(const LoadOrder& order) {
  for (const SourcePages& src : order.sources) {
    if (auto p = peer(src.address); !p) return p.error();
  }
  return Status::ok();
}

Status ConsumerWorker::load(const LoadOrder& order) {
  auto batch = batch_for(order);
  if (!batch) return batch.error();
  if (batch->requests.empty()) {
    // An sp group that holds none of a short request's pages: nothing to
    // move, and no reason to reach the producers.
    std::lock_guard lock(mutex_);
    ended_.push_back({order.ticket, order.row, order.rank, {}});
    return Status::ok();
  }
  // From here on a failure is the load's (an unreachable producer), not the order's.
  // Neither the connect nor the submit (which copies a small batch on this
  // thread) holds mutex_, which take_completions() needs.
  Status status = connect_sources(order);
  auto handle = status.is_ok() ? engine_.submit(*batch) : std::unexpected(status);
  if (!handle && handle.error().code() == StatusCode::kNotFound) {
    // A region exported after we connected: learn the peers' lists once.
    for (const SourcePages& src : order.sources) {
      if (auto p = peer(src.address)) (void)engine_.refresh(*p);
    }
    handle = engine_.submit(*batch);
  }
  std::lock_guard lock(mutex_);
  LoadCompletion completion{order.ticket, order.row, order.rank, {}};
  if (!handle) {
    completion.status = handle.error();
    ended_.push_back(std::move(completion));
    return Status::ok();
  }
  pending_.push_back({*handle, std::move(completion)});
  return Status::ok();
}

std::vector<LoadCompletion> ConsumerWorker::take_completions() {
  std::lock_guard lock(mutex_);
  std::vector<LoadCompletion> out = std::exchange(ended_, {});
  std::erase_if(pending_, [&](Pending& p) {
    // A batch still running is left alone: polling it is a round trip to
    // the engine's loop, which is busy with the copies (5 points of
    // overhead for 32 MiB loads, when a rank looked at every pending load
    // at each batch's end). Ended ones answer without the loop.
    if (engine_.wait(p.batch, 0).code() == StatusCode::kTimeout) return false;
    auto st = engine_.poll(p.batch);
    if (st && !st->done) return false;
    p.completion.status = st ? st->status : st.error();
    (void)engine_.release(p.batch);
    out.push_back(std::move(p.completion));
    return true;
  });
  return out;
}

}  // namespace baton::handoff
