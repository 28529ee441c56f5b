// A directory of stores in etcd: each `baton store` registers its record
// (name, RPC and engine addresses, capacity, NUMA nodes) under a lease it
// keeps alive; a store that dies leaves when its lease expires. Clients
// list the live stores and place each block on one of them by rendezvous
// hashing, so a store leaving moves only its own blocks. etcd v3 is spoken
// through its JSON gateway (HTTP), so no etcd client library is needed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "baton/common/clock.h"
#include "baton/common/status.h"

namespace baton::store {

struct StoreRecord {
  std::string name;            // unique among the stores
  std::string address;         // its RPCs
  std::string engine_address;  // its engine
  std::uint64_t capacity_bytes = 0;
  std::vector<int> numa_nodes;
  friend bool operator==(const StoreRecord&, const StoreRecord&) = default;
};

class Directory {
 public:
  // `endpoint` is etcd's client URL host:port ("127.0.0.1:2379"); records
  // live under `prefix` (a '/' is added where it does not end in one, so
  // "/baton/stores" does not list "/baton/storesx/…"). invalid_argument for
  // an empty endpoint or prefix.
  // Nothing is contacted until a call.
  [[nodiscard]] static Result<std::unique_ptr<Directory>> connect(const std::string& endpoint,
                                                                  const std::string& prefix = "/baton/stores/");
  ~Directory();  // stops the keepalive; a registration then expires with its lease

  // Registers `record` under a lease of `ttl_ns` (1 s, etcd's grain, to
  // etcd's most, 9e9 s) and keeps it alive from a thread every third of it.
  // invalid_argument for an empty name or address, a TTL out of that range,
  // or a second registration; unavailable when etcd cannot be reached or
  // answers no JSON object.
  [[nodiscard]] Status register_store(const StoreRecord& record, TimeNs ttl_ns = 10'000'000'000);
  // Revokes the lease: the record leaves at once.
  [[nodiscard]] Status deregister();
  // Stops keeping the lease alive without revoking it, as a store that
  // dies does (for tests and fault drills): the record leaves at expiry.
  void abandon();

  // The live stores, by name. unavailable when etcd cannot be reached;
  // internal for an answer or a record that does not parse (a field of
  // another JSON type included).
  [[nodiscard]] Result<std::vector<StoreRecord>> stores();

  // Pushes membership: calls `on_change` with the live stores once the
  // watch is established and again after every change under the prefix
  // (etcd's watch, streamed through the gateway), from a thread of its own,
  // until unwatch() or the directory goes. A broken stream (etcd restarted,
  // or 5 s without events) is re-established and the list read again, so no
  // change is missed. invalid_argument for an empty callback or a second watch.
  [[nodiscard]] Status watch(std::function<void(std::vector<StoreRecord>)> on_change);
  // Stops the watch; returns once `on_change` can no longer be called.
  void unwatch();

 private:
  struct State;
  explicit Directory(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The store a block lives on: highest random weight (rendezvous) over
// `stores` (a score per (store name, block hash)). nullopt when empty.
[[nodiscard]] std::optional<std::size_t> place(std::uint64_t block_hash, std::span<const StoreRecord> stores);

}  // namespace baton::store
