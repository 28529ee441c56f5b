#include "baton/store/block_store.h"

#include <algorithm>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "baton/plan/encode.h"
#include "baton/plan/placement_table.h"
#include "baton/plan/wire.h"

namespace baton::store {

Status BlockLayout::validate() const {
  if (slots == 0 || segment_bytes == 0 || (segments != 1 && segments != 2)) {
    return Status::invalid_argument(
        "block layout: {} slots of {} segments of {} bytes (expected slots and bytes above 0, 1 or 2 segments)", slots,
        segments, segment_bytes);
  }
  if (slots > plan::kMaxSlots) {
    return Status::invalid_argument("block layout: {} slots (a plan carries at most {})", slots, plan::kMaxSlots);
  }
  return Status::ok();
}

namespace {

enum class PageKind : std::uint8_t { kFree, kUnsealed, kSealed };

struct Page {
  PageKind kind = PageKind::kFree;
  std::string producer;    // unsealed: who may seal it
  TimeNs expires_ns = 0;   // unsealed: when it returns unsealed
  std::uint64_t hash = 0;  // sealed
  std::uint32_t locks = 0;
  std::list<std::uint64_t>::iterator lru;  // sealed and unlocked only
};

struct Pool {
  engine::Region region;
  int numa = -1;
};

struct Namespace {
  BlockLayout layout;
  std::uint32_t per_pool = 0;
  std::vector<Pool> pools;
  std::vector<Page> pages;
  std::set<std::uint64_t> free;      // lowest first: neighbours merge into one plan chunk
  std::set<std::uint64_t> unsealed;  // for expiry and producer_gone
  std::unordered_map<std::uint64_t, std::uint64_t> index;  // hash → page
  std::list<std::uint64_t> lru;  // sealed, unlocked; front: most recently used
  // Refilled by every query (reset keeps its buffers): a 4500-block table
  // of 288 slots × K, V is 31 MB, whose fresh pages cost more than the
  // encoding.
  plan::PlacementTable table;

  [[nodiscard]] const Pool& pool(std::uint64_t page) const { return pools[page / per_pool]; }
  [[nodiscard]] std::uint64_t offset(std::uint64_t page) const { return (page % per_pool) * layout.block_bytes(); }
  [[nodiscard]] std::uint64_t address(std::uint64_t page) const { return pool(page).region.base + offset(page); }
};

struct Session {
  std::string ns;
  std::vector<std::uint64_t> pages;
  TimeNs expires_ns = 0;
};

}  // namespace

struct BlockStore::State {
  engine::Engine& engine;
  StoreConfig config;
  mutable std::mutex mutex;
  std::map<std::string, Namespace, std::less<>> namespaces;
  std::unordered_map<std::uint64_t, Session> sessions;
  std::mt19937_64 rng{std::random_device{}()};
  StoreStats counters;  // the counters; the gauges are computed in stats()

  State(engine::Engine& e, StoreConfig c) : engine(e), config(c) {}

  static void lock(Namespace& ns, std::uint64_t page) {
    Page& p = ns.pages[page];
    if (p.locks++ == 0) ns.lru.erase(p.lru);
  }
  static void unlock(Namespace& ns, std::uint64_t page) {
    Page& p = ns.pages[page];
    if (--p.locks == 0) p.lru = ns.lru.insert(ns.lru.begin(), page);
  }
  static void free_page(Namespace& ns, std::uint64_t page) {
    Page& p = ns.pages[page];
    if (p.kind == PageKind::kUnsealed) ns.unsealed.erase(page);
    p = Page{};
    ns.free.insert(page);
  }

  void unlock_session(const Session& s) {
    Namespace& ns = namespaces.at(s.ns);
    for (std::uint64_t page : s.pages) unlock(ns, page);
  }

  StoreStats snapshot() const {
    StoreStats s = counters;
    s.sessions = sessions.size();
    for (const auto& [name, ns] : namespaces) {
      s.blocks += ns.index.size();
      s.bytes += ns.index.size() * ns.layout.block_bytes();
      s.unsealed += ns.unsealed.size();
      s.free_pages += ns.free.size();
      s.locked_blocks += ns.index.size() - ns.lru.size();
    }
    return s;
  }

  void publish() {
    engine::MetricsRegistry* m = config.metrics;
    if (m == nullptr) return;
    const StoreStats s = snapshot();
    m->set("baton_store_blocks", {}, s.blocks);
    m->set("baton_store_bytes", {}, s.bytes);
    m->set("baton_store_unsealed_pages", {}, s.unsealed);
    m->set("baton_store_free_pages", {}, s.free_pages);
    m->set("baton_store_sessions", {}, s.sessions);
    m->set("baton_store_locked_blocks", {}, s.locked_blocks);
  }

  // Adds to one of the totals and to its counter.
  void count(std::uint64_t StoreStats::*field, std::string_view metric, std::uint64_t n) {
    if (n == 0) return;
    counters.*field += n;
    if (config.metrics != nullptr) config.metrics->add(metric, {}, n);
  }
};

BlockStore::BlockStore(std::unique_ptr<State> state) : state_(std::move(state)) {}

BlockStore::~BlockStore() {
  for (auto& [name, ns] : state_->namespaces) {
    for (const Pool& pool : ns.pools) (void)state_->engine.unregister(pool.region.handle);
  }
}

Result<std::unique_ptr<BlockStore>> BlockStore::create(engine::Engine& engine, StoreConfig config) {
  if (config.lock_timeout_ns <= 0 || config.unsealed_timeout_ns <= 0 || config.max_sessions == 0) {
    return std::unexpected(Status::invalid_argument("BlockStore: lock timeout {} ns, unsealed timeout {} ns, {} max "
                                                    "sessions (expected each above 0)",
                                                    config.lock_timeout_ns, config.unsealed_timeout_ns,
                                                    config.max_sessions));
  }
  if (auto* m = config.metrics) {
    for (const char* name : {"baton_store_blocks", "baton_store_bytes", "baton_store_unsealed_pages",
                             "baton_store_free_pages", "baton_store_sessions", "baton_store_locked_blocks"}) {
      (void)m->declare_gauge(name, "The block store's current state (docs/store.md).");
      m->set(name, {}, 0);  // a series from the start: a scrape before the first change sees 0, not nothing
    }
    for (const char* name : {"baton_store_evictions_total", "baton_store_expired_locks_total",
                             "baton_store_reclaimed_pages_total", "baton_store_hashes_asked_total",
                             "baton_store_hashes_found_total"}) {
      (void)m->declare_counter(name, "The block store's totals (hit ratio: found / asked).");
      m->add(name, {}, 0);
    }
  }
  return std::unique_ptr<BlockStore>(new BlockStore(std::make_unique<State>(engine, config)));
}

Status BlockStore::add_namespace(const NamespaceConfig& c) {
  if (c.name.empty()) return Status::invalid_argument("add_namespace: an empty name");
  if (auto s = c.layout.validate(); !s.is_ok()) return Status::invalid_argument("add_namespace {}: {}", c.name, s.message());
  if (c.blocks_per_numa == 0 || c.numa_nodes.empty()) {
    return Status::invalid_argument("add_namespace {}: {} blocks on {} NUMA nodes (expected at least 1 of each)",
                                    c.name, c.blocks_per_numa, c.numa_nodes.size());
  }
  if (c.blocks_per_numa > kMaxBlocksPerPool) {
    return Status::invalid_argument("add_namespace {}: {} blocks a pool (at most {})", c.name, c.blocks_per_numa,
                                    kMaxBlocksPerPool);
  }
  std::uint64_t pool_bytes = 0;
  if (__builtin_mul_overflow(c.layout.block_bytes(), std::uint64_t{c.blocks_per_numa}, &pool_bytes)) {
    return Status::invalid_argument("add_namespace {}: {} blocks of {} bytes a pool is more than 2**64 bytes", c.name,
                                    c.blocks_per_numa, c.layout.block_bytes());
  }
  for (std::size_t i = 0; i < c.numa_nodes.size(); ++i) {
    if (std::find(c.numa_nodes.begin(), c.numa_nodes.begin() + i, c.numa_nodes[i]) != c.numa_nodes.begin() + i) {
      return Status::invalid_argument("add_namespace {}: NUMA node {} named twice", c.name, c.numa_nodes[i]);
    }
  }
  std::lock_guard lock(state_->mutex);
  if (state_->namespaces.contains(c.name)) return Status::already_exists("add_namespace: {} exists", c.name);
  Namespace ns;
  ns.layout = c.layout;
  ns.per_pool = c.blocks_per_numa;
  for (int numa : c.numa_nodes) {
    auto region = state_->engine.allocate_memory(pool_bytes, numa);
    Status s = region ? state_->engine.export_region(region->handle) : region.error();
    if (!s.is_ok()) {
      if (region) (void)state_->engine.unregister(region->handle);
      for (const Pool& p : ns.pools) (void)state_->engine.unregister(p.region.handle);
      return Status(s.code(), fmt::format("add_namespace {}: the pool on NUMA node {}: {}", c.name, numa, s.message()));
    }
    ns.pools.push_back({*region, numa});
  }
  ns.pages.resize(std::size_t{c.blocks_per_numa} * ns.pools.size());
  for (std::uint64_t p = 0; p < ns.pages.size(); ++p) ns.free.insert(ns.free.end(), p);
  state_->namespaces.emplace(c.name, std::move(ns));
  state_->publish();
  return Status::ok();
}

Result<BlockLayout> BlockStore::layout(std::string_view ns) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->namespaces.find(ns);
  if (it == state_->namespaces.end()) return std::unexpected(Status::not_found("no namespace \"{}\"", ns));
  return it->second.layout;
}

std::vector<std::pair<std::string, BlockLayout>> BlockStore::namespaces() const {
  std::lock_guard lock(state_->mutex);
  std::vector<std::pair<std::string, BlockLayout>> out;
  for (const auto& [name, ns] : state_->namespaces) out.emplace_back(name, ns.layout);
  return out;
}

Result<std::vector<BlockPage>> BlockStore::allocate_blocks(std::string_view name, std::uint32_t count,
                                                            std::string_view producer, TimeNs now_ns) {
  if (count == 0 || producer.empty()) {
    return std::unexpected(Status::invalid_argument("allocate_blocks: {} blocks for producer \"{}\" (expected at "
                                                    "least one, and a producer name)",
                                                    count, producer));
  }
  std::lock_guard lock(state_->mutex);
  auto it = state_->namespaces.find(name);
  if (it == state_->namespaces.end()) return std::unexpected(Status::not_found("allocate_blocks: no namespace \"{}\"", name));
  Namespace& ns = it->second;
  if (ns.free.size() + ns.lru.size() < count) {
    return std::unexpected(Status::resource_exhausted(
        "allocate_blocks {}: {} blocks asked; {} free and {} evictable ({} locked, {} unsealed)", name, count,
        ns.free.size(), ns.lru.size(), ns.index.size() - ns.lru.size(), ns.unsealed.size()));
  }
  while (ns.free.size() < count) {  // least recently used first; never a locked one
    const std::uint64_t victim = ns.lru.back();
    ns.lru.pop_back();
    ns.index.erase(ns.pages[victim].hash);
    State::free_page(ns, victim);
    state_->count(&StoreStats::evictions, "baton_store_evictions_total", 1);
  }
  std::vector<BlockPage> out;
  out.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint64_t page = *ns.free.begin();
    ns.free.erase(ns.free.begin());
    Page& p = ns.pages[page];
    p.kind = PageKind::kUnsealed;
    p.producer = std::string(producer);
    p.expires_ns = time_after(now_ns, state_->config.unsealed_timeout_ns);  // INT64_MAX: never
    ns.unsealed.insert(page);
    const Pool& pool = ns.pool(page);
    out.push_back({page, pool.region.handle, ns.offset(page), ns.address(page), pool.numa});
  }
  state_->publish();
  return out;
}

Status BlockStore::seal(std::string_view name, std::string_view producer, std::span<const std::uint64_t> pages,
                        std::span<const std::uint64_t> hashes, const BlockLayout& layout) {
  if (pages.empty() || pages.size() != hashes.size()) {
    return Status::invalid_argument("seal: {} pages and {} hashes (expected the same count, at least one)",
                                    pages.size(), hashes.size());
  }
  if (std::unordered_set<std::uint64_t>(hashes.begin(), hashes.end()).size() != hashes.size()) {
    return Status::invalid_argument("seal: a hash is named twice");
  }
  if (std::unordered_set<std::uint64_t>(pages.begin(), pages.end()).size() != pages.size()) {
    return Status::invalid_argument("seal: a page is named twice");
  }
  std::lock_guard lock(state_->mutex);
  auto it = state_->namespaces.find(name);
  if (it == state_->namespaces.end()) return Status::not_found("seal: no namespace \"{}\"", name);
  Namespace& ns = it->second;
  if (!(layout == ns.layout)) {
    return Status::invalid_argument("seal {}: layout {} slots × {} segments × {} bytes, the namespace's is {} × {} × {}",
                                    name, layout.slots, layout.segments, layout.segment_bytes, ns.layout.slots,
                                    ns.layout.segments, ns.layout.segment_bytes);
  }
  for (std::uint64_t page : pages) {
    if (page >= ns.pages.size() || ns.pages[page].kind != PageKind::kUnsealed || ns.pages[page].producer != producer) {
      return Status::failed_precondition("seal {}: page {} is not an unsealed page of producer \"{}\"", name, page,
                                         producer);
    }
  }
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (ns.index.contains(hashes[i])) {
      State::free_page(ns, pages[i]);  // sealed already: the first copy stays
      continue;
    }
    ns.unsealed.erase(pages[i]);
    Page& p = ns.pages[pages[i]];
    p = Page{};
    p.kind = PageKind::kSealed;
    p.hash = hashes[i];
    p.lru = ns.lru.insert(ns.lru.begin(), pages[i]);
    ns.index.emplace(hashes[i], pages[i]);
  }
  state_->publish();
  return Status::ok();
}

Result<QueryAnswer> BlockStore::query(std::string_view name, std::span<const std::uint64_t> hashes,
                                      std::string_view requester, TimeNs now_ns) {
  if (hashes.empty() || requester.empty()) {
    return std::unexpected(Status::invalid_argument("query: {} hashes from requester \"{}\" (expected at least one, "
                                                    "and a requester name)",
                                                    hashes.size(), requester));
  }
  if (std::unordered_set<std::uint64_t>(hashes.begin(), hashes.end()).size() != hashes.size()) {
    return std::unexpected(Status::invalid_argument("query: a hash is named twice"));
  }
  std::lock_guard lock(state_->mutex);
  auto it = state_->namespaces.find(name);
  if (it == state_->namespaces.end()) return std::unexpected(Status::not_found("query: no namespace \"{}\"", name));
  Namespace& ns = it->second;
  state_->count(&StoreStats::hashes_asked, "baton_store_hashes_asked_total", hashes.size());
  std::vector<std::uint64_t> found;
  for (std::uint64_t h : hashes) {
    auto at = ns.index.find(h);
    if (at == ns.index.end()) break;
    found.push_back(at->second);
  }
  state_->count(&StoreStats::hashes_found, "baton_store_hashes_found_total", found.size());
  QueryAnswer answer;
  answer.found = static_cast<std::uint32_t>(found.size());
  if (found.empty()) return answer;
  if (state_->sessions.size() >= state_->config.max_sessions) {
    return std::unexpected(Status::resource_exhausted(
        "query {}: {} sessions held (max_sessions); release some or wait for their locks to expire", name,
        state_->sessions.size()));
  }

  for (std::uint64_t page : found) State::lock(ns, page);
  auto fail = [&](const Status& why) {
    for (std::uint64_t page : found) State::unlock(ns, page);  // the requester never saw a session
    state_->publish();
    return std::unexpected(Status(why.code(), fmt::format("query {}: {}", name, why.message())));
  };
  const BlockLayout& l = ns.layout;
  if (auto s = ns.table.reset(answer.found, l.slots, l.segments); !s.is_ok()) return fail(s);
  plan::PlacementTable* table = &ns.table;
  // Each block's address and node once; then column by column (each
  // (slot, segment) column is contiguous), a loop the compiler vectorizes.
  std::vector<std::uint64_t> base(answer.found);
  std::vector<std::int16_t> node(answer.found);
  for (std::uint32_t b = 0; b < answer.found; ++b) {
    base[b] = ns.address(found[b]);
    node[b] = static_cast<std::int16_t>(ns.pool(found[b]).numa);
  }
  for (std::uint32_t s = 0; s < l.slots; ++s) {
    for (std::uint32_t g = 0; g < l.segments; ++g) {
      const std::uint64_t within = (std::uint64_t{s} * l.segments + g) * l.segment_bytes;
      std::uint64_t* addresses = table->addresses(s, g).data();
      std::uint32_t* lengths = table->lengths(s, g).data();
      for (std::uint32_t b = 0; b < answer.found; ++b) {
        addresses[b] = base[b] + within;
        lengths[b] = l.segment_bytes;
      }
    }
    std::ranges::copy(node, table->numa_column(s).begin());
  }
  auto encoded = plan::encode_plan(*table, hashes.first(answer.found));
  if (!encoded) return fail(encoded.error());
  answer.plan = plan::serialize_plan(*encoded);
  do {
    answer.session = state_->rng();
  } while (answer.session == 0 || state_->sessions.contains(answer.session));
  state_->sessions.emplace(answer.session,
                           Session{std::string(name), std::move(found), time_after(now_ns, state_->config.lock_timeout_ns)});
  state_->publish();
  return answer;
}

Status BlockStore::release(std::uint64_t session) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->sessions.find(session);
  if (it == state_->sessions.end()) {
    return Status::not_found("release: no session {:#x} (released, expired or never given)", session);
  }
  state_->unlock_session(it->second);
  state_->sessions.erase(it);
  state_->publish();
  return Status::ok();
}

void BlockStore::producer_gone(std::string_view producer) {
  std::lock_guard lock(state_->mutex);
  for (auto& [name, ns] : state_->namespaces) {
    std::vector<std::uint64_t> gone;
    for (std::uint64_t page : ns.unsealed) {
      if (ns.pages[page].producer == producer) gone.push_back(page);
    }
    for (std::uint64_t page : gone) State::free_page(ns, page);
    state_->count(&StoreStats::reclaimed_pages, "baton_store_reclaimed_pages_total", gone.size());
  }
  state_->publish();
}

void BlockStore::tick(TimeNs now_ns) {
  std::lock_guard lock(state_->mutex);
  std::erase_if(state_->sessions, [&](const auto& kv) {
    if (kv.second.expires_ns > now_ns) return false;
    state_->unlock_session(kv.second);
    state_->count(&StoreStats::expired_locks, "baton_store_expired_locks_total", 1);
    return true;
  });
  for (auto& [name, ns] : state_->namespaces) {
    std::vector<std::uint64_t> expired;
    for (std::uint64_t page : ns.unsealed) {
      if (ns.pages[page].expires_ns <= now_ns) expired.push_back(page);
    }
    for (std::uint64_t page : expired) State::free_page(ns, page);
    state_->count(&StoreStats::reclaimed_pages, "baton_store_reclaimed_pages_total", expired.size());
  }
  state_->publish();
}

StoreStats BlockStore::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->snapshot();
}

}  // namespace baton::store
