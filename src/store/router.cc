#include "baton/store/router.h"

#include <algorithm>

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
  std::vector<Route> routes(stores_.size());
  for (std::size_t i = 0; i < stores_.size(); ++i) routes[i].store = stores_[i];
  for (std::uint64_t h : hashes) routes[*place(h, stores_)].hashes.push_back(h);
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

}  // namespace baton::store
