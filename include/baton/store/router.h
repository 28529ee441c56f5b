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
