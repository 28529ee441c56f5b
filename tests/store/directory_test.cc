// The directory of stores over a real etcd on loopback (started here, on
// ports of its own, in a temporary data directory): registration under a
// lease, a store that dies leaving at expiry, rendezvous placement that
// moves only a dead store's blocks, and bad input.
#include "baton/store/directory.h"
#include "baton/store/router.h"
#include "baton/store/service.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "baton/engine/pattern.h"
#include "common/free_port.h"

namespace baton::store {
namespace {

constexpr TimeNs kSecond = 1'000'000'000;

using testing::free_port;

// One etcd for the suite; gone (process and data) when the suite ends.
class Etcd : public ::testing::Environment {
 public:
  static inline std::string endpoint;

  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists("/usr/bin/etcd")) << "etcd is not installed (scripts/setup installs etcd-server)";
    char dir[] = "/tmp/baton-etcd-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    const int client = free_port(), peer = free_port();
    endpoint = "127.0.0.1:" + std::to_string(client);
    const pid_t suite = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      // A suite that crashes takes its etcd with it.
      if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != suite) ::_exit(127);
      const std::string c = "http://" + endpoint, p = "http://127.0.0.1:" + std::to_string(peer);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::execl("/usr/bin/etcd", "etcd", "--data-dir", dir, "--listen-client-urls", c.c_str(),
              "--advertise-client-urls", c.c_str(), "--listen-peer-urls", p.c_str(), "--initial-advertise-peer-urls",
              p.c_str(), "--initial-cluster", ("default=" + p).c_str(), nullptr);
      ::_exit(127);
    }
    // Ready once it answers a range.
    auto d = Directory::connect(endpoint, "/ready/");
    ASSERT_TRUE(d.has_value());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!(*d)->stores().has_value()) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "etcd did not answer within 20 s";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

 private:
  pid_t pid_ = -1;
  std::string dir_;
};

const auto* const kEtcd = ::testing::AddGlobalTestEnvironment(new Etcd);

std::string base64_of(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  out.resize(static_cast<std::size_t>(EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                                      reinterpret_cast<const unsigned char*>(in.data()),
                                                      static_cast<int>(in.size()))));
  return out;
}

StoreRecord record(const std::string& name) {
  return {name, "127.0.0.1:5000" + name.substr(name.size() - 1), "127.0.0.1:6000", 1 << 30, {0}};
}

TEST(Directory, StoresRegisterUnderALeaseAndADeadOneLeavesAtExpiry) {
  auto a = Directory::connect(Etcd::endpoint, "/t1/");
  auto b = Directory::connect(Etcd::endpoint, "/t1/");
  auto reader = Directory::connect(Etcd::endpoint, "/t1/");
  ASSERT_TRUE(a && b && reader);
  ASSERT_TRUE((*a)->register_store(record("store-a"), 2 * kSecond).is_ok());
  ASSERT_TRUE((*b)->register_store(record("store-b"), 2 * kSecond).is_ok());
  auto both = (*reader)->stores();
  ASSERT_TRUE(both.has_value()) << both.error().to_string();
  ASSERT_EQ(both->size(), 2u);
  EXPECT_EQ((*both)[0], record("store-a"));
  EXPECT_EQ((*both)[1], record("store-b"));

  // a keeps its lease alive past several TTLs; b dies (stops beating).
  (*b)->abandon();
  std::vector<StoreRecord> live;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    live = *(*reader)->stores();
  } while (live.size() != 1 && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(live.size(), 1u) << "b's lease expired";
  EXPECT_EQ(live[0].name, "store-a");
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ((*reader)->stores()->size(), 1u) << "a is still kept alive past its TTL";

  ASSERT_TRUE((*a)->deregister().is_ok());
  EXPECT_TRUE((*reader)->stores()->empty()) << "a revoked lease leaves at once";
}

// etcd's gateway, as a test's hand on it: the JSON answer of one call.
nlohmann::json etcd_call(const std::string& path, const nlohmann::json& body) {
  httplib::Client client("http://" + Etcd::endpoint);
  auto res = client.Post(path, body.dump(), "application/json");
  if (!res || res->status != 200) return nlohmann::json();
  return nlohmann::json::parse(res->body, nullptr, false);
}

// The lease etcd holds `key` under ("" when the key is absent).
std::string lease_of(const std::string& key) {
  const nlohmann::json range = etcd_call("/v3/kv/range", {{"key", base64_of(key)}});
  const nlohmann::json kvs = range.value("kvs", nlohmann::json::array());
  return kvs.empty() ? std::string() : kvs[0].value("lease", std::string());
}

TEST(Directory, AStoreWhoseLeaseExpiredWhileItStoodStillIsPutBackUnderANewLease) {
  // etcd, the network or the store paused past the TTL: the lease expired
  // and took the record, while the store lives on. Revoking the lease by
  // hand is that expiry, on time. The store's next beat finds it gone.
  auto store = Directory::connect(Etcd::endpoint, "/t-expired/");
  auto reader = Directory::connect(Etcd::endpoint, "/t-expired/");
  ASSERT_TRUE(store && reader);
  ASSERT_TRUE((*store)->register_store(record("store-a"), 3 * kSecond).is_ok());
  const std::string first = lease_of("/t-expired/store-a");
  ASSERT_FALSE(first.empty());
  ASSERT_TRUE(etcd_call("/v3/lease/revoke", {{"ID", first}}).is_object());
  ASSERT_TRUE((*reader)->stores()->empty()) << "the record went with its lease";

  std::vector<StoreRecord> live;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    live = *(*reader)->stores();
  } while (live.empty() && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(live.size(), 1u) << "the store put its record back at its next beat (every second here)";
  EXPECT_EQ(live[0], record("store-a"));
  const std::string second = lease_of("/t-expired/store-a");
  EXPECT_FALSE(second.empty());
  EXPECT_NE(second, first);

  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_EQ((*reader)->stores()->size(), 1u) << "the new lease is kept alive past its TTL";
  EXPECT_EQ(lease_of("/t-expired/store-a"), second) << "one new lease, not one a beat";
  ASSERT_TRUE((*store)->deregister().is_ok());
  EXPECT_TRUE((*reader)->stores()->empty()) << "deregister revokes the new lease";
}

// A name held by another live store is refused once the registering one
// waited a lease for it: a second store started under a live one's name
// overwrote its record, and the first, renewing a lease that held no key,
// was out of the directory for good. A store restarted on the same
// addresses takes its own record over at once; a dead one's is waited for.
TEST(Directory, ANameHeldByAnotherLiveStoreIsRefusedAndItsRecordStays) {
  auto first = Directory::connect(Etcd::endpoint, "/t6/");
  auto second = Directory::connect(Etcd::endpoint, "/t6/");
  auto reader = Directory::connect(Etcd::endpoint, "/t6/");
  ASSERT_TRUE(first && second && reader);
  ASSERT_TRUE((*first)->register_store(record("store-a"), 2 * kSecond).is_ok());
  auto impostor = record("store-a");
  impostor.address = "127.0.0.1:49998";
  const auto asked = std::chrono::steady_clock::now();
  const Status refused = (*second)->register_store(impostor, kSecond);
  EXPECT_EQ(refused.code(), StatusCode::kAlreadyExists) << refused.to_string();
  EXPECT_NE(refused.message().find("127.0.0.1:5000a"), std::string::npos) << refused.message();
  EXPECT_GE(std::chrono::steady_clock::now() - asked, std::chrono::seconds(2)) << "it waited its lease and a second";
  auto listed = (*reader)->stores();
  ASSERT_TRUE(listed.has_value());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0], record("store-a")) << "the live store's record stays";

  // Its own record, from before a restart on the same addresses: taken over.
  (*first)->abandon();
  auto restarted = Directory::connect(Etcd::endpoint, "/t6/");
  ASSERT_TRUE(restarted.has_value());
  const auto again = std::chrono::steady_clock::now();
  ASSERT_TRUE((*restarted)->register_store(record("store-a"), 2 * kSecond).is_ok());
  // At once: not after the wait for another's record (its 2 s lease and a second).
  EXPECT_LT(std::chrono::steady_clock::now() - again, std::chrono::seconds(3));
  // A dead store's other record is waited for: the impostor gets the name
  // once the restarted one stopped renewing and its lease ran out.
  (*restarted)->abandon();
  auto late = Directory::connect(Etcd::endpoint, "/t6/");
  ASSERT_TRUE(late.has_value());
  ASSERT_TRUE((*late)->register_store(impostor, 3 * kSecond).is_ok());
  listed = (*reader)->stores();
  ASSERT_TRUE(listed.has_value());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].address, "127.0.0.1:49998");
  ASSERT_TRUE((*late)->deregister().is_ok());
}

// A prefix is a folder: "/t8" lists what is under "/t8/", not "/t8x/".
TEST(Directory, APrefixWithoutItsSlashListsOnlyItsOwnRecords) {
  auto mine = Directory::connect(Etcd::endpoint, "/t8");
  auto sibling = Directory::connect(Etcd::endpoint, "/t8x/");
  ASSERT_TRUE(mine && sibling);
  ASSERT_TRUE((*mine)->register_store(record("store-a"), 2 * kSecond).is_ok());
  ASSERT_TRUE((*sibling)->register_store(record("store-b"), 2 * kSecond).is_ok());
  auto listed = (*mine)->stores();
  ASSERT_TRUE(listed.has_value()) << listed.error().to_string();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "store-a");
  ASSERT_TRUE((*mine)->deregister().is_ok());
  ASSERT_TRUE((*sibling)->deregister().is_ok());
}

TEST(Directory, RendezvousPlacementMovesOnlyTheBlocksOfAStoreThatLeft) {
  const std::vector<StoreRecord> three{record("store-a"), record("store-b"), record("store-c")};
  const std::vector<StoreRecord> two{record("store-a"), record("store-c")};
  std::vector<int> count(3, 0);
  int moved = 0;
  for (std::uint64_t h = 0; h < 3000; ++h) {
    const std::size_t before = *place(h, three);
    ++count[before];
    const std::string after = two[*place(h, two)].name;
    if (three[before].name != "store-b") {
      EXPECT_EQ(after, three[before].name) << "block " << h << " moved although its store stayed";
    } else {
      ++moved;
    }
  }
  for (int c : count) EXPECT_GT(c, 800) << "blocks spread over the stores";
  EXPECT_EQ(moved, count[1]);
  EXPECT_FALSE(place(1, {}).has_value());
}

// A router follows the membership: hashes split over the live stores, and
// after a store dies (lease expired) and a refresh only its hashes move.
TEST(StoreRouter, RoutesOverTheLiveStoresAndDropsADeadOne) {
  auto a = Directory::connect(Etcd::endpoint, "/t4/");
  auto b = Directory::connect(Etcd::endpoint, "/t4/");
  auto reader = Directory::connect(Etcd::endpoint, "/t4/");
  ASSERT_TRUE(a && b && reader);
  auto empty = StoreRouter::create(**reader);
  ASSERT_TRUE(empty.has_value()) << empty.error().to_string();
  const std::vector<std::uint64_t> hashes = [] {
    std::vector<std::uint64_t> h;
    for (std::uint64_t i = 0; i < 600; ++i) h.push_back(i * 7919);
    return h;
  }();
  EXPECT_EQ((*empty)->route(hashes).error().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*empty)->route({}).error().code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE((*a)->register_store(record("store-a"), 2 * kSecond).is_ok());
  ASSERT_TRUE((*b)->register_store(record("store-b"), 2 * kSecond).is_ok());
  StoreRouter& router = **empty;
  ASSERT_TRUE(router.refresh().is_ok());
  auto both = router.route(hashes);
  ASSERT_TRUE(both.has_value());
  ASSERT_EQ(both->size(), 2u);
  EXPECT_EQ((*both)[0].hashes.size() + (*both)[1].hashes.size(), hashes.size());
  EXPECT_GT((*both)[0].hashes.size(), 200u) << "spread over both";
  auto client = router.client("store-b");
  ASSERT_TRUE(client.has_value()) << client.error().to_string();
  EXPECT_EQ(router.client("store-z").error().code(), StatusCode::kNotFound);

  (*b)->abandon();  // b dies
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    ASSERT_TRUE(router.refresh().is_ok());
  } while (router.stores().size() != 1 && std::chrono::steady_clock::now() < deadline);
  ASSERT_EQ(router.stores().size(), 1u);
  auto one = router.route(hashes);
  ASSERT_TRUE(one.has_value());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].store.name, "store-a");
  EXPECT_EQ((*one)[0].hashes, hashes) << "every hash now goes to a, in the order asked";
  EXPECT_EQ(router.client("store-b").error().code(), StatusCode::kNotFound) << "b's client was dropped";

  // a comes back under its name at another address (a restart): the router
  // hands out a client of the new address, where it kept calling the old.
  auto old_client = router.client("store-a");
  ASSERT_TRUE(old_client.has_value());
  ASSERT_TRUE((*a)->deregister().is_ok());
  auto moved = record("store-a");
  moved.address = "127.0.0.1:49999";
  ASSERT_TRUE((*a)->register_store(moved, 2 * kSecond).is_ok());
  ASSERT_TRUE(router.refresh().is_ok());
  auto new_client = router.client("store-a");
  ASSERT_TRUE(new_client.has_value());
  EXPECT_NE(new_client->get(), old_client->get());
  ASSERT_TRUE((*a)->deregister().is_ok());
}

// A store in this process, in the directory under `name`.
struct LiveStore {
  static constexpr BlockLayout kLayout{.slots = 4, .segments = 2, .segment_bytes = 2048};
  std::unique_ptr<engine::Engine> engine = std::move(*engine::Engine::create({}));
  std::unique_ptr<BlockStore> store = std::move(*BlockStore::create(*engine));
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<Directory> directory = std::move(*Directory::connect(Etcd::endpoint, "/t7/"));

  explicit LiveStore(const std::string& name) {
    EXPECT_TRUE(store->add_namespace({"llama", kLayout, 256, {0}}).is_ok());
    server = std::move(*StoreServer::start(*store, *engine));
    EXPECT_TRUE(directory->register_store({name, server->address(), engine->address(), 1 << 20, {0}}, 2 * kSecond)
                    .is_ok());
  }
};

// One put and one fetch over every live store: each store's share in
// parallel, block i of the caller's list at block i of its buffer, the
// found prefix across the stores; a store that fails ends the prefix at
// its first block and says why in its share.
TEST(StoreRouter, PutsAndFetchesAListAcrossTheStoresByteExact) {
  constexpr BlockLayout kLayout = LiveStore::kLayout;
  std::vector<std::unique_ptr<LiveStore>> stores;
  for (const char* name : {"s1", "s2", "s3"}) stores.push_back(std::make_unique<LiveStore>(name));
  auto reader = Directory::connect(Etcd::endpoint, "/t7/");
  ASSERT_TRUE(reader.has_value());
  auto router = StoreRouter::create(**reader);
  ASSERT_TRUE(router.has_value()) << router.error().to_string();
  ASSERT_EQ((*router)->stores().size(), 3u);

  auto mine = engine::Engine::create({});
  ASSERT_TRUE(mine.has_value());
  constexpr std::uint32_t kBlocks = 240;
  std::vector<std::byte> kv(kBlocks * kLayout.block_bytes());
  std::vector<std::uint64_t> hashes;
  for (std::uint32_t b = 0; b < kBlocks; ++b) {
    hashes.push_back(0x5eed0000 + b * 7919);
    engine::fill_pattern(std::span(kv).subspan(b * kLayout.block_bytes(), kLayout.block_bytes()), 900 + b);
  }
  auto local = (*mine)->register_memory(kv.data(), kv.size());
  ASSERT_TRUE(local.has_value());
  auto routes = (*router)->route(hashes);
  ASSERT_TRUE(routes.has_value());
  ASSERT_EQ(routes->size(), 3u) << "spread over every store";
  for (const Route& r : *routes) {
    for (std::size_t i = 0; i < r.hashes.size(); ++i) EXPECT_EQ(hashes[r.positions[i]], r.hashes[i]);
  }
  const Status put = (*router)->put(**mine, "llama", "p", hashes, kLayout, local->handle);
  ASSERT_TRUE(put.is_ok()) << put.to_string();

  auto check = [&](const RoutedBlocks& got, std::uint32_t count) {
    for (std::uint32_t b = 0; b < count; ++b) {
      for (std::uint32_t s = 0; s < kLayout.slots; ++s) {
        for (std::uint32_t g = 0; g < kLayout.segments; ++g) {
          const std::uint64_t at = (std::uint64_t{s} * kLayout.segments + g) * kLayout.segment_bytes;
          const std::span<const std::byte> view(got.view(b, s, g), kLayout.segment_bytes);
          ASSERT_FALSE(engine::pattern_mismatch(view, 900 + b, at).has_value()) << b << " " << s << " " << g;
        }
      }
    }
  };
  auto requester = engine::Engine::create({});
  ASSERT_TRUE(requester.has_value());
  {
    auto got = (*router)->fetch(**requester, "llama", hashes, "d");
    ASSERT_TRUE(got.has_value()) << got.error().to_string();
    EXPECT_EQ(got->found, kBlocks);
    for (const auto& share : got->shares) EXPECT_TRUE(share.status.is_ok()) << share.status.to_string();
    check(*got, kBlocks);
  }
  // A list with a block no store holds ends the prefix there.
  std::vector<std::uint64_t> gap = hashes;
  gap[100] = 0xdead;
  {
    auto got = (*router)->fetch(**requester, "llama", gap, "d");
    ASSERT_TRUE(got.has_value()) << got.error().to_string();
    EXPECT_EQ(got->found, 100u);
    check(*got, 100);
  }
  // A store gone (its server down, still listed): its share fails, the
  // prefix ends at its first block, the others' shares are whole.
  const std::string gone = (*routes)[1].store.name;
  const std::uint32_t first_gone = (*routes)[1].positions.front();
  for (auto& s : stores) {
    if (s->server->address() == (*routes)[1].store.address) s->server.reset();
  }
  {
    auto got = (*router)->fetch(**requester, "llama", hashes, "d");
    ASSERT_TRUE(got.has_value()) << got.error().to_string();
    EXPECT_EQ(got->found, first_gone);
    check(*got, first_gone);
    for (const auto& share : got->shares) {
      if (share.store.name == gone) {
        EXPECT_EQ(share.status.code(), StatusCode::kUnavailable) << share.status.to_string();
        EXPECT_NE(share.status.message().find(gone), std::string::npos) << share.status.message();
      } else {
        EXPECT_TRUE(share.status.is_ok()) << share.status.to_string();
        EXPECT_EQ(share.blocks.found, share.positions.size());
      }
    }
  }
  const Status refused = (*router)->put(**mine, "llama", "p", hashes, kLayout, local->handle);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.to_string();
  EXPECT_NE(refused.message().find("store " + gone), std::string::npos) << refused.message();
  EXPECT_EQ((*router)->fetch(**requester, "llama", {}, "d").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*router)->put(**mine, "llama", "p", {}, kLayout, local->handle).code(), StatusCode::kInvalidArgument);
  router->reset();  // its clients' slabs are registered with `requester`, which goes after
  for (auto& s : stores) ASSERT_TRUE(s->directory->deregister().is_ok());
}

// Membership pushed by etcd: the router follows stores that come and go
// without a refresh(), within a lease TTL.
TEST(StoreRouter, FollowsTheMembershipEtcdPushes) {
  auto a = Directory::connect(Etcd::endpoint, "/t5/");
  auto b = Directory::connect(Etcd::endpoint, "/t5/");
  auto reader = Directory::connect(Etcd::endpoint, "/t5/");
  ASSERT_TRUE(a && b && reader);
  auto router = StoreRouter::create(**reader);
  ASSERT_TRUE(router.has_value()) << router.error().to_string();
  ASSERT_TRUE((*router)->follow().is_ok());
  EXPECT_EQ((*router)->follow().code(), StatusCode::kInvalidArgument) << "one watch per directory";
  auto wait_for = [&](std::size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((*router)->stores().size() != n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return (*router)->stores().size();
  };
  ASSERT_TRUE((*a)->register_store(record("store-a"), 2 * kSecond).is_ok());
  ASSERT_EQ(wait_for(1), 1u);
  ASSERT_TRUE((*b)->register_store(record("store-b"), 2 * kSecond).is_ok());
  ASSERT_EQ(wait_for(2), 2u);
  auto client_b = (*router)->client("store-b");
  ASSERT_TRUE(client_b.has_value());
  (*b)->abandon();  // b dies: it leaves when its lease expires
  ASSERT_EQ(wait_for(1), 1u);
  EXPECT_EQ((*router)->stores()[0].name, "store-a");
  EXPECT_EQ((*router)->client("store-b").error().code(), StatusCode::kNotFound);
  EXPECT_NE(*client_b, nullptr) << "a caller's client outlives the store's departure";
  ASSERT_TRUE((*a)->deregister().is_ok());
  ASSERT_EQ(wait_for(0), 0u);
  EXPECT_EQ((*router)->route(std::vector<std::uint64_t>{1}).error().code(), StatusCode::kUnavailable);
}

TEST(Directory, AWatchOnAnAbsentEtcdCallsNothingAndStops) {
  auto d = Directory::connect("127.0.0.1:" + std::to_string(free_port()), "/x/");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)->watch(nullptr).code(), StatusCode::kInvalidArgument);
  int calls = 0;
  ASSERT_TRUE((*d)->watch([&](std::vector<StoreRecord>) { ++calls; }).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (*d)->unwatch();  // returns (the suite's timeout would catch a hang)
  EXPECT_EQ(calls, 0) << "no list was ever read, so none was handed over";
  (*d)->unwatch();  // twice is harmless
}

TEST(Directory, BadInputAndAnAbsentEtcdGetAClearStatus) {
  EXPECT_EQ(Directory::connect("", "/x/").error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Directory::connect(Etcd::endpoint, "").error().code(), StatusCode::kInvalidArgument);
  auto d = Directory::connect(Etcd::endpoint, "/t3/");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ((*d)->register_store({"", "a", "", 0, {}}).code(), StatusCode::kInvalidArgument);
  // Bytes a key or JSON cannot carry: "\xff" made the JSON writer throw.
  for (const auto& [name, address] : {std::pair{"\xff", "a"}, std::pair{"s", "\xfe"}, std::pair{"a/b", "a"},
                                      std::pair{"a b", "a"}}) {
    const Status s = (*d)->register_store({name, address, "", 0, {}});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  }
  EXPECT_EQ((*d)->register_store(record("store-a"), kSecond / 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*d)->deregister().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*d)->register_store(record("store-a"), 2 * kSecond).is_ok());
  EXPECT_EQ((*d)->register_store(record("store-a"), 2 * kSecond).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*d)->deregister().is_ok());

  auto nowhere = Directory::connect("127.0.0.1:" + std::to_string(free_port()), "/x/");
  ASSERT_TRUE(nowhere.has_value());
  EXPECT_EQ((*nowhere)->stores().error().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*nowhere)->register_store(record("store-a")).code(), StatusCode::kUnavailable);
}

// A gateway that answers well-formed JSON of other types than etcd's (a
// proxy, another version, a wrong port): a Status, never a terminate.
class FakeGateway {
 public:
  FakeGateway() {
    for (const char* path : {"/v3/kv/range", "/v3/lease/grant", "/v3/kv/put", "/v3/kv/txn", "/v3/lease/revoke",
                             "/v3/watch"}) {
      server_.Post(path, [this, path](const httplib::Request&, httplib::Response& response) {
        std::lock_guard lock(mutex_);
        response.set_content(answers_.contains(path) ? answers_[path] : "{}", "application/json");
      });
    }
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeGateway() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  void answer(const std::string& path, std::string body) {
    std::lock_guard lock(mutex_);
    answers_[path] = std::move(body);
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::map<std::string, std::string> answers_;
};

TEST(Directory, AnswersOfOtherJsonTypesGetAStatusNotATerminate) {
  FakeGateway etcd;
  auto d = Directory::connect(etcd.endpoint(), "/f/");
  ASSERT_TRUE(d.has_value());
  for (const char* body : {"[]", "5", R"({"kvs":"x"})", R"({"kvs":[5]})", R"({"kvs":[{"key":"eA==","value":5}]})",
                           R"({"kvs":[{"key":7,"value":"e30="}]})"}) {
    etcd.answer("/v3/kv/range", body);
    auto stores = (*d)->stores();
    ASSERT_FALSE(stores.has_value()) << body;
    EXPECT_TRUE(stores.error().code() == StatusCode::kInternal || stores.error().code() == StatusCode::kUnavailable)
        << body << ": " << stores.error().to_string();
  }
  etcd.answer("/v3/kv/range", R"({"kvs":[]})");
  EXPECT_TRUE((*d)->stores().has_value());

  etcd.answer("/v3/lease/grant", R"({"ID":[1]})");
  EXPECT_EQ((*d)->register_store(record("store-a"), 2 * kSecond).code(), StatusCode::kUnavailable);
  etcd.answer("/v3/lease/grant", R"({"ID":123456})");  // a number, not the gateway's string: taken
  // A put-if-absent answered with fields of other types: the name reads as
  // held (by nothing known), refused once the wait is over.
  etcd.answer("/v3/kv/txn", R"({"succeeded":"yes","responses":[{"response_range":{"kvs":[{"value":5}]}}]})");
  EXPECT_EQ((*d)->register_store(record("store-a"), kSecond).code(), StatusCode::kAlreadyExists);
  etcd.answer("/v3/kv/txn", R"({"succeeded":true})");
  ASSERT_TRUE((*d)->register_store(record("store-a"), 2 * kSecond).is_ok());
  ASSERT_TRUE((*d)->deregister().is_ok());
  EXPECT_EQ((*d)->register_store(record("store-a"), INT64_MAX).code(), StatusCode::kInvalidArgument)
      << "above etcd's 9e9 s";

  // The watch's lines: of other types they change nothing; the last one
  // says the watch exists, so the list is read and handed over.
  etcd.answer("/v3/watch", "{\"result\":\"x\"}\n{\"result\":{\"created\":\"yes\"}}\n[1]\n"
                           "{\"result\":{\"events\":7}}\n{\"result\":{\"created\":true}}\n");
  std::atomic<int> calls = 0;
  ASSERT_TRUE((*d)->watch([&](std::vector<StoreRecord>) { ++calls; }).is_ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (calls == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (*d)->unwatch();
  EXPECT_GT(calls.load(), 0);
}

// Answers that are no etcd's: 100 000 levels deep (copying it overflowed
// the stack), larger than any answer of etcd's, with raw control bytes to
// echo: each a Status, and the next call works.
TEST(Directory, AnAnswerTooDeepOrTooLargeIsRefusedAndShownEscaped) {
  FakeGateway etcd;
  auto d = Directory::connect(etcd.endpoint(), "/f/");
  ASSERT_TRUE(d.has_value());
  etcd.answer("/v3/lease/grant", R"({"ID":)" + std::string(100'000, '[') + std::string(100'000, ']') + "}");
  const Status deep = (*d)->register_store(record("store-a"), 2 * kSecond);
  EXPECT_EQ(deep.code(), StatusCode::kUnavailable) << deep.to_string();
  etcd.answer("/v3/kv/range", R"({"kvs":[],"pad":")" + std::string(5 << 20, 'x') + "\"}");
  auto large = (*d)->stores();
  ASSERT_FALSE(large.has_value());
  EXPECT_NE(large.error().message().find("an answer above"), std::string::npos) << large.error().to_string();
  etcd.answer("/v3/kv/range", "\x1b[31m\x01 not json");
  auto raw = (*d)->stores();
  ASSERT_FALSE(raw.has_value());
  EXPECT_EQ(raw.error().message().find('\x1b'), std::string::npos) << "a raw escape reaches the terminal";
  etcd.answer("/v3/kv/range", R"({"kvs":[]})");
  EXPECT_TRUE((*d)->stores().has_value());
}

// An endpoint that answers a byte a second: each read is within the read
// timeout, so only the call's own deadline ends it (it held register_store,
// and SIGTERM behind it, for as long as the bytes came).
TEST(Directory, AnEndpointThatDripsIsCutAtTheCallsDeadline) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  std::atomic<bool> stop = false;
  std::thread drip([&] {
    const int c = ::accept(listener, nullptr, nullptr);
    const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + std::string(100000, ' ');
    for (std::size_t i = 0; c >= 0 && i < answer.size() && !stop; ++i) {
      if (::send(c, &answer[i], 1, MSG_NOSIGNAL) != 1) break;
      for (int t = 0; t < 10 && !stop; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (c >= 0) ::close(c);
  });
  auto d = Directory::connect("127.0.0.1:" + std::to_string(ntohs(a.sin_port)), "/f/");
  ASSERT_TRUE(d.has_value());
  const auto start = std::chrono::steady_clock::now();
  const Status s = (*d)->register_store(record("store-a"), 2 * kSecond);
  const auto took = std::chrono::steady_clock::now() - start;
  stop = true;
  ::shutdown(listener, SHUT_RDWR);
  drip.join();
  ::close(listener);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("no whole answer within 10 s"), std::string::npos) << s.to_string();
  EXPECT_LT(took, std::chrono::seconds(20));
}

}  // namespace
}  // namespace baton::store
