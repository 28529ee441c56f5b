// The block store over gRPC (proto/baton/store.proto): StoreServer serves a
// BlockStore and runs its collector; StoreClient is the other side. gRPC and
// protobuf stay inside src/store/: these headers name neither.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "baton/common/status.h"
#include "baton/engine/engine.h"
#include "baton/plan/materialize.h"
#include "baton/plan/rebuild.h"
#include "baton/store/block_store.h"

namespace baton::store {

struct ServerConfig {
  std::string listen = "127.0.0.1:0";  // port 0: an ephemeral one (StoreServer::address())
  // How often the collector expires locks and unsealed pages.
  TimeNs collect_every_ns = 1'000'000'000;
};

class StoreServer {
 public:
  // Serves `store` (which outlives the server) for `engine`'s clients;
  // unavailable when the address cannot be bound.
  [[nodiscard]] static Result<std::unique_ptr<StoreServer>> start(BlockStore& store, engine::Engine& engine,
                                                                  ServerConfig config = {});
  ~StoreServer();  // stops serving, then the collector
  [[nodiscard]] std::string address() const;  // "127.0.0.1:45123"

 private:
  struct State;
  explicit StoreServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

struct NamespaceInfo {
  std::string name;
  BlockLayout layout;
};

// What fetch() brought: the found prefix, rebuilt on this host (one slab
// per NUMA node the store used, registered with the engine that read it);
// view(block, slot, segment) is where each piece landed.
struct FetchedBlocks {
  std::uint32_t found = 0;
  std::optional<plan::RebuiltPlan> blocks;  // empty when none was found
  std::uint64_t bytes = 0;
  std::size_t plan_wire_bytes = 0;  // the answer's plan
};

// Where [address, address + length) of a peer's address space lies: the
// region that holds all of it and the offset in it (what a plan's chunks
// and ops name, turned into a Request's remote side). not_found when no
// region the peer exported to us holds it whole.
struct RemoteRange {
  engine::RegionHandle region = 0;
  std::uint64_t offset = 0;
};
[[nodiscard]] Result<RemoteRange> locate(std::span<const transport::RemoteRegion> regions, std::uint64_t address,
                                         std::uint64_t length);

struct FetchOptions {
  plan::MaterializeOptions materialize;  // op split and NIC striping
  // The reads' (Request::timeout_ns) and the wait's, and it cuts short the
  // RPCs fetch() makes to at least 1 s (the client's call timeout otherwise;
  // not the engine's handshake with the store, bounded by its own 5 s).
  TimeNs timeout_ns = 60'000'000'000;
  // Relative to the call; the reads' Request::deadline_ns (admission and
  // the scheduler act on it). 0: none.
  TimeNs deadline_ns = 0;
  sched::QosClass qos = sched::QosClass::kDecodeCritical;
};

// One store, by its RPC address. Calls carry the server's Status (code and
// message) back; a server that cannot be reached is unavailable.
class StoreClient {
 public:
  // invalid_argument for an empty address; the channel connects lazily.
  [[nodiscard]] static Result<std::unique_ptr<StoreClient>> connect(const std::string& address,
                                                                    TimeNs call_timeout_ns = 10'000'000'000);
  ~StoreClient();

  // The store engine's address and its namespaces.
  [[nodiscard]] Result<std::pair<std::string, std::vector<NamespaceInfo>>> hello();
  [[nodiscard]] Result<std::vector<BlockPage>> allocate_blocks(const std::string& ns, std::uint32_t count,
                                                               const std::string& producer);
  [[nodiscard]] Status seal(const std::string& ns, const std::string& producer, std::span<const std::uint64_t> pages,
                            std::span<const std::uint64_t> hashes, const BlockLayout& layout);
  [[nodiscard]] Result<QueryAnswer> query(const std::string& ns, std::span<const std::uint64_t> hashes,
                                          const std::string& requester);
  [[nodiscard]] Status release(std::uint64_t session);
  [[nodiscard]] Result<StoreStats> stats();

  // The producer path in one call: allocate pages for the blocks, write
  // them with `engine` from `local` (block i at local_offset + i × the
  // layout's block bytes), then seal them under `hashes`. The store's engine
  // is connected on first use. invalid_argument for no hashes or a bad
  // layout; the allocation's, the writes' and the seal's errors otherwise
  // (pages left unsealed are the store's to reclaim, as for any producer
  // that goes away).
  [[nodiscard]] Status put(engine::Engine& engine, const std::string& ns, const std::string& producer,
                           std::span<const std::uint64_t> hashes, const BlockLayout& layout,
                           engine::RegionHandle local, std::uint64_t local_offset = 0,
                           TimeNs timeout_ns = 60'000'000'000);
  // The same, block i read from local_offsets[i] of `local` (one per hash):
  // blocks that lie apart, as a router's share of a caller's list does.
  [[nodiscard]] Status put(engine::Engine& engine, const std::string& ns, const std::string& producer,
                           std::span<const std::uint64_t> hashes, const BlockLayout& layout,
                           engine::RegionHandle local, std::span<const std::uint64_t> local_offsets,
                           TimeNs timeout_ns = 60'000'000'000);

  // The requester path in one call: query the hashes, materialize the plan
  // (ops split and striped over this host's NICs), read them with `engine`
  // from the store's regions into slabs on the store's NUMA nodes, and
  // release the lock — on every path, errors included. The store's engine
  // is connected on first use. The slabs stay registered with `engine` for
  // the next fetch until this client is destroyed (or, for slabs a caller
  // still holds then, until they are released): `engine` must outlive both.
  // Errors: the query's, the plan's, the reads'.
  [[nodiscard]] Result<FetchedBlocks> fetch(engine::Engine& engine, const std::string& ns,
                                            std::span<const std::uint64_t> hashes, const std::string& requester,
                                            const FetchOptions& options = {});

 private:
  struct State;
  explicit StoreClient(std::unique_ptr<State> state);
  // The store's engine, connected with `engine` (hello() first, once).
  [[nodiscard]] Result<engine::Peer> store_peer(engine::Engine& engine);
  [[nodiscard]] Status put_blocks(engine::Engine& engine, const std::string& ns, const std::string& producer,
                                  std::span<const std::uint64_t> hashes, const BlockLayout& layout,
                                  engine::RegionHandle local, const std::function<std::uint64_t(std::size_t)>& offset_of,
                                  TimeNs timeout_ns);
  std::unique_ptr<State> state_;
};

}  // namespace baton::store
