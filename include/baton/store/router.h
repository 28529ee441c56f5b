// Routing over the directory of stores: each block hash goes to the live
// store place() picks (rendezvous hashing), with one StoreClient per store.
// Membership is what the last refresh() read: a store that died drops out
// once its lease expired and the router refreshed (after a failed call, or
// on a timer), and only its blocks move.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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
};

class StoreRouter {
 public:
  // Reads the membership once; the directory outlives the router.
  [[nodiscard]] static Result<std::unique_ptr<StoreRouter>> create(Directory& directory);

  // Re-reads the live stores; clients of stores that left are dropped.
  [[nodiscard]] Status refresh();
  [[nodiscard]] const std::vector<StoreRecord>& stores() const { return stores_; }
  // The hashes split by store. unavailable when no store is live;
  // invalid_argument for no hashes.
  [[nodiscard]] Result<std::vector<Route>> route(std::span<const std::uint64_t> hashes) const;
  // The client of a live store (made on first use). not_found for a name
  // not in the membership.
  [[nodiscard]] Result<StoreClient*> client(const std::string& store);

 private:
  explicit StoreRouter(Directory& directory) : directory_(directory) {}
  Directory& directory_;
  std::vector<StoreRecord> stores_;
  std::map<std::string, std::unique_ptr<StoreClient>> clients_;
};

}  // namespace baton::store
