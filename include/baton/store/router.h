// Routing over the directory of stores: each block hash goes to the live
// store place() picks (rendezvous hashing), with one StoreClient per store.
// Membership is what the last refresh() read, or, once follow() was called,
// what etcd last pushed: a store that died drops out once its lease expired,
// and only its blocks move. Thread-safe: the watch updates it in the back.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "baton/common/status.h"
#include "baton/store/directory.h"
#include "baton/store/service.h"

namespace baton::store {

struct Route {
  StoreRecord store;
  std::vector<std::uint64_t> hashes;  // in the order asked
  std::vector<std::uint32_t> positions;  // hashes[i] is the asked list's positions[i]
};

// What StoreRouter::fetch brought: every store's share of the hashes, and
// the prefix of the list asked that they held between them.
struct RoutedBlocks {
  struct Share {
    StoreRecord store;
    std::vector<std::uint32_t> positions;  // of the asked list, in order
    Status status;                         // its fetch's; a failed one found nothing
    FetchedBlocks blocks;                  // its own found prefix
  };
  // Blocks [0, found) of the list asked: each held by its store, within the
  // prefix that store found. A block its store lacks (or a store whose
  // fetch failed) ends it, as one store's fetch ends at its first miss.
  std::uint32_t found = 0;
  std::vector<Share> shares;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> where;  // block → (share, its index there), for [0, found)

  // Where (slot, segment) of block `block` (< found) landed.
  [[nodiscard]] std::byte* view(std::uint32_t block, std::uint32_t slot, std::uint32_t segment) const {
    const auto [share, index] = where[block];
    return shares[share].blocks.blocks->view(index, slot, segment);
  }
};

class StoreRouter {
 public:
  // Reads the membership once; the directory outlives the router.
  [[nodiscard]] static Result<std::unique_ptr<StoreRouter>> create(Directory& directory);
  ~StoreRouter();  // stops following

  // Re-reads the live stores; clients of stores that left are dropped.
  [[nodiscard]] Status refresh();
  // Follows the membership etcd pushes (Directory::watch): no refresh()
  // needed. invalid_argument when the directory is watched already.
  [[nodiscard]] Status follow();
  [[nodiscard]] std::vector<StoreRecord> stores() const;
  // The hashes split by store. unavailable when no store is live;
  // invalid_argument for no hashes.
  [[nodiscard]] Result<std::vector<Route>> route(std::span<const std::uint64_t> hashes) const;
  // The client of a live store (made on first use; a caller's copy stays
  // usable after the store left). not_found for a name not in the membership.
  [[nodiscard]] Result<std::shared_ptr<StoreClient>> client(const std::string& store);

  // StoreClient::put over the stores: each store's share of the blocks
  // (block i at local_offset + i × the layout's block bytes), the stores in
  // parallel. ok once every share is sealed; else the first failure, named
  // by its store (the other shares' blocks are sealed or not, each whole).
  [[nodiscard]] Status put(engine::Engine& engine, const std::string& ns, const std::string& producer,
                           std::span<const std::uint64_t> hashes, const BlockLayout& layout,
                           engine::RegionHandle local, std::uint64_t local_offset = 0,
                           TimeNs timeout_ns = 60'000'000'000);
  // StoreClient::fetch over the stores, in parallel: each share's found
  // prefix, and the prefix of `hashes` they held between them. A store
  // that fails (gone, stalled) is said in its share's status and ends the
  // prefix at its first block. invalid_argument for no hashes; unavailable
  // when no store is live. As for StoreClient::fetch, `engine` must outlive
  // the router: its clients keep their slabs registered with it.
  [[nodiscard]] Result<RoutedBlocks> fetch(engine::Engine& engine, const std::string& ns,
                                           std::span<const std::uint64_t> hashes, const std::string& requester,
                                           const FetchOptions& options = {});

 private:
  explicit StoreRouter(Directory& directory) : directory_(directory) {}
  void set(std::vector<StoreRecord> live);
  Directory& directory_;
  bool following_ = false;
  mutable std::mutex mutex_;
  std::vector<StoreRecord> stores_;
  struct Connected {
    std::string address;  // the RPC address the client was made for
    std::shared_ptr<StoreClient> client;
  };
  std::map<std::string, Connected> clients_;
};

}  // namespace baton::store
