// The C ABI (baton/c/baton.h) through the shared libbaton: every bad input
// answers a status code (never a crash), and two engines in one process move
// bytes, a notification and an eventfd wake-up through it.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "baton/c/baton.h"
#include "baton/engine/pattern.h"  // the C++ API, from the same libbaton

namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

std::string last_error() { return baton_last_error(); }

// An engine on 127.0.0.1 with every default, destroyed with the test.
struct Engine {
  baton_engine* handle = nullptr;
  Engine() {
    const int rc = baton_engine_create(nullptr, &handle);
    EXPECT_EQ(rc, BATON_OK) << last_error();
  }
  ~Engine() { baton_engine_destroy(handle); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::string address() const {
    char text[256];
    EXPECT_EQ(baton_engine_address(handle, text, sizeof text, nullptr), BATON_OK) << last_error();
    return text;
  }
};

baton_request request(int op, std::uint32_t local_region, const char* peer, std::uint32_t remote_region,
                      std::uint64_t length) {
  baton_request r{};
  r.op = op;
  r.qos = BATON_QOS_HOT_KV;
  r.local_region = local_region;
  r.remote_region = remote_region;
  r.length = length;
  r.peer = peer;
  return r;
}

TEST(CApi, StatusNamesFollowTheEnum) {
  EXPECT_EQ(baton_abi_version(), BATON_ABI_VERSION);
  EXPECT_STREQ(baton_status_name(BATON_OK), "ok");
  EXPECT_STREQ(baton_status_name(BATON_NOT_FOUND), "not_found");
  EXPECT_STREQ(baton_status_name(BATON_PERMISSION_DENIED), "permission_denied");
  EXPECT_STREQ(baton_status_name(BATON_INTERNAL), "internal");
  EXPECT_STREQ(baton_status_name(BATON_MISUSE), "misuse");
  EXPECT_STREQ(baton_status_name(-1), "unknown");
  EXPECT_STREQ(baton_status_name(BATON_MISUSE + 1), "unknown");
}

TEST(CApi, ANullEngineIsMisuseEverywhere) {
  baton_engine* none = nullptr;
  char text[64];
  std::size_t size = 0;
  int number = 0;
  std::uint64_t batch = 0;
  baton_region region{};
  baton_batch_status status{};
  EXPECT_EQ(baton_engine_shutdown(none), BATON_MISUSE);
  EXPECT_EQ(baton_engine_address(none, text, sizeof text, &size), BATON_MISUSE);
  EXPECT_NE(last_error().find("baton_engine_address: engine is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(baton_engine_metrics_address(none, text, sizeof text, &size), BATON_MISUSE);
  EXPECT_EQ(baton_register_memory(none, text, sizeof text, BATON_MEMORY_DRAM, -1, &region), BATON_MISUSE);
  EXPECT_EQ(baton_allocate_memory(none, 4096, -1, &region), BATON_MISUSE);
  EXPECT_EQ(baton_export_region(none, 1, nullptr, 0), BATON_MISUSE);
  EXPECT_EQ(baton_unregister(none, 1), BATON_MISUSE);
  EXPECT_EQ(baton_connect(none, "127.0.0.1:1", text, sizeof text, &size), BATON_MISUSE);
  EXPECT_EQ(baton_refresh(none, "127.0.0.1:1", 0), BATON_MISUSE);
  EXPECT_EQ(baton_remote_regions(none, "127.0.0.1:1", nullptr, 0, &size), BATON_MISUSE);
  EXPECT_EQ(baton_submit(none, nullptr, 0, nullptr, 0, &batch), BATON_MISUSE);
  EXPECT_EQ(baton_prepare(none, nullptr, 0, nullptr, 0, &batch), BATON_MISUSE);
  EXPECT_EQ(baton_submit_prepared(none, 1, &batch), BATON_MISUSE);
  EXPECT_EQ(baton_run(none, nullptr, 0, nullptr, 0), BATON_MISUSE);
  EXPECT_EQ(baton_run_prepared(none, 1), BATON_MISUSE);
  EXPECT_EQ(baton_unprepare(none, 1), BATON_MISUSE);
  EXPECT_EQ(baton_poll(none, 1, &status), BATON_MISUSE);
  EXPECT_EQ(baton_wait(none, 1, 0), BATON_MISUSE);
  EXPECT_EQ(baton_cancel(none, 1), BATON_MISUSE);
  EXPECT_EQ(baton_release(none, 1), BATON_MISUSE);
  EXPECT_EQ(baton_batch_event_fd(none, &number), BATON_MISUSE);
  EXPECT_EQ(baton_take_notification(none, text, sizeof text, &size, text, sizeof text, &size, &number), BATON_MISUSE);
  baton_engine_destroy(none);  // ignored
  (baton_engine_config_init)(nullptr);  // ignored
}

TEST(CApi, AMadeUpOrDestroyedHandleIsMisuseNotACrash) {
  // Never dereferenced: the library looks handles up.
  auto* made_up = reinterpret_cast<baton_engine*>(std::uintptr_t{0xdeadbeef});
  char text[64];
  std::size_t size = 0;
  EXPECT_EQ(baton_engine_address(made_up, text, sizeof text, &size), BATON_MISUSE);
  EXPECT_NE(last_error().find("unknown engine handle"), std::string::npos) << last_error();
  baton_engine_destroy(made_up);  // ignored

  baton_engine* e = nullptr;
  ASSERT_EQ(baton_engine_create(nullptr, &e), BATON_OK) << last_error();
  ASSERT_EQ(baton_engine_address(e, text, sizeof text, &size), BATON_OK) << last_error();
  // Handles are not small counters: a guessed small integer names no engine.
  for (std::uintptr_t guess = 1; guess <= 64; ++guess) {
    if (reinterpret_cast<baton_engine*>(guess) == e) continue;
    EXPECT_EQ(baton_engine_address(reinterpret_cast<baton_engine*>(guess), text, sizeof text, &size), BATON_MISUSE)
        << guess;
  }
  baton_engine_destroy(e);
  EXPECT_EQ(baton_engine_address(e, text, sizeof text, &size), BATON_MISUSE);
  EXPECT_EQ(baton_allocate_memory(e, 4096, -1, nullptr), BATON_MISUSE);
  baton_engine_destroy(e);  // a second destroy is ignored
}

TEST(CApi, CreateChecksItsArguments) {
  EXPECT_EQ(baton_engine_create(nullptr, nullptr), BATON_MISUSE);

  baton_engine_config config;
  baton_engine_config_init(&config);
  EXPECT_EQ(config.size, sizeof(baton_engine_config));
  EXPECT_EQ(config.listen_address, nullptr);
  baton_engine* e = nullptr;
  config.size = 0;
  EXPECT_EQ(baton_engine_create(&config, &e), BATON_MISUSE);
  EXPECT_EQ(e, nullptr);

  // A newer baton.h's struct: unknown fields left zero are fine, set ones are not.
  struct Newer {
    baton_engine_config known;
    const char* unknown;
  } newer{};
  newer.unknown = "garbage";
  baton_engine_config_init_sized(&newer.known, sizeof newer);  // what the newer header's macro passes
  EXPECT_EQ(newer.known.size, sizeof newer);
  EXPECT_EQ(newer.unknown, nullptr);  // zeroed: this library does not know it
  newer.unknown = "set";
  EXPECT_EQ(baton_engine_create(&newer.known, &e), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("fields past"), std::string::npos) << last_error();
  newer.unknown = nullptr;
  ASSERT_EQ(baton_engine_create(&newer.known, &e), BATON_OK) << last_error();
  baton_engine_destroy(e);

  // A program built against the first layout (its struct ended before
  // `nics`): init writes nothing past its struct (it wrote this library's
  // whole struct: 16 bytes of the caller's stack zeroed, then read back as
  // fields), and create takes the rest as defaults.
  struct FirstLayout {
    unsigned char fields[offsetof(baton_engine_config, nics)];
    unsigned char after[32];
  } old;
  std::memset(&old, 0xAB, sizeof old);
  auto* first = reinterpret_cast<baton_engine_config*>(&old);
  baton_engine_config_init_sized(first, sizeof old.fields);
  EXPECT_EQ(first->size, sizeof old.fields);
  EXPECT_EQ(first->listen_address, nullptr);
  EXPECT_TRUE(std::all_of(std::begin(old.after), std::end(old.after), [](unsigned char b) { return b == 0xAB; }));
  ASSERT_EQ(baton_engine_create(first, &e), BATON_OK) << last_error();
  baton_engine_destroy(e);
  // Shorter than the first layout: nothing is written.
  std::memset(&old, 0xAB, sizeof old);
  baton_engine_config_init_sized(first, 8);
  EXPECT_TRUE(std::all_of(reinterpret_cast<unsigned char*>(&old), reinterpret_cast<unsigned char*>(&old) + sizeof old,
                          [](unsigned char b) { return b == 0xAB; }));
  baton_engine_config_init_sized(nullptr, sizeof config);  // ignored
  (baton_engine_config_init)(&config);  // the function programs built before the macro call
  EXPECT_EQ(config.size, sizeof(baton_engine_config));

  // The first layout's struct (it ended before `nics`): the rest are defaults.
  baton_engine_config_init(&config);
  config.size = offsetof(baton_engine_config, nics);
  config.listen_address = "127.0.0.1:0";
  config.nics = "no-such-nic0";  // past the struct's size: not read
  ASSERT_EQ(baton_engine_create(&config, &e), BATON_OK) << last_error();
  baton_engine_destroy(e);
  // Shorter than any layout, or larger than any struct could be: a corrupt
  // size, refused before a byte past the first field is read.
  for (const std::size_t size : {std::size_t{8}, offsetof(baton_engine_config, secret_file), std::size_t{20},
                                 offsetof(baton_engine_config, nics) - 1, std::size_t{4097}, SIZE_MAX}) {
    config.size = size;
    e = nullptr;
    EXPECT_EQ(baton_engine_create(&config, &e), BATON_MISUSE) << size;
    EXPECT_NE(last_error().find("config->size is"), std::string::npos) << last_error();
    EXPECT_EQ(e, nullptr);
  }

  // An empty secret file is a caller's unset variable, not "no secret".
  baton_engine_config_init(&config);
  config.secret_file = "";
  e = nullptr;
  EXPECT_EQ(baton_engine_create(&config, &e), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("secret_file is \"\""), std::string::npos) << last_error();
  EXPECT_EQ(e, nullptr);

  baton_engine_config_init(&config);
  config.policy_file = "/nonexistent/policy.yaml";
  EXPECT_NE(baton_engine_create(&config, &e), BATON_OK);
  EXPECT_NE(last_error().find("/nonexistent/policy.yaml"), std::string::npos) << last_error();
  config.policy_file = nullptr;
  config.listen_address = "not an address";
  EXPECT_EQ(baton_engine_create(&config, &e), BATON_INVALID_ARGUMENT) << last_error();

  config.listen_address = nullptr;
  config.nics = "no-such-nic0";
  EXPECT_EQ(baton_engine_create(&config, &e), BATON_INVALID_ARGUMENT) << last_error();
  EXPECT_NE(last_error().find("no such network interface"), std::string::npos) << last_error();
  for (const char* nics : {"lo,", ",,", ",lo", "lo,,lo"}) {  // an empty name
    config.nics = nics;
    EXPECT_EQ(baton_engine_create(&config, &e), BATON_INVALID_ARGUMENT) << nics;
    EXPECT_NE(last_error().find("an empty name"), std::string::npos) << last_error();
  }
  config.nics = nullptr;
  config.gpu_paths = 2;
  EXPECT_EQ(baton_engine_create(&config, &e), BATON_INVALID_ARGUMENT) << last_error();
  EXPECT_NE(last_error().find("gpu_paths"), std::string::npos) << last_error();
  if (::access("/dev/nvidia0", F_OK) != 0) {  // no GPU here: asked for, its paths fail the creation
    config.gpu_paths = 1;
    EXPECT_NE(baton_engine_create(&config, &e), BATON_OK);
    EXPECT_NE(last_error().find("gpu_paths"), std::string::npos) << last_error();
  }
  config.gpu_paths = 0;
  // Beyond loopback without a secret: refused unless said so.
  config.listen_address = "0.0.0.0:0";
  EXPECT_EQ(baton_engine_create(&config, &e), BATON_INVALID_ARGUMENT) << last_error();
  EXPECT_NE(last_error().find("without a secret"), std::string::npos) << last_error();
  config.allow_unauthenticated = 2;
  EXPECT_EQ(baton_engine_create(&config, &e), BATON_INVALID_ARGUMENT) << last_error();
  EXPECT_NE(last_error().find("allow_unauthenticated"), std::string::npos) << last_error();
  config.allow_unauthenticated = 1;
  ASSERT_EQ(baton_engine_create(&config, &e), BATON_OK) << last_error();
  baton_engine_destroy(e);
  config.allow_unauthenticated = 0;
  config.listen_address = nullptr;
  config.nics = "lo,lo";  // two rails on loopback
  ASSERT_EQ(baton_engine_create(&config, &e), BATON_OK) << last_error();
  baton_engine_destroy(e);
  config.nics = nullptr;

  config.listen_address = "";  // "" keeps the default
  config.metrics_address = "127.0.0.1:0";
  ASSERT_EQ(baton_engine_create(&config, &e), BATON_OK) << last_error();
  char text[64];
  std::size_t needed = 0;
  ASSERT_EQ(baton_engine_metrics_address(e, text, sizeof text, &needed), BATON_OK) << last_error();
  EXPECT_EQ(std::string(text).rfind("127.0.0.1:", 0), 0u) << text;
  EXPECT_EQ(needed, std::strlen(text) + 1);
  baton_engine_destroy(e);
}

// The library's own log lines go to stderr at BATON_LOG_LEVEL (default
// warn), as the `baton` command's: never into the program's stdout, which
// may carry its data. A refused connection logs an info line.
TEST(CApi, LogLinesStayOffTheProgramsStdout) {
  testing::internal::CaptureStdout();
  {
    Engine e;
    EXPECT_EQ(baton_connect(e.handle, "127.0.0.1:1", nullptr, 0, nullptr), BATON_UNAVAILABLE);
  }
  std::fflush(stdout);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
}

TEST(CApi, NullPointersAreMisuse) {
  Engine e;
  char text[64];
  std::size_t size = 0;
  int number = 0;
  std::uint64_t batch = 0;
  baton_remote_region remote[2];
  EXPECT_EQ(baton_engine_address(e.handle, nullptr, 10, &size), BATON_MISUSE);
  EXPECT_EQ(baton_register_memory(e.handle, text, sizeof text, BATON_MEMORY_DRAM, -1, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_allocate_memory(e.handle, 4096, -1, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_export_region(e.handle, 1, nullptr, 1), BATON_MISUSE);
  const char* peers[] = {"127.0.0.1:1", nullptr};
  EXPECT_EQ(baton_export_region(e.handle, 1, peers, 2), BATON_MISUSE);
  EXPECT_NE(last_error().find("peers[1] is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(baton_connect(e.handle, nullptr, text, sizeof text, &size), BATON_MISUSE);
  EXPECT_EQ(baton_connect(e.handle, "127.0.0.1:1", nullptr, 5, &size), BATON_MISUSE);
  EXPECT_EQ(baton_refresh(e.handle, nullptr, 0), BATON_MISUSE);
  EXPECT_EQ(baton_remote_regions(e.handle, nullptr, remote, 2, &size), BATON_MISUSE);
  EXPECT_EQ(baton_remote_regions(e.handle, "127.0.0.1:1", remote, 2, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_remote_regions(e.handle, "127.0.0.1:1", nullptr, 2, &size), BATON_MISUSE);
  baton_request r = request(BATON_OP_READ, 1, "127.0.0.1:1", 1, 8);
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_submit(e.handle, nullptr, 1, nullptr, 0, &batch), BATON_MISUSE);
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 3, &batch), BATON_MISUSE);
  r.peer = nullptr;
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_MISUSE);
  EXPECT_NE(last_error().find("requests[0].peer is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(baton_poll(e.handle, 1, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_batch_event_fd(e.handle, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_take_notification(e.handle, text, sizeof text, nullptr, text, sizeof text, &size, &number),
            BATON_MISUSE);
  EXPECT_EQ(baton_take_notification(e.handle, text, sizeof text, &size, text, sizeof text, nullptr, &number),
            BATON_MISUSE);
  EXPECT_EQ(baton_take_notification(e.handle, text, sizeof text, &size, text, sizeof text, &size, nullptr),
            BATON_MISUSE);
  EXPECT_EQ(baton_take_notification(e.handle, nullptr, 4, &size, text, sizeof text, &size, &number), BATON_MISUSE);
  EXPECT_EQ(baton_take_notification(e.handle, text, sizeof text, &size, nullptr, 4, &size, &number), BATON_MISUSE);
}

TEST(CApi, BadValuesAreInvalidArgument) {
  Engine e;
  std::vector<std::byte> buffer(4096);
  baton_region region{};
  std::uint64_t batch = 0;
  EXPECT_EQ(baton_register_memory(e.handle, buffer.data(), buffer.size(), 7, -1, &region), BATON_INVALID_ARGUMENT);
  EXPECT_EQ(baton_register_memory(e.handle, nullptr, 4096, BATON_MEMORY_DRAM, -1, &region), BATON_INVALID_ARGUMENT);
  EXPECT_EQ(baton_register_memory(e.handle, buffer.data(), 0, BATON_MEMORY_DRAM, -1, &region),
            BATON_INVALID_ARGUMENT);
  EXPECT_EQ(baton_allocate_memory(e.handle, 0, -1, &region), BATON_INVALID_ARGUMENT);
  // DRAM's device is the NUMA node it is on: -1 or a node of this machine.
  for (const int device : {-5, 4095}) {
    EXPECT_EQ(baton_register_memory(e.handle, buffer.data(), buffer.size(), BATON_MEMORY_DRAM, device, &region),
              BATON_INVALID_ARGUMENT) << device;
    EXPECT_NE(last_error().find("device " + std::to_string(device)), std::string::npos) << last_error();
    EXPECT_EQ(baton_allocate_memory(e.handle, 4096, device, &region), BATON_INVALID_ARGUMENT) << device;
  }
  ASSERT_EQ(baton_register_memory(e.handle, buffer.data(), buffer.size(), BATON_MEMORY_DRAM, -1, &region), BATON_OK)
      << last_error();
  EXPECT_EQ(baton_register_memory(e.handle, buffer.data() + 8, 8, BATON_MEMORY_DRAM, -1, &region),
            BATON_INVALID_ARGUMENT);  // overlaps

  const char* empty_name[] = {""};
  EXPECT_EQ(baton_export_region(e.handle, region.handle, empty_name, 1), BATON_INVALID_ARGUMENT);

  const char* not_addresses[] = {"10.0.0.1:7000", "garbage"};
  EXPECT_EQ(baton_export_region(e.handle, region.handle, not_addresses, 2), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("garbage"), std::string::npos) << last_error();
  // A count no list has (a negative number cast): refused before anything is read or allocated.
  EXPECT_EQ(baton_export_region(e.handle, region.handle, not_addresses, SIZE_MAX), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("peer_count"), std::string::npos) << last_error();

  baton_request r = request(BATON_OP_READ, region.handle, "127.0.0.1:1", 1, 8);
  // A corrupt count is refused before anything is read or allocated.
  EXPECT_EQ(baton_submit(e.handle, &r, SIZE_MAX, nullptr, 0, &batch), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("count is"), std::string::npos) << last_error();
  r.op = 5;
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_INVALID_ARGUMENT);
  r.op = BATON_OP_READ;
  r.qos = BATON_QOS_BACKGROUND + 1;
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_INVALID_ARGUMENT);
  r.qos = -1;
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_INVALID_ARGUMENT);
  r.qos = BATON_QOS_DECODE_CRITICAL;
  r.deadline_ns = -1;
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_INVALID_ARGUMENT);
  r.deadline_ns = 0;
  r.timeout_ns = -1;
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("requests[0]"), std::string::npos) << last_error();
  EXPECT_EQ(baton_submit(e.handle, nullptr, 0, nullptr, 0, &batch), BATON_INVALID_ARGUMENT);  // empty batch
  EXPECT_EQ(baton_refresh(e.handle, "127.0.0.1:1", -1), BATON_INVALID_ARGUMENT);
  EXPECT_EQ(baton_wait(e.handle, 1, -1), BATON_INVALID_ARGUMENT);
  EXPECT_EQ(baton_connect(e.handle, "no port", nullptr, 0, nullptr), BATON_INVALID_ARGUMENT) << last_error();
  EXPECT_EQ(baton_unregister(e.handle, region.handle), BATON_OK) << last_error();
}

TEST(CApi, UnknownRegionsBatchesAndPeersAreNotFound) {
  Engine e;
  std::size_t count = 0;
  std::uint64_t batch = 0;
  baton_batch_status status{};
  EXPECT_EQ(baton_export_region(e.handle, 999, nullptr, 0), BATON_NOT_FOUND);
  EXPECT_EQ(baton_unregister(e.handle, 999), BATON_NOT_FOUND);
  EXPECT_EQ(baton_poll(e.handle, 12345, &status), BATON_NOT_FOUND);
  EXPECT_NE(last_error().find("12345"), std::string::npos) << last_error();
  EXPECT_EQ(baton_wait(e.handle, 12345, kSecond / 100), BATON_NOT_FOUND);
  EXPECT_EQ(baton_cancel(e.handle, 12345), BATON_NOT_FOUND);
  EXPECT_EQ(baton_release(e.handle, 12345), BATON_NOT_FOUND);
  EXPECT_EQ(baton_remote_regions(e.handle, "127.0.0.1:1", nullptr, 0, &count), BATON_NOT_FOUND);
  baton_region region{};
  ASSERT_EQ(baton_allocate_memory(e.handle, 4096, -1, &region), BATON_OK) << last_error();
  baton_request r = request(BATON_OP_WRITE, region.handle, "127.0.0.1:1", 1, 8);
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_NOT_FOUND);
  EXPECT_NE(last_error().find("127.0.0.1:1"), std::string::npos) << last_error();
}

TEST(CApi, TooSmallBuffersReportTheSizeAndWriteNothing) {
  Engine e;
  const std::string address = e.address();
  std::size_t needed = 0;
  ASSERT_EQ(baton_engine_address(e.handle, nullptr, 0, &needed), BATON_OK);  // the size only
  EXPECT_EQ(needed, address.size() + 1);
  char small[4] = {'x', 'x', 'x', 'x'};
  needed = 0;
  EXPECT_EQ(baton_engine_address(e.handle, small, sizeof small, &needed), BATON_OUT_OF_RANGE);
  EXPECT_EQ(needed, address.size() + 1);
  EXPECT_EQ(std::string(small, sizeof small), "xxxx");
  std::vector<char> exact(address.size() + 1);
  ASSERT_EQ(baton_engine_address(e.handle, exact.data(), exact.size(), nullptr), BATON_OK);
  EXPECT_EQ(std::string(exact.data()), address);
  ASSERT_EQ(baton_engine_metrics_address(e.handle, small, sizeof small, &needed), BATON_OK);
  EXPECT_EQ(needed, 1u);  // no metrics server: ""
  EXPECT_EQ(small[0], '\0');

  // No notification waits: nothing taken, sizes 0.
  std::size_t from_needed = 9, message_length = 9;
  int taken = 9;
  char from[64];
  ASSERT_EQ(baton_take_notification(e.handle, from, sizeof from, &from_needed, nullptr, 0, &message_length, &taken),
            BATON_OK);
  EXPECT_EQ(taken, 0);
  EXPECT_EQ(from_needed, 0u);
  EXPECT_EQ(message_length, 0u);
}

TEST(CApi, AShutDownEngineAnswersUnavailable) {
  Engine e;
  baton_region region{};
  ASSERT_EQ(baton_allocate_memory(e.handle, 4096, -1, &region), BATON_OK) << last_error();
  ASSERT_EQ(baton_engine_shutdown(e.handle), BATON_OK);
  EXPECT_EQ(baton_engine_shutdown(e.handle), BATON_OK);  // again: nothing to do
  std::vector<std::byte> buffer(4096);
  baton_region other{};
  EXPECT_EQ(baton_register_memory(e.handle, buffer.data(), buffer.size(), BATON_MEMORY_DRAM, -1, &other),
            BATON_UNAVAILABLE);
  EXPECT_NE(last_error().find("shut down"), std::string::npos) << last_error();
  EXPECT_EQ(baton_allocate_memory(e.handle, 4096, -1, &other), BATON_UNAVAILABLE);
  EXPECT_EQ(baton_export_region(e.handle, region.handle, nullptr, 0), BATON_UNAVAILABLE);
  EXPECT_EQ(baton_unregister(e.handle, region.handle), BATON_UNAVAILABLE);
  EXPECT_EQ(baton_connect(e.handle, "127.0.0.1:1", nullptr, 0, nullptr), BATON_UNAVAILABLE);
  EXPECT_EQ(baton_refresh(e.handle, "127.0.0.1:1", 0), BATON_UNAVAILABLE);
  std::size_t count = 0;
  EXPECT_EQ(baton_remote_regions(e.handle, "127.0.0.1:1", nullptr, 0, &count), BATON_UNAVAILABLE);
  baton_request r = request(BATON_OP_READ, region.handle, "127.0.0.1:1", 1, 8);
  std::uint64_t batch = 0;
  EXPECT_EQ(baton_submit(e.handle, &r, 1, nullptr, 0, &batch), BATON_UNAVAILABLE);
  EXPECT_EQ(baton_cancel(e.handle, 1), BATON_UNAVAILABLE);
  // What reads state still answers (baton.h): an unknown batch is not found.
  baton_batch_status status{};
  EXPECT_EQ(baton_poll(e.handle, 12345, &status), BATON_NOT_FOUND);
  EXPECT_EQ(baton_release(e.handle, 12345), BATON_NOT_FOUND);
  std::size_t needed = 0;
  EXPECT_EQ(baton_engine_address(e.handle, nullptr, 0, &needed), BATON_OK);
  EXPECT_GT(needed, 1u);
}

// Two engines in one process: a read and a write of 1 MiB through the C ABI,
// the write carrying a notification, the reader woken by the eventfd.
TEST(CApi, TwoEnginesMoveBytesAndANotification) {
  constexpr std::size_t kBytes = 1 << 20;
  Engine target;
  Engine local;

  baton_region served{};
  ASSERT_EQ(baton_allocate_memory(target.handle, kBytes, -1, &served), BATON_OK) << last_error();
  ASSERT_NE(served.base, nullptr);
  ASSERT_EQ(served.length, kBytes);
  auto served_bytes = std::span(static_cast<std::byte*>(served.base), kBytes);
  baton::engine::fill_pattern(served_bytes, 3);
  ASSERT_EQ(baton_export_region(target.handle, served.handle, nullptr, 0), BATON_OK) << last_error();

  std::vector<std::byte> buffer(kBytes);
  baton_region mine{};
  ASSERT_EQ(baton_register_memory(local.handle, buffer.data(), kBytes, BATON_MEMORY_DRAM, -1, &mine), BATON_OK)
      << last_error();
  EXPECT_EQ(mine.base, buffer.data());

  // Too small a buffer for the peer's name: the connection stands, the
  // size comes back, and connecting again returns at once.
  const std::string target_address = target.address();
  char peer[64];
  std::size_t needed = 0;
  ASSERT_EQ(baton_connect(local.handle, target_address.c_str(), peer, 3, &needed), BATON_OUT_OF_RANGE)
      << last_error();
  ASSERT_EQ(needed, target_address.size() + 1);
  ASSERT_EQ(baton_connect(local.handle, target_address.c_str(), peer, sizeof peer, &needed), BATON_OK)
      << last_error();
  EXPECT_EQ(std::string(peer), target_address);
  ASSERT_EQ(baton_refresh(local.handle, peer, 0), BATON_OK) << last_error();

  std::size_t count = 0;
  ASSERT_EQ(baton_remote_regions(local.handle, peer, nullptr, 0, &count), BATON_OK) << last_error();
  ASSERT_EQ(count, 1u);
  baton_remote_region remote[2];
  std::memset(remote, 0xff, sizeof remote);  // every field is written
  count = 0;
  EXPECT_EQ(baton_remote_regions(local.handle, peer, remote, 0, &count), BATON_OUT_OF_RANGE);
  EXPECT_EQ(count, 1u);
  ASSERT_EQ(baton_remote_regions(local.handle, peer, remote, 2, &count), BATON_OK) << last_error();
  EXPECT_EQ(remote[0].key, served.handle);
  EXPECT_EQ(remote[0].base, reinterpret_cast<std::uint64_t>(served.base));
  EXPECT_EQ(remote[0].length, kBytes);
  EXPECT_EQ(remote[0].staged, 0u) << "host memory";

  int fd = -1;
  ASSERT_EQ(baton_batch_event_fd(local.handle, &fd), BATON_OK) << last_error();
  ASSERT_GE(fd, 0);

  // A read of the whole region, in two requests.
  baton_request reads[2] = {request(BATON_OP_READ, mine.handle, peer, remote[0].key, kBytes / 2),
                            request(BATON_OP_READ, mine.handle, peer, remote[0].key, kBytes / 2)};
  reads[1].local_offset = reads[1].remote_offset = kBytes / 2;
  reads[1].deadline_ns = 10 * kSecond;
  reads[1].timeout_ns = 20 * kSecond;
  std::uint64_t batch = 0;
  ASSERT_EQ(baton_submit(local.handle, reads, 2, nullptr, 0, &batch), BATON_OK) << last_error();
  pollfd readable{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&readable, 1, 20'000), 1) << "the eventfd never turned readable";
  ASSERT_EQ(baton_wait(local.handle, batch, 20 * kSecond), BATON_OK) << last_error();
  baton_batch_status status{};
  ASSERT_EQ(baton_poll(local.handle, batch, &status), BATON_OK) << last_error();
  EXPECT_EQ(status.done, 1);
  EXPECT_EQ(status.status, BATON_OK);
  EXPECT_EQ(status.bytes, kBytes);
  EXPECT_EQ(status.bytes_done, kBytes);
  const auto bad = baton::engine::pattern_mismatch(buffer, 3);
  EXPECT_FALSE(bad.has_value()) << "byte " << *bad;
  EXPECT_EQ(baton_cancel(local.handle, batch), BATON_INVALID_ARGUMENT);  // it ended
  ASSERT_EQ(baton_release(local.handle, batch), BATON_OK) << last_error();
  EXPECT_EQ(baton_poll(local.handle, batch, &status), BATON_NOT_FOUND);

  // A write of a fresh pattern, with a notification the target takes.
  baton::engine::fill_pattern(buffer, 5);
  baton_request write = request(BATON_OP_WRITE, mine.handle, peer, remote[0].key, kBytes);
  const std::string note = "kv blocks 0..15 landed";
  ASSERT_EQ(baton_submit(local.handle, &write, 1, note.data(), note.size(), &batch), BATON_OK) << last_error();
  ASSERT_EQ(baton_wait(local.handle, batch, 20 * kSecond), BATON_OK) << last_error();
  ASSERT_EQ(baton_poll(local.handle, batch, &status), BATON_OK) << last_error();
  EXPECT_EQ(status.status, BATON_OK);
  EXPECT_EQ(status.bytes_done, kBytes);
  ASSERT_EQ(baton_release(local.handle, batch), BATON_OK) << last_error();
  const auto bad_write = baton::engine::pattern_mismatch(served_bytes, 5);
  EXPECT_FALSE(bad_write.has_value()) << "byte " << *bad_write;

  // The notification follows the bytes; it may take a loop turn to arrive.
  std::size_t from_needed = 0, message_length = 0;
  int taken = 0;
  for (int i = 0; i < 2000 && from_needed == 0; ++i) {
    ASSERT_EQ(baton_take_notification(target.handle, nullptr, 0, &from_needed, nullptr, 0, &message_length, &taken),
              BATON_OK)
        << last_error();
    if (from_needed == 0) ::usleep(1000);
  }
  ASSERT_EQ(taken, 0);  // sizes only
  const std::string local_address = local.address();
  ASSERT_EQ(from_needed, local_address.size() + 1);
  ASSERT_EQ(message_length, note.size());
  char from[64];
  char message[64];
  EXPECT_EQ(baton_take_notification(target.handle, from, sizeof from, &from_needed, message, 4, &message_length,
                                    &taken),
            BATON_OUT_OF_RANGE);
  EXPECT_EQ(taken, 0);
  EXPECT_EQ(message_length, note.size());
  ASSERT_EQ(baton_take_notification(target.handle, from, sizeof from, &from_needed, message, sizeof message,
                                    &message_length, &taken),
            BATON_OK)
      << last_error();
  EXPECT_EQ(taken, 1);
  EXPECT_EQ(std::string(from), local_address);
  EXPECT_EQ(std::string(message, message_length), note);
  ASSERT_EQ(baton_take_notification(target.handle, from, sizeof from, &from_needed, message, sizeof message,
                                    &message_length, &taken),
            BATON_OK);
  EXPECT_EQ(taken, 0);

  ASSERT_EQ(baton_unregister(local.handle, mine.handle), BATON_OK) << last_error();
  EXPECT_EQ(baton_unregister(local.handle, mine.handle), BATON_NOT_FOUND);
}

// A prepared batch: checked as baton_submit checks (the same refusals), then
// submitted again and again, each time moving that moment's bytes, with a
// relative deadline made absolute per submit; ids are per engine and
// unprepare forgets them.
TEST(CApi, APreparedBatchIsCheckedOnceAndSubmittedManyTimes) {
  constexpr std::size_t kBytes = 64 << 10;
  Engine target;
  Engine local;
  baton_region served{};
  ASSERT_EQ(baton_allocate_memory(target.handle, kBytes, -1, &served), BATON_OK) << last_error();
  ASSERT_EQ(baton_export_region(target.handle, served.handle, nullptr, 0), BATON_OK) << last_error();
  auto served_bytes = std::span(static_cast<std::byte*>(served.base), kBytes);
  std::vector<std::byte> buffer(kBytes);
  baton_region mine{};
  ASSERT_EQ(baton_register_memory(local.handle, buffer.data(), kBytes, BATON_MEMORY_DRAM, -1, &mine), BATON_OK)
      << last_error();
  char peer[64];
  ASSERT_EQ(baton_connect(local.handle, target.address().c_str(), peer, sizeof peer, nullptr), BATON_OK)
      << last_error();
  ASSERT_EQ(baton_refresh(local.handle, peer, 0), BATON_OK) << last_error();

  std::uint64_t prepared = 0, batch = 0;
  baton_request reads[2] = {request(BATON_OP_READ, mine.handle, peer, served.handle, kBytes / 2),
                            request(BATON_OP_READ, mine.handle, peer, served.handle, kBytes / 2)};
  reads[1].local_offset = reads[1].remote_offset = kBytes / 2;
  // baton_submit's refusals, at prepare.
  EXPECT_EQ(baton_prepare(local.handle, reads, 2, nullptr, 0, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_prepare(local.handle, nullptr, 2, nullptr, 0, &prepared), BATON_MISUSE);
  EXPECT_EQ(baton_prepare(local.handle, reads, SIZE_MAX, nullptr, 0, &prepared), BATON_INVALID_ARGUMENT);
  baton_request bad = reads[0];
  bad.op = 9;
  EXPECT_EQ(baton_prepare(local.handle, &bad, 1, nullptr, 0, &prepared), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("baton_prepare: requests[0].op"), std::string::npos) << last_error();
  bad = reads[0];
  bad.deadline_ns = -1;
  EXPECT_EQ(baton_prepare(local.handle, &bad, 1, nullptr, 0, &prepared), BATON_INVALID_ARGUMENT);
  // What the engine refuses at submit (peers, regions, ranges, the batch as a
  // whole), it refuses at prepare: a prepared id is never one whose every
  // submit would fail.
  bad = reads[0];
  bad.length = 0;
  EXPECT_EQ(baton_prepare(local.handle, &bad, 1, nullptr, 0, &prepared), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("length 0"), std::string::npos) << last_error();
  bad = reads[0];
  bad.local_region = 777;
  EXPECT_EQ(baton_prepare(local.handle, &bad, 1, nullptr, 0, &prepared), BATON_NOT_FOUND);
  bad = reads[0];
  bad.peer = "127.0.0.1:1";
  EXPECT_EQ(baton_prepare(local.handle, &bad, 1, nullptr, 0, &prepared), BATON_NOT_FOUND);
  bad = reads[0];
  bad.remote_offset = kBytes;
  EXPECT_EQ(baton_prepare(local.handle, &bad, 1, nullptr, 0, &prepared), BATON_OUT_OF_RANGE);
  EXPECT_EQ(baton_prepare(local.handle, reads, 0, nullptr, 0, &prepared), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("baton_prepare: the batch is empty"), std::string::npos) << last_error();
  EXPECT_EQ(baton_submit_prepared(local.handle, 12345, &batch), BATON_NOT_FOUND);
  EXPECT_EQ(baton_unprepare(local.handle, 12345), BATON_NOT_FOUND);

  ASSERT_EQ(baton_prepare(local.handle, reads, 2, nullptr, 0, &prepared), BATON_OK) << last_error();
  std::uint64_t timed = 0;
  reads[1].deadline_ns = 10 * kSecond;  // relative: made absolute at each submit
  ASSERT_EQ(baton_prepare(local.handle, reads, 2, nullptr, 0, &timed), BATON_OK) << last_error();
  EXPECT_NE(timed, prepared);
  EXPECT_EQ(baton_submit_prepared(local.handle, prepared, nullptr), BATON_MISUSE);
  EXPECT_EQ(baton_submit_prepared(target.handle, prepared, &batch), BATON_NOT_FOUND);  // another engine's id
  for (int round = 0; round < 20; ++round) {
    baton::engine::fill_pattern(served_bytes, 50 + round);
    ASSERT_EQ(baton_submit_prepared(local.handle, round % 2 == 0 ? prepared : timed, &batch), BATON_OK) << last_error();
    ASSERT_EQ(baton_wait(local.handle, batch, 20 * kSecond), BATON_OK) << last_error();
    baton_batch_status status{};
    ASSERT_EQ(baton_poll(local.handle, batch, &status), BATON_OK) << last_error();
    EXPECT_EQ(status.status, BATON_OK) << last_error();
    EXPECT_EQ(status.bytes_done, kBytes);
    ASSERT_EQ(baton_release(local.handle, batch), BATON_OK) << last_error();
    EXPECT_FALSE(baton::engine::pattern_mismatch(buffer, 50 + round).has_value()) << "round " << round;
  }
  // baton_run_prepared / baton_run: the same bytes, no batch to wait for or release.
  EXPECT_EQ(baton_run_prepared(local.handle, 12345), BATON_NOT_FOUND);
  EXPECT_EQ(baton_run_prepared(target.handle, prepared), BATON_NOT_FOUND);  // another engine's id
  for (int round = 0; round < 20; ++round) {
    baton::engine::fill_pattern(served_bytes, 80 + round);
    const int rc = round % 3 == 2 ? baton_run(local.handle, reads, 2, nullptr, 0)
                                  : baton_run_prepared(local.handle, round % 2 == 0 ? prepared : timed);
    ASSERT_EQ(rc, BATON_OK) << last_error();
    EXPECT_FALSE(baton::engine::pattern_mismatch(buffer, 80 + round).has_value()) << "round " << round;
  }
  EXPECT_EQ(baton_run(local.handle, nullptr, 2, nullptr, 0), BATON_MISUSE);
  bad = reads[0];
  bad.op = 9;
  EXPECT_EQ(baton_run(local.handle, &bad, 1, nullptr, 0), BATON_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("baton_run: requests[0].op"), std::string::npos) << last_error();
  bad = reads[0];
  bad.remote_offset = kBytes;  // past the region: submit's out_of_range
  EXPECT_EQ(baton_run(local.handle, &bad, 1, nullptr, 0), BATON_OUT_OF_RANGE) << last_error();
  // A prepared batch whose regions went: baton_submit's answer, each time.
  ASSERT_EQ(baton_unregister(local.handle, mine.handle), BATON_OK) << last_error();
  EXPECT_EQ(baton_run_prepared(local.handle, prepared), BATON_NOT_FOUND) << last_error();
  EXPECT_EQ(baton_run(local.handle, reads, 2, nullptr, 0), BATON_NOT_FOUND) << last_error();
  EXPECT_EQ(baton_submit_prepared(local.handle, prepared, &batch), BATON_NOT_FOUND) << last_error();
  EXPECT_EQ(baton_submit_prepared(local.handle, timed, &batch), BATON_NOT_FOUND) << last_error();
  EXPECT_EQ(baton_submit(local.handle, reads, 2, nullptr, 0, &batch), BATON_NOT_FOUND) << last_error();
  ASSERT_EQ(baton_unprepare(local.handle, prepared), BATON_OK) << last_error();
  ASSERT_EQ(baton_unprepare(local.handle, timed), BATON_OK) << last_error();
  EXPECT_EQ(baton_submit_prepared(local.handle, prepared, &batch), BATON_NOT_FOUND);
  EXPECT_EQ(baton_unprepare(local.handle, prepared), BATON_NOT_FOUND);
}

// Region handles, batch ids and prepared ids are unique in the process: one
// engine's, named to another, is not_found there. They were per-engine
// counts, so engine B's first region was engine A's first region too, and a
// read "into B's region" submitted to A landed in A's buffer.
TEST(CApi, AnotherEnginesHandlesAreNotFoundHere) {
  Engine target;
  Engine a;
  Engine b;
  baton_region served{};
  ASSERT_EQ(baton_allocate_memory(target.handle, 4096, -1, &served), BATON_OK) << last_error();
  ASSERT_EQ(baton_export_region(target.handle, served.handle, nullptr, 0), BATON_OK) << last_error();
  std::vector<std::byte> in_a(4096), in_b(4096);
  baton_region ra{}, rb{};
  ASSERT_EQ(baton_register_memory(a.handle, in_a.data(), in_a.size(), BATON_MEMORY_DRAM, -1, &ra), BATON_OK);
  ASSERT_EQ(baton_register_memory(b.handle, in_b.data(), in_b.size(), BATON_MEMORY_DRAM, -1, &rb), BATON_OK);
  EXPECT_NE(ra.handle, rb.handle);
  char peer[64];
  ASSERT_EQ(baton_connect(a.handle, target.address().c_str(), peer, sizeof peer, nullptr), BATON_OK) << last_error();
  ASSERT_EQ(baton_refresh(a.handle, peer, 0), BATON_OK) << last_error();
  const baton_request wrong = request(BATON_OP_READ, rb.handle, peer, served.handle, 4096);
  EXPECT_EQ(baton_run(a.handle, &wrong, 1, nullptr, 0), BATON_NOT_FOUND) << last_error();
  std::uint64_t prepared = 0;
  EXPECT_EQ(baton_prepare(a.handle, &wrong, 1, nullptr, 0, &prepared), BATON_NOT_FOUND) << last_error();
  // A batch and a prepared batch of A, named to B.
  const baton_request right = request(BATON_OP_READ, ra.handle, peer, served.handle, 4096);
  std::uint64_t batch = 0;
  ASSERT_EQ(baton_submit(a.handle, &right, 1, nullptr, 0, &batch), BATON_OK) << last_error();
  ASSERT_EQ(baton_prepare(a.handle, &right, 1, nullptr, 0, &prepared), BATON_OK) << last_error();
  EXPECT_EQ(baton_wait(b.handle, batch, 0), BATON_NOT_FOUND);
  EXPECT_EQ(baton_release(b.handle, batch), BATON_NOT_FOUND);
  EXPECT_EQ(baton_unprepare(b.handle, prepared), BATON_NOT_FOUND);
  ASSERT_EQ(baton_wait(a.handle, batch, 20 * kSecond), BATON_OK) << last_error();
  EXPECT_EQ(baton_release(a.handle, batch), BATON_OK) << last_error();
  EXPECT_EQ(baton_unprepare(a.handle, prepared), BATON_OK) << last_error();
}

// The caller's peer string is echoed shortened: a 1 MiB one made a 1 MiB
// message.
TEST(CApi, AHugePeerNameIsShownShortened) {
  Engine e;
  std::vector<std::byte> buffer(4096);
  baton_region mine{};
  ASSERT_EQ(baton_register_memory(e.handle, buffer.data(), buffer.size(), BATON_MEMORY_DRAM, -1, &mine), BATON_OK);
  const std::string huge(1 << 20, 'p');
  const baton_request r = request(BATON_OP_READ, mine.handle, huge.c_str(), 1, 8);
  EXPECT_EQ(baton_run(e.handle, &r, 1, nullptr, 0), BATON_NOT_FOUND);
  EXPECT_NE(last_error().find("(1048576 bytes)"), std::string::npos) << last_error().substr(0, 300);
  EXPECT_LT(last_error().size(), 400u);
  EXPECT_EQ(baton_refresh(e.handle, huge.c_str(), 0), BATON_NOT_FOUND);
  EXPECT_LT(last_error().size(), 400u);
}

// A caller that prepares and never unprepares is stopped at 65536, with
// what to do; one unprepared makes room for one more.
TEST(CApi, PreparedBatchesAreBoundedPerEngine) {
  Engine target;
  Engine e;
  baton_region served{};
  ASSERT_EQ(baton_allocate_memory(target.handle, 4096, -1, &served), BATON_OK) << last_error();
  ASSERT_EQ(baton_export_region(target.handle, served.handle, nullptr, 0), BATON_OK) << last_error();
  std::vector<std::byte> buffer(4096);
  baton_region mine{};
  ASSERT_EQ(baton_register_memory(e.handle, buffer.data(), buffer.size(), BATON_MEMORY_DRAM, -1, &mine), BATON_OK)
      << last_error();
  char peer[64];
  ASSERT_EQ(baton_connect(e.handle, target.address().c_str(), peer, sizeof peer, nullptr), BATON_OK) << last_error();
  ASSERT_EQ(baton_refresh(e.handle, peer, 0), BATON_OK) << last_error();
  const baton_request r = request(BATON_OP_READ, mine.handle, peer, served.handle, 8);
  std::uint64_t id = 0, first = 0;
  std::size_t held = 0;
  while (baton_prepare(e.handle, &r, 1, nullptr, 0, &id) == BATON_OK) {
    if (held++ == 0) first = id;
    ASSERT_LE(held, 65536u);
  }
  EXPECT_EQ(held, 65536u);
  EXPECT_NE(last_error().find("baton_unprepare the unused"), std::string::npos) << last_error();
  EXPECT_EQ(baton_prepare(e.handle, &r, 1, nullptr, 0, &id), BATON_RESOURCE_EXHAUSTED);
  ASSERT_EQ(baton_unprepare(e.handle, first), BATON_OK) << last_error();
  EXPECT_EQ(baton_prepare(e.handle, &r, 1, nullptr, 0, &id), BATON_OK) << last_error();
}

// A notification length past the limit is refused before a byte of it is
// read: a corrupt length (1 GiB behind a 12-byte string) read far past it.
TEST(CApi, ANotificationTooLongIsRefusedBeforeItIsRead) {
  Engine local;
  std::vector<std::byte> buffer(4096);
  baton_region mine{};
  ASSERT_EQ(baton_register_memory(local.handle, buffer.data(), buffer.size(), BATON_MEMORY_DRAM, -1, &mine),
            BATON_OK)
      << last_error();
  const baton_request r = request(BATON_OP_READ, mine.handle, "127.0.0.1:1", 1, 16);
  char note[12] = "hello world";
  std::uint64_t batch = 0;
  for (const std::size_t length : {std::size_t{4097}, std::size_t{1} << 30, SIZE_MAX}) {
    EXPECT_EQ(baton_submit(local.handle, &r, 1, note, length, &batch), BATON_INVALID_ARGUMENT) << length;
    EXPECT_NE(last_error().find("at most 4096 bytes"), std::string::npos) << last_error();
  }
}

// Destroy while another thread waits on a batch: the engine shuts down in
// destroy, the waiter returns, and nothing lands in the caller's memory
// after destroy returned (it used to go on copying until the batch ended,
// into memory the caller had freed).
TEST(CApi, DestroyWhileAThreadWaitsStopsEveryCopyBeforeItReturns) {
  constexpr std::size_t kBytes = 4 << 20;
  Engine target;
  baton_engine* local = nullptr;
  ASSERT_EQ(baton_engine_create(nullptr, &local), BATON_OK) << last_error();
  baton_region served{};
  ASSERT_EQ(baton_allocate_memory(target.handle, kBytes, -1, &served), BATON_OK) << last_error();
  baton::engine::fill_pattern(std::span(static_cast<std::byte*>(served.base), kBytes), 9);
  ASSERT_EQ(baton_export_region(target.handle, served.handle, nullptr, 0), BATON_OK) << last_error();
  std::vector<std::byte> buffer(kBytes);
  baton_region mine{};
  ASSERT_EQ(baton_register_memory(local, buffer.data(), kBytes, BATON_MEMORY_DRAM, -1, &mine), BATON_OK)
      << last_error();
  char peer[64];
  ASSERT_EQ(baton_connect(local, target.address().c_str(), peer, sizeof peer, nullptr), BATON_OK) << last_error();
  // 64 GiB of reads: seconds of copying, far past the destroy below.
  std::vector<baton_request> reads(16384, request(BATON_OP_READ, mine.handle, peer, served.handle, kBytes));
  std::uint64_t batch = 0;
  ASSERT_EQ(baton_submit(local, reads.data(), reads.size(), nullptr, 0, &batch), BATON_OK) << last_error();
  std::atomic<int> waited{-1};
  std::thread waiter([&] { waited = baton_wait(local, batch, 60 * kSecond); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  baton_engine_destroy(local);
  std::memset(buffer.data(), 0, kBytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(std::all_of(buffer.begin(), buffer.end(), [](std::byte b) { return b == std::byte{0}; }))
      << "bytes landed after baton_engine_destroy returned";
  waiter.join();  // returned: the shutdown woke it
  EXPECT_NE(waited.load(), -1);
  std::uint64_t ignored = 0;
  EXPECT_EQ(baton_submit(local, reads.data(), 1, nullptr, 0, &ignored), BATON_MISUSE);  // the handle is gone
}

// connect() names a peer by its address resolved; another spelling of it
// is not found, and the message says which name to use.
TEST(CApi, APeerIsNamedByTheAddressConnectReturned) {
  Engine target;
  Engine local;
  const std::string address = target.address();
  const std::string port = address.substr(address.rfind(':'));
  const std::string spelled = "localhost" + port;
  char peer[64];
  ASSERT_EQ(baton_connect(local.handle, spelled.c_str(), peer, sizeof peer, nullptr), BATON_OK) << last_error();
  EXPECT_EQ(std::string(peer), "127.0.0.1" + port);
  EXPECT_EQ(baton_refresh(local.handle, peer, 0), BATON_OK) << last_error();
  EXPECT_EQ(baton_refresh(local.handle, spelled.c_str(), 0), BATON_NOT_FOUND);
  EXPECT_NE(last_error().find("named by the address connect() returned"), std::string::npos) << last_error();
}

}  // namespace
