// `baton bench dualpath` / `fault` as a user runs them: the JSON contracts
// the issue fixes, and one-line errors for bad input.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/baton_cli.h"

namespace {

using baton::testing::CommandRun;

CommandRun baton(const std::string& args) { return baton::testing::run_baton(args); }

TEST(BenchDualpath, HealthyRaceJson) {
  const CommandRun r = baton("bench dualpath --requests 40 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["requests"], 40);
  EXPECT_EQ(j["strategy"], "hedge");
  EXPECT_EQ(j["wins"]["direct"], 40);  // a healthy direct leg wins every race
  EXPECT_EQ(j["wins"]["store"], 0);
  EXPECT_EQ(j["cancelled_legs"], 40);
  for (const char* mode : {"racing", "direct_only", "store_only"}) {
    for (const char* p : {"p50", "p95", "p99"}) EXPECT_TRUE(j["latency_us"][mode].contains(p)) << mode << p;
  }
  EXPECT_LT(j["latency_us"]["racing"]["p99"].get<double>(), j["latency_us"]["store_only"]["p99"].get<double>());
  EXPECT_TRUE(j.contains("wasted_bytes"));
}

TEST(BenchDualpath, FaultRunJson) {
  const CommandRun r = baton("bench fault --duration-ms 40 --requests 100 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["requests"], 100);
  EXPECT_EQ(j["completed"], 100);
  EXPECT_EQ(j["dropped"], 0);
  EXPECT_GT(j["recovery_us"].get<double>(), 0);
  EXPECT_GT(j["returned_to_direct_at_us"].get<double>(), j["restore_at_us"].get<double>() - 1e-9);
  ASSERT_EQ(j["timeline"].size(), 100u);
  int on_store = 0;
  for (const auto& t : j["timeline"]) {
    for (const char* key : {"id", "start_us", "end_us", "leg", "status"}) EXPECT_TRUE(t.contains(key)) << key;
    on_store += t["leg"] == "store";
  }
  EXPECT_GT(on_store, 0);  // the fault window was served by the store
}

TEST(BenchDualpath, BadInputFailsWithOneLine) {
  for (const std::string args : {"bench dualpath --strategy fastest", "bench dualpath --requests 0",
                                 "bench fault --kill-at-ms 30 --restore-at-ms 20", "bench fault --requests 0"}) {
    const CommandRun r = baton(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
}

}  // namespace
