// `baton bench store --spawn` as a user runs it: a real `baton store`
// child, the JSON contract, every fetched byte checked, no session leaked.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/baton_cli.h"

namespace {

TEST(BenchStore, QueriesAndFetchesFromASpawnedStore) {
  const baton::testing::CpuLock cpu;
  const auto r = baton::testing::run_baton(
      "bench store --spawn --blocks 96 --layers 4 --tp 2 --kv-split --requesters 3 --queries 4 --fetches 2 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["blocks"], 96);
  EXPECT_EQ(j["queries"], 12) << "3 requesters × 4";
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["sessions_leaked"], 0);
  EXPECT_EQ(j["locked_blocks_after"], 0);
  EXPECT_GT(j["plan_bytes"].get<int>(), 0);
  EXPECT_LT(j["plan_bytes"].get<int>(), j["naive_response_bytes"].get<int>()) << "the plan is the compact answer";
  EXPECT_LE(j["query_ms_p50"].get<double>(), j["query_ms_p99"].get<double>());
  EXPECT_GT(j["fetch_gbps"].get<double>(), 0);
}

// Requesters that never release, or are cut off mid-call: the store's lock
// timeout reclaims every lock and no page is lost.
TEST(BenchStore, AbandonedAndCutSessionsAreAllReclaimed) {
  const baton::testing::CpuLock cpu;
  const auto r = baton::testing::run_baton(
      "bench store --spawn --blocks 32 --layers 2 --tp 2 --requesters 4 --queries 1 --fetches 1 --sessions 400 "
      "--abandon 0.3 --cut 0.2 --lock-timeout 1s --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["drill_sessions"], 400);
  EXPECT_EQ(j["drill_released"].get<int>() + j["drill_abandoned"].get<int>() + j["drill_cut"].get<int>(), 400);
  EXPECT_GT(j["drill_abandoned"].get<int>(), 0);
  EXPECT_GE(j["expired_locks"].get<int>(), j["drill_abandoned"].get<int>()) << "every abandoned lock expired";
  EXPECT_EQ(j["sessions_leaked"], 0);
  EXPECT_EQ(j["locked_blocks_after"], 0);
  EXPECT_EQ(j["pages_leaked"], 0);
}

TEST(BenchStore, BadInputFailsWithOneLine) {
  for (const std::string args : {"bench store --blocks 4", "bench store --spawn --layers 4096 --tp 32",
                                 "bench store --spawn --blocks 4000000 --segment-bytes 1048576",
                                 "bench store --spawn --abandon 0.8 --cut 0.5",
                                 "bench store --spawn --lock-timeout 2h",
                                 // 2**47 bytes a block × 2**17 blocks wrapped to 0 and passed the 4 GiB check
                                 "bench store --spawn --layers 64 --tp 1024 --kv-split --segment-bytes 1073741824 "
                                 "--blocks 131072"}) {
    const auto r = baton::testing::run_baton(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  EXPECT_EQ(baton::testing::run_baton("bench store --spawn --blocks 0").exit_code, 2);
}

}  // namespace
