// `baton bench mixed` / `ablation` as a user runs them: the JSON contract,
// determinism by seed, and one-line errors for bad input.
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/baton_cli.h"

namespace {

using baton::testing::CommandRun;

CommandRun baton(const std::string& args) { return baton::testing::run_baton(args); }

TEST(BenchMixed, JsonContractAndTheDeadlineAwareWin) {
  const CommandRun r = baton("bench mixed --duration-ms 40 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("workload"));
  for (const char* policy : {"baseline_fifo", "deadline_aware"}) {
    const auto& p = j["policies"][policy];
    for (const char* key : {"count", "p50_us", "p95_us", "p99_us", "miss_ratio"}) {
      EXPECT_TRUE(p["decode_critical"].contains(key)) << policy << " " << key;
    }
    for (const char* key : {"count", "p50_us", "p95_us", "p99_us", "throughput_gbps"}) {
      EXPECT_TRUE(p["prefill_bulk"].contains(key)) << policy << " " << key;
    }
    EXPECT_EQ(p["decode_critical"]["cdf_us"].size(), 101u);
  }
  const double reduction = j["decode_p99_reduction"];
  EXPECT_GE(reduction, 0.3);
  EXPECT_LE(reduction, 1.0);
}

TEST(BenchMixed, SameSeedSameJsonOtherSeedOther) {
  const CommandRun a = baton("bench mixed --duration-ms 20 --seed 7 --json -");
  const CommandRun b = baton("bench mixed --duration-ms 20 --seed 7 --json -");
  const CommandRun c = baton("bench mixed --duration-ms 20 --seed 8 --json -");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(BenchMixed, OnePolicyAlone) {
  const CommandRun r = baton("bench mixed --duration-ms 10 --policy baseline_fifo --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["policies"].size(), 1u);
  EXPECT_FALSE(j.contains("decode_p99_reduction"));
}

// A run in which no decode request arrived has no percentiles and no
// reduction to show: said so, not printed as 0.0 µs and a 0% cut.
TEST(BenchMixed, NoDecodeRequestIsNoFigure) {
  const CommandRun table = baton("bench mixed --duration-ms 2 --decode-interval-us 1e12");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("no decode request completed"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("decode p50"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("reduction"), std::string::npos) << table.out;
  const CommandRun r = baton("bench mixed --duration-ms 2 --decode-interval-us 1e12 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["decode_p99_reduction"].is_null()) << j["decode_p99_reduction"];
  EXPECT_EQ(j["policies"]["baseline_fifo"]["decode_critical"]["count"], 0);
}

TEST(BenchAblation, EveryCellOfTheSweep) {
  const CommandRun r = baton("bench ablation --duration-ms 10 --slice-sizes 64KiB,1MiB --budgets 512KiB,8MiB --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["cells"].size(), 4u);
  int skipped = 0;
  for (const auto& cell : j["cells"]) {
    if (cell.contains("skipped")) {
      ++skipped;  // 1 MiB slices do not fit a 512 KiB budget
      continue;
    }
    for (const char* key : {"decode_p99_us", "decode_miss_ratio", "prefill_throughput_gbps"}) {
      EXPECT_TRUE(cell.contains(key)) << key;
    }
  }
  EXPECT_EQ(skipped, 1);
  // Without --json the table says so too: a sweep of skipped cells is not
  // an empty output.
  const CommandRun table = baton("bench ablation --duration-ms 10 --slice-sizes 1MiB --budgets 512KiB,8MiB");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("skipped: the budget is smaller than one slice"), std::string::npos) << table.out;
  // Nothing but skips is no result: refused.
  const CommandRun none = baton("bench ablation --duration-ms 10 --slice-sizes 1MiB --budgets 512KiB");
  EXPECT_EQ(none.exit_code, 2) << none.out;
  EXPECT_NE(none.err.find("nothing to measure"), std::string::npos) << none.err;
  EXPECT_TRUE(none.out.empty()) << "refused before a row is printed: " << none.out;
}

TEST(BenchSched, BadInputFailsWithOneLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"bench mixed --policy fastest", "\"fastest\""},
      {"bench mixed --duration-ms 0", "--duration-ms"},
      {"bench mixed --policy-file /nonexistent/policy.yaml", "/nonexistent/policy.yaml"},
      {"bench mixed --prefill-burst 0", "prefill_burst"},
      // Every arrival is generated up front: too many is refused, not run out of memory.
      {"bench mixed --prefill-burst 1000000000", "requests would arrive (at most 2000000)"},
      {"bench dualpath --requests 100000000", "--requests 100000000: expected 1..1000000"},
      {"bench ablation --slice-sizes 12parsecs", "\"12parsecs\""},
      {"bench deadlines --policies edf,edf", "edf named twice"},
      // Refused before the run, not after it.
      {"bench mixed --json /nonexistent/dir/x.json", "\"/nonexistent/dir\" is not a writable directory"},
      {"bench mixed --json ''", "--json: an empty value"},
      {"bench mixed --json /tmp", "\"/tmp\": a directory, not a file"},
      // CLI11 read integers with strtoll's base 0: 010 was 8, 0x10 16.
      {"bench mixed --prefill-burst 017", "\"017\": write the number in decimal"},
      {"bench plan --blocks 010", "\"010\": write the number in decimal"},
      {"bench plan --blocks 0x10", "\"0x10\": write the number in decimal"},
      // A PiB overflowed the simulator's nanosecond clock: negative latencies, exit 0.
      {"bench mixed --duration-ms 1 --decode-size 1125899906842624", "the simulator takes at most 1 TiB a request"},
      {"bench dualpath --requests 2 --handoff-size 1125899906842624", "at most 1 TiB a request"},
      {"bench deadlines --duration-ms 5 --prefill-slack 1e15", "at most 1e6"},
  };
  for (const auto& [args, needle] : cases) {
    const CommandRun r = baton(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  EXPECT_NE(baton("bench").exit_code, 0);
  const CommandRun unknown = baton("bench nosuchmode");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown command \"bench nosuchmode\""), std::string::npos) << unknown.err;
  // A flag nobody knows, before any command: named, not "a subcommand is required".
  for (const char* args : {"--bogus", "--bogus=1", "-x", "bench --bogus"}) {
    const CommandRun flag = baton(args);
    EXPECT_EQ(flag.exit_code, 2) << args;
    EXPECT_NE(flag.err.find("unknown flag"), std::string::npos) << args << ": " << flag.err;
    EXPECT_EQ(std::count(flag.err.begin(), flag.err.end(), '\n'), 1) << args << ": " << flag.err;
  }
}

}  // namespace
