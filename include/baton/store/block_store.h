// The block holder at the heart of `baton store`: KV blocks of several
// namespaces in engine-allocated memory (one pool per NUMA node per
// namespace, exported to every peer), indexed by block hash. Producers
// allocate pages, write them with their engine and seal them; requesters
// query a list of hashes and get the found prefix as a transfer plan
// (plan/'s wire form) under a session lock, which they release (or which
// expires). Least recently used blocks make room under capacity pressure;
// a locked block is never evicted. docs/store.md has the lifecycle.
//
// Threads: every call may come from any thread (one mutex). Time enters as
// `now_ns` arguments (the engine's clock), so tests drive expiry.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"
#include "baton/engine/engine.h"
#include "baton/engine/metrics.h"

namespace baton::store {

// How one block of a namespace is laid out: `slots` (layers × TP ranks)
// of `segments` (1: fused KV or MLA; 2: K and V) of `segment_bytes`, slot
// by slot in one page.
struct BlockLayout {
  std::uint32_t slots = 0;
  std::uint32_t segments = 1;
  std::uint32_t segment_bytes = 0;

  // invalid_argument for a zero field, segments other than 1 or 2, or
  // more slots than a plan carries.
  [[nodiscard]] Status validate() const;
  [[nodiscard]] std::uint64_t block_bytes() const {
    return std::uint64_t{slots} * segments * segment_bytes;
  }
  friend bool operator==(const BlockLayout&, const BlockLayout&) = default;
};

struct NamespaceConfig {
  std::string name;
  BlockLayout layout;
  std::uint32_t blocks_per_numa = 0;
  // A pool on each of these NUMA nodes. -1 lets the kernel place it, but a
  // plan then names no node and a requester cannot rebuild it on the right
  // one (plan::layout_slabs refuses it): name the nodes.
  std::vector<int> numa_nodes = {0};
};

struct StoreConfig {
  // A query's lock lasts this long unless released.
  TimeNs lock_timeout_ns = 120'000'000'000;
  // Pages a producer allocated and did not seal return after this long.
  TimeNs unsealed_timeout_ns = 60'000'000'000;
  // Sessions held at once: a requester that queries and never releases
  // cannot grow the store without bound (each holds a list of its blocks
  // until it expires). A query past it answers resource_exhausted.
  std::uint32_t max_sessions = 65536;
  // Where the store's gauges and counters go (optional).
  engine::MetricsRegistry* metrics = nullptr;
};

// A page handed to a producer: where to write one block.
struct BlockPage {
  std::uint64_t page = 0;  // what seal() names
  engine::RegionHandle region = 0;
  std::uint64_t offset = 0;   // in the region
  std::uint64_t address = 0;  // in the store's address space (what plans carry)
  int numa = -1;
};

struct QueryAnswer {
  std::uint32_t found = 0;   // the hashes found, from the first: a prefix
  std::string plan;          // plan/'s wire form of those blocks; empty when none
  std::uint64_t session = 0; // holds their lock until release(); 0 when none
};

struct StoreStats {
  std::uint64_t blocks = 0;    // sealed
  std::uint64_t bytes = 0;     // sealed blocks' bytes
  std::uint64_t unsealed = 0;  // pages held by producers
  std::uint64_t free_pages = 0;
  std::uint64_t sessions = 0;
  std::uint64_t locked_blocks = 0;  // blocks some session holds
  std::uint64_t evictions = 0;
  std::uint64_t expired_locks = 0;
  std::uint64_t reclaimed_pages = 0;  // unsealed pages taken back
  std::uint64_t hashes_asked = 0;
  std::uint64_t hashes_found = 0;
  [[nodiscard]] double hit_ratio() const {
    return hashes_asked == 0 ? 0.0 : static_cast<double>(hashes_found) / static_cast<double>(hashes_asked);
  }
};

class BlockStore {
 public:
  [[nodiscard]] static Result<std::unique_ptr<BlockStore>> create(engine::Engine& engine, StoreConfig config = {});
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // Blocks of one pool, at most: each has its bookkeeping in this process
  // (a billion blocks of one byte ran it out of memory).
  static constexpr std::uint32_t kMaxBlocksPerPool = 1u << 22;

  // Allocates and exports the namespace's pools. invalid_argument for an
  // empty name, an invalid layout, 0 or more than kMaxBlocksPerPool blocks,
  // no NUMA node or one named twice; already_exists for a name taken; the
  // engine's errors.
  [[nodiscard]] Status add_namespace(const NamespaceConfig& config);
  [[nodiscard]] Result<BlockLayout> layout(std::string_view ns) const;
  [[nodiscard]] std::vector<std::pair<std::string, BlockLayout>> namespaces() const;

  // `count` pages for `producer` to write, lowest first on each pool, all
  // or none: least recently used unlocked blocks are evicted to make room;
  // resource_exhausted when even that is not enough. not_found for an
  // unknown namespace; invalid_argument for 0 or an empty producer.
  [[nodiscard]] Result<std::vector<BlockPage>> allocate_blocks(std::string_view ns, std::uint32_t count,
                                                               std::string_view producer, TimeNs now_ns);
  // Seals written pages under their hashes (all or none). A hash sealed
  // already keeps its first copy and this page returns to the pool.
  // invalid_argument for counts that differ, a hash named twice or a
  // layout other than the namespace's; failed_precondition for a page not
  // allocated to this producer (or sealed already).
  [[nodiscard]] Status seal(std::string_view ns, std::string_view producer, std::span<const std::uint64_t> pages,
                            std::span<const std::uint64_t> hashes, const BlockLayout& layout);
  // The blocks of `hashes` found from the first on, locked, as a plan.
  // not_found for an unknown namespace; invalid_argument for no hashes, a
  // hash named twice or an empty requester; resource_exhausted at
  // max_sessions (nothing locked). When encoding the plan fails,
  // the lock is released before the error returns.
  [[nodiscard]] Result<QueryAnswer> query(std::string_view ns, std::span<const std::uint64_t> hashes,
                                          std::string_view requester, TimeNs now_ns);
  // not_found for a session unknown (released, expired, never given).
  [[nodiscard]] Status release(std::uint64_t session);
  // A producer is gone: its unsealed pages return at once.
  void producer_gone(std::string_view producer);
  // Expires locks and unsealed pages past their time.
  void tick(TimeNs now_ns);

  [[nodiscard]] StoreStats stats() const;

 private:
  struct State;
  explicit BlockStore(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::store
