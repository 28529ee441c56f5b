#include "baton/store/router.h"

#include <algorithm>
#include <future>
#include <limits>

#include <fmt/format.h>

namespace baton::store {

Result<std::unique_ptr<StoreRouter>> StoreRouter::create(Directory& directory) {
  std::unique_ptr<StoreRouter> router(new StoreRouter(directory));
  if (auto s = router->refresh(); !s.is_ok()) return std::unexpected(s);
  return router;
}

StoreRouter::~StoreRouter() {
  if (following_) directory_.unwatch();
}

void StoreRouter::set(std::vector<StoreRecord> live) {
  std::lock_guard lock(mutex_);
  stores_ = std::move(live);
  // A store that left, or came back under its name at another address (a
  // restart): the old client called the dead address for good.
  std::erase_if(clients_, [&](const auto& kv) {
    return std::ranges::none_of(stores_, [&](const StoreRecord& r) {
      return r.name == kv.first && r.address == kv.second.address;
    });
  });
}

Status StoreRouter::refresh() {
  auto live = directory_.stores();
  if (!live) return live.error();
  set(std::move(*live));
  return Status::ok();
}

Status StoreRouter::follow() {
  if (Status s = directory_.watch([this](std::vector<StoreRecord> live) { set(std::move(live)); }); !s.is_ok()) {
    return s;
  }
  following_ = true;
  return Status::ok();
}

std::vector<StoreRecord> StoreRouter::stores() const {
  std::lock_guard lock(mutex_);
  return stores_;
}

Result<std::vector<Route>> StoreRouter::route(std::span<const std::uint64_t> hashes) const {
  if (hashes.empty()) return std::unexpected(Status::invalid_argument("route: no hashes"));
  std::lock_guard lock(mutex_);
  if (stores_.empty()) return std::unexpected(Status::unavailable("route: no live store in the directory"));
  if (hashes.size() > std::numeric_limits<std::uint32_t>::max()) {
    return std::unexpected(Status::invalid_argument("route: {} hashes", hashes.size()));
  }
  std::vector<Route> routes(stores_.size());
  for (std::size_t i = 0; i < stores_.size(); ++i) routes[i].store = stores_[i];
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    Route& r = routes[*place(hashes[i], stores_)];
    r.hashes.push_back(hashes[i]);
    r.positions.push_back(static_cast<std::uint32_t>(i));
  }
  std::erase_if(routes, [](const Route& r) { return r.hashes.empty(); });
  return routes;
}

Result<std::shared_ptr<StoreClient>> StoreRouter::client(const std::string& store) {
  std::lock_guard lock(mutex_);
  auto it = std::ranges::find(stores_, store, &StoreRecord::name);
  if (it == stores_.end()) return std::unexpected(Status::not_found("router: no live store \"{}\"", store));
  Connected& c = clients_[store];
  if (!c.client || c.address != it->address) {
    auto made = StoreClient::connect(it->address);
    if (!made) return std::unexpected(made.error());
    c = {it->address, std::move(*made)};
  }
  return c.client;
}

Status StoreRouter::put(engine::Engine& engine, const std::string& ns, const std::string& producer,
                        std::span<const std::uint64_t> hashes, const BlockLayout& layout, engine::RegionHandle local,
                        std::uint64_t local_offset, TimeNs timeout_ns) {
  auto routes = route(hashes);
  if (!routes) return routes.error();
  const std::uint64_t block_bytes = layout.block_bytes();
  std::vector<std::future<Status>> puts;
  for (const Route& r : *routes) {
    auto c = client(r.store.name);
    if (!c) return c.error();
    std::vector<std::uint64_t> offsets;
    for (std::uint32_t at : r.positions) offsets.push_back(local_offset + at * block_bytes);
    puts.push_back(std::async(std::launch::async, [&, c = *c, r, offsets = std::move(offsets)] {
      const Status s = c->put(engine, ns, producer, r.hashes, layout, local, offsets, timeout_ns);
      return s.is_ok() ? s : Status(s.code(), fmt::format("store {}: {}", r.store.name, s.message()));
    }));
  }
  Status first;
  for (auto& p : puts) {
    if (Status s = p.get(); !s.is_ok() && first.is_ok()) first = std::move(s);
  }
  return first;
}

Result<RoutedBlocks> StoreRouter::fetch(engine::Engine& engine, const std::string& ns,
                                        std::span<const std::uint64_t> hashes, const std::string& requester,
                                        const FetchOptions& options) {
  auto routes = route(hashes);
  if (!routes) return std::unexpected(routes.error());
  RoutedBlocks out;
  std::vector<std::future<Result<FetchedBlocks>>> fetches;
  for (const Route& r : *routes) {
    out.shares.push_back({r.store, r.positions, Status::ok(), {}});
    auto c = client(r.store.name);
    fetches.push_back(std::async(std::launch::async, [&, c, r]() -> Result<FetchedBlocks> {
      if (!c) return std::unexpected(c.error());
      return (*c)->fetch(engine, ns, r.hashes, requester, options);
    }));
  }
  // The prefix ends at the first block its store did not bring.
  std::uint64_t found = hashes.size();
  for (std::size_t i = 0; i < fetches.size(); ++i) {
    RoutedBlocks::Share& share = out.shares[i];
    auto got = fetches[i].get();
    if (got) {
      share.blocks = std::move(*got);
    } else {
      share.status = Status(got.error().code(), fmt::format("store {}: {}", share.store.name, got.error().message()));
    }
    if (share.blocks.found < share.positions.size()) {
      found = std::min<std::uint64_t>(found, share.positions[share.blocks.found]);
    }
  }
  out.found = static_cast<std::uint32_t>(found);
  out.where.resize(out.found);
  for (std::uint32_t s = 0; s < out.shares.size(); ++s) {
    const auto& positions = out.shares[s].positions;
    for (std::uint32_t k = 0; k < positions.size() && positions[k] < out.found; ++k) out.where[positions[k]] = {s, k};
  }
  return out;
}

}  // namespace baton::store
