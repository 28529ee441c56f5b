// `baton store` as a process on loopback: it serves its namespaces over
// RPC, its engine takes a producer's writes and a requester's reads, it
// stops cleanly on SIGTERM, and bad flags exit 2 with one line.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "baton/plan/wire.h"
#include "baton/store/service.h"
#include "serve_child.h"
#include "tools/baton_cli.h"

namespace {

using baton::StatusCode;
namespace store = baton::store;
namespace engine = baton::engine;

TEST(StoreCommand, ServesItsNamespacesAndBlocksAcrossProcesses) {
  auto child = baton::cli::ServeChild::start({"--namespace", "llama:4x2x1024:8", "--namespace", "mla:2x1x512:4"},
                                             BATON_BINARY, "", "store");
  ASSERT_TRUE(child.has_value()) << child.error().to_string();
  auto client = store::StoreClient::connect(child->address());
  ASSERT_TRUE(client.has_value());
  auto hello = (*client)->hello();
  ASSERT_TRUE(hello.has_value()) << hello.error().to_string();
  ASSERT_EQ(hello->second.size(), 2u);
  EXPECT_EQ(hello->second[0].name, "llama");
  EXPECT_EQ(hello->second[0].layout, (store::BlockLayout{4, 2, 1024}));

  // Put one block with a real engine write, then read it back through a plan.
  auto e = engine::Engine::create({});
  ASSERT_TRUE(e.has_value());
  std::vector<std::byte> block(8 * 1024), back(8 * 1024);
  engine::fill_pattern(block, 7);
  auto out = (*e)->register_memory(block.data(), block.size());
  auto in = (*e)->register_memory(back.data(), back.size());
  ASSERT_TRUE(out.has_value() && in.has_value());
  auto peer = (*e)->connect(hello->first);
  ASSERT_TRUE(peer.has_value()) << peer.error().to_string();
  auto pages = (*client)->allocate_blocks("llama", 1, "p");
  ASSERT_TRUE(pages.has_value()) << pages.error().to_string();
  auto run = [&](engine::Op op, engine::RegionHandle local, engine::RegionHandle remote, std::uint64_t offset) {
    auto h = (*e)->submit({{{.op = op, .local_region = local, .peer = peer->address, .remote_region = remote,
                             .remote_offset = offset, .length = block.size()}}, {}});
    return h ? (*e)->wait(*h, 10'000'000'000) : h.error();
  };
  ASSERT_TRUE(run(engine::Op::kWrite, out->handle, (*pages)[0].region, (*pages)[0].offset).is_ok());
  const std::vector<std::uint64_t> page{(*pages)[0].page}, hash{0x77};
  ASSERT_TRUE((*client)->seal("llama", "p", page, hash, {4, 2, 1024}).is_ok());
  auto answer = (*client)->query("llama", hash, "d");
  ASSERT_TRUE(answer.has_value()) << answer.error().to_string();
  ASSERT_EQ(answer->found, 1u);
  auto plan = baton::plan::parse_plan(answer->plan);
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->chunks.size(), 1u);
  EXPECT_EQ(plan->chunks[0].base, (*pages)[0].address);
  ASSERT_TRUE(run(engine::Op::kRead, in->handle, (*pages)[0].region, (*pages)[0].offset).is_ok());
  EXPECT_FALSE(engine::pattern_mismatch(back, 7).has_value());
  EXPECT_TRUE((*client)->release(answer->session).is_ok());
  (*e)->shutdown();
  EXPECT_TRUE(child->stop().is_ok());
}

// A store killed and restarted on its address is reached again within
// the client's reconnect backoff (0.5 s at most), however long it was gone
// and however hard the client tried meanwhile: gRPC's default backoff (1 s
// growing to 120 s) had a client failing for 5.9 s after the store was back.
TEST(StoreCommand, AClientReachesAStoreRestartedOnItsAddressAtOnce) {
  // Its bound is on time: not beside the tests that fill both cores (it
  // took 4.7 s once in a CI run, next to them).
  const baton::testing::CpuLock cpu;
  auto started = baton::cli::ServeChild::start({"--namespace", "llama:4x2x1024:8"}, BATON_BINARY, "", "store");
  ASSERT_TRUE(started.has_value()) << started.error().to_string();
  std::optional<baton::cli::ServeChild> first(std::move(*started));
  const std::string address = first->address();
  auto client = store::StoreClient::connect(address);
  ASSERT_TRUE(client.has_value());
  ASSERT_TRUE((*client)->stats().has_value());
  ::kill(first->pid(), SIGKILL);
  first.reset();
  for (const auto gone = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - gone < std::chrono::seconds(4);) {
    EXPECT_FALSE((*client)->stats().has_value());
  }
  std::optional<baton::cli::ServeChild> second;
  for (int i = 0; i < 100 && !second; ++i) {
    auto again = baton::cli::ServeChild::start({"--namespace", "llama:4x2x1024:8", "--listen", address},
                                               BATON_BINARY, "", "store");
    if (again) {
      second.emplace(std::move(*again));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ASSERT_TRUE(second.has_value());
  const auto back = std::chrono::steady_clock::now();
  while (!(*client)->stats().has_value() && std::chrono::steady_clock::now() - back < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // 0.86-0.89 s here (the backoff, its jitter, the store's start), 5.9 s
  // before; room for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - back, std::chrono::milliseconds(2500));
  EXPECT_TRUE(second->stop().is_ok());
}

// A fetch ends within its own timeout (its RPCs within at least 1 s)
// against a store that stopped (SIGSTOP): its RPCs took the client's whole
// call timeout (10 s for a fetch of 2 s).
TEST(StoreCommand, AFetchFromAStoppedStoreEndsWithinItsOwnTimeout) {
  auto child = baton::cli::ServeChild::start({"--namespace", "llama:4x2x1024:8"}, BATON_BINARY, "", "store");
  ASSERT_TRUE(child.has_value()) << child.error().to_string();
  constexpr baton::TimeNs kCallTimeout = 20'000'000'000;
  auto client = store::StoreClient::connect(child->address(), kCallTimeout);
  ASSERT_TRUE(client.has_value());
  auto e = engine::Engine::create({});
  ASSERT_TRUE(e.has_value());
  const std::vector<std::uint64_t> hash{0x77};
  ASSERT_TRUE((*client)->fetch(**e, "llama", hash, "d").has_value());  // connected, nothing found
  ASSERT_TRUE(baton::testing::stop_process(child->pid()));  // stopped before it is asked
  const auto asked = std::chrono::steady_clock::now();
  store::FetchOptions short_one;
  short_one.timeout_ns = 300'000'000;
  auto cut = (*client)->fetch(**e, "llama", hash, "d", short_one);
  const auto took = std::chrono::steady_clock::now() - asked;
  ::kill(child->pid(), SIGCONT);
  ASSERT_FALSE(cut.has_value());
  EXPECT_EQ(cut.error().code(), StatusCode::kTimeout) << cut.error().to_string();
  EXPECT_LT(took, std::chrono::nanoseconds(kCallTimeout / 4)) << "it waited for the client's call timeout";
  (*client).reset();
  (*e)->shutdown();
  EXPECT_TRUE(child->stop().is_ok());
}

TEST(StoreCommand, BadFlagsExitTwoWithOneLine) {
  for (const std::string args : {"store", "store --namespace llama", "store --namespace llama:4x3x1024:8",
                                 "store --namespace llama:4x2x1024:0", "store --namespace a:1x1x1:1 --namespace a:1x1x1:1",
                                 "store --namespace a:1x1x1:1 --listen 0.0.0.0:0",
                                 "store --namespace a:1x1x1:1 --lock-timeout never",
                                 "store --namespace a:65536x2x1048576:1024",
                                 // Numbers past 32 bits were cast (4294967297 slots became 1), a product past
                                 // 64 bits wrapped under the bound, a billion blocks ran out of memory.
                                 "store --namespace a:4294967297x1x4096:4", "store --namespace a:1x1x4096:4294967297",
                                 "store --namespace a:65536x2x65537:4294901761", "store --namespace a:1x1x1:1000000000",
                                 "store --namespace a:1x1x4096:4:0,0", "store --namespace a:1x1x4096:4:-1",
                                 // Flags that did nothing without --directory, and addresses that are no address.
                                 "store --namespace a:1x1x4096:4 --name foo", "store --namespace a:1x1x4096:4 --lease 5s",
                                 "store --namespace a:1x1x4096:4 --lease 10s",  // its default, given: still nothing to do
                                 "store --namespace a:1x1x4096:4 --directory garbage",
                                 "store --namespace a:1x1x4096:4 --engine-listen garbage",
                                 // The engine's flags are the other commands' (its refusal named --token-file,
                                 // which store did not take); an empty value is no value.
                                 "store --namespace a:1x1x4096:4 --lanes 0",
                                 "store --namespace a:1x1x4096:4 --token-file ''",
                                 // Two pools of 60 GiB: each within the bound of one, together more memory
                                 // than the machine has (they started, to die as the store filled).
                                 "store --namespace a:512x2x16384:3840 --namespace b:512x2x16384:3840"}) {
    const auto r = baton::testing::run_baton(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

// gRPC's default SO_REUSEPORT let a second store start on a port in use
// and take some of its connections. Refused, in one line that says why.
TEST(StoreCommand, ASecondStoreOnTheSamePortIsRefused) {
  auto first = baton::cli::ServeChild::start({"--namespace", "a:1x1x4096:4"}, BATON_BINARY, "", "store");
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  const auto r = baton::testing::run_baton("store --namespace a:1x1x4096:4 --listen " + first->address());
  EXPECT_NE(r.exit_code, 0) << r.out;
  // One line, with the kernel's reason; gRPC's own multi-line log stays out.
  EXPECT_NE(r.err.find("cannot listen on " + first->address() + ": Address already in use"), std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(first->stop().is_ok());
}

// An etcd gateway that takes the registration and its beats but fails the
// revocation, as an etcd gone away at shutdown: the store still stops, but
// says the record stays until its lease expires, and exits 1.
TEST(StoreCommand, AFailedDeregistrationIsSaidAndExitsOne) {
  httplib::Server etcd;
  std::atomic<int> revokes = 0;
  std::atomic<bool> revoke_fails = true;
  etcd.Post("/v3/lease/grant", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(R"({"ID":"7","TTL":"30"})", "application/json");
  });
  etcd.Post("/v3/kv/put", [](const httplib::Request&, httplib::Response& r) { r.set_content("{}", "application/json"); });
  etcd.Post("/v3/kv/txn", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(R"({"succeeded":true})", "application/json");
  });
  etcd.Post("/v3/lease/keepalive", [](const httplib::Request&, httplib::Response& r) {
    r.set_content(R"({"result":{"ID":"7","TTL":"30"}})", "application/json");
  });
  etcd.Post("/v3/lease/revoke", [&](const httplib::Request&, httplib::Response& r) {
    ++revokes;
    if (revoke_fails) r.status = 503;
    r.set_content("{}", "application/json");
  });
  const int port = etcd.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { etcd.listen_after_bind(); });
  const std::vector<std::string> args{"--namespace", "a:1x1x4096:4", "--directory", "127.0.0.1:" + std::to_string(port),
                                      "--lease", "30s"};

  auto failing = baton::cli::ServeChild::start(args, BATON_BINARY, "", "store");
  ASSERT_TRUE(failing.has_value()) << failing.error().to_string();
  const baton::Status stopped = failing->stop();
  EXPECT_FALSE(stopped.is_ok()) << "a record left behind is not a clean exit";
  EXPECT_NE(stopped.message().find("exit code 1"), std::string::npos) << stopped.to_string();
  EXPECT_EQ(revokes, 1);

  revoke_fails = false;
  auto leaving = baton::cli::ServeChild::start(args, BATON_BINARY, "", "store");
  ASSERT_TRUE(leaving.has_value()) << leaving.error().to_string();
  EXPECT_TRUE(leaving->stop().is_ok()) << "revoked: exit 0";
  EXPECT_EQ(revokes, 2);
  etcd.stop();
  serving.join();
}

}  // namespace
