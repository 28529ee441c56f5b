// `baton bench deadlines` as a user runs it: the JSON contract (every class
// of every policy counted over all submitted requests), the orderings the
// workload exists to show, determinism by seed, and one-line errors.
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tools/baton_cli.h"

namespace {

using baton::testing::CommandRun;

CommandRun baton(const std::string& args) { return baton::testing::run_baton(args); }

nlohmann::json run_json(const std::string& args) {
  const CommandRun r = baton("bench deadlines --json - " + args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

std::uint64_t missed(const nlohmann::json& policy) {
  std::uint64_t n = 0;
  for (const auto& [name, c] : policy["classes"].items()) n += c["missed"].get<std::uint64_t>();
  return n;
}

TEST(BenchDeadlines, JsonCountsEverySubmittedRequestOfEveryPolicy) {
  const auto j = run_json("--duration-ms 60 --load 0.9");
  EXPECT_EQ(j["load"], 0.9);
  EXPECT_GT(j["link_gbps"].get<double>(), 0);
  ASSERT_EQ(j["policies"].size(), 4u);
  std::uint64_t submitted_first = 0;
  for (const char* name : {"baseline_fifo", "strict_priority", "edf", "deadline_aware"}) {
    SCOPED_TRACE(name);
    const auto& p = j["policies"][name];
    std::uint64_t submitted = 0;
    for (const char* cls : {"decode", "prefill", "background"}) {
      const auto& c = p["classes"][cls];
      for (const char* key : {"submitted", "completed", "failed", "unfinished", "missed", "p50_us", "p99_us", "p999_us"}) {
        EXPECT_TRUE(c.contains(key)) << cls << " " << key;
      }
      EXPECT_EQ(c["submitted"], c["completed"].get<std::uint64_t>() + c["failed"].get<std::uint64_t>() +
                                    c["unfinished"].get<std::uint64_t>());
      EXPECT_LE(c["missed"], c["with_deadline"]);
      EXPECT_LE(c["p50_us"], c["p99_us"]);
      EXPECT_LE(c["p99_us"], c["p999_us"]);
      submitted += c["submitted"].get<std::uint64_t>();
    }
    EXPECT_EQ(p["classes"]["background"]["with_deadline"], 0);
    EXPECT_GT(p["classes"]["decode"]["submitted"].get<std::uint64_t>(), 100u);
    // Every policy sees the same arrivals.
    if (submitted_first == 0) submitted_first = submitted;
    EXPECT_EQ(submitted, submitted_first);
    EXPECT_GE(p["on_time_fraction"].get<double>(), 0);
    EXPECT_LE(p["on_time_fraction"].get<double>(), 1);
    EXPECT_GT(p["goodput_gbps"].get<double>(), 0);
  }
  // Only deadline_aware drops for local recompute.
  EXPECT_EQ(j["policies"]["edf"]["signalled_local_recompute"], 0);
}

TEST(BenchDeadlines, DeadlineAwareMissesLessThanEveryBaselineUnderLoad) {
  const auto j = run_json("--duration-ms 1000 --load 0.9");
  const std::uint64_t aware = missed(j["policies"]["deadline_aware"]);
  for (const char* baseline : {"baseline_fifo", "strict_priority", "edf"}) {
    EXPECT_LE(2 * aware, missed(j["policies"][baseline])) << baseline;
  }
}

TEST(BenchDeadlines, UnderOverloadDroppingWhatCannotMakeItKeepsTheRestOnTime) {
  const auto j = run_json("--duration-ms 300 --load 1.2");
  const double aware = j["policies"]["deadline_aware"]["on_time_fraction"];
  EXPECT_GT(j["policies"]["deadline_aware"]["signalled_local_recompute"].get<std::uint64_t>(), 0u);
  for (const char* baseline : {"strict_priority", "edf"}) {
    EXPECT_GE(aware, 1.3 * j["policies"][baseline]["on_time_fraction"].get<double>()) << baseline;
  }
}

TEST(BenchDeadlines, SameSeedSameJsonOtherSeedOther) {
  const CommandRun a = baton("bench deadlines --duration-ms 20 --seed 3 --json -");
  const CommandRun b = baton("bench deadlines --duration-ms 20 --seed 3 --json -");
  const CommandRun c = baton("bench deadlines --duration-ms 20 --seed 4 --json -");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(BenchDeadlines, OnePolicyAndEveryWorkloadKnob) {
  const auto j = run_json(
      "--duration-ms 20 --policies edf --decode-deadlines 2ms,3ms --prefill-sizes 512KiB --decode-size 64KiB "
      "--background-size 1MiB --decode-share 0.2 --prefill-share 0.5 --prefill-slack 6 --model nvswitch8 "
      "--from gpu0 --to gpu3 --link-gbps 100");
  ASSERT_EQ(j["policies"].size(), 1u);
  EXPECT_EQ(j["link_gbps"], 100.0);
  EXPECT_EQ(j["workload"]["decode"]["deadlines_ms"], nlohmann::json::array({2.0, 3.0}));
  EXPECT_EQ(j["workload"]["prefill"]["request_bytes"], nlohmann::json::array({512 * 1024}));
}

TEST(BenchDeadlines, BadInputIsOneLineAndExitsNonZero) {
  const std::pair<const char*, const char*> cases[] = {
      {"--load 0", "load 0 must be > 0"},
      {"--load -1", "load -1 must be > 0"},
      {"--decode-share 0.6 --prefill-share 0.6", "add up to <= 1"},
      {"--decode-deadlines 1ms,0ms", "decode deadline 0 ns must be > 0"},
      {"--decode-deadlines 5parsecs", "--decode-deadlines"},
      {"--prefill-sizes 0", "a prefill size is 0"},
      {"--prefill-sizes 1XB", "--prefill-sizes"},
      {"--prefill-slack 0", "prefill_slack 0 must be > 0"},
      {"--duration-ms 0", "--duration-ms 0 must be > 0"},
      {"--duration-ms inf", "--duration-ms inf must be > 0 and at most"},  // not an overflowed duration
      {"--load 1e300", "requests"},             // every request is generated up front: bounded
      {"--prefill-sizes 1B", "raise the sizes"},
      {"--policies fastest", "unknown policy \"fastest\""},
      {"--transport carrier-pigeon", "expected sim or ucx"},
      {"--transport ucx", "needs one of --target and --spawn"},
      {"--spawn", "need --transport ucx"},
      {"--from gpu0 --to nowhere", "nowhere"},
      {"--policy-file /nonexistent/policy.yaml", "/nonexistent/policy.yaml"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args);
    const std::string duration = std::string(args).find("--duration-ms") == std::string::npos ? "--duration-ms 5 " : "";
    const CommandRun r = baton("bench deadlines " + duration + args);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// The load is sized on the path the runs use: a policy's cost_model that
// slows that path slows the offered load with it (it stayed at the built-in
// 24 GB/s, the run silently about 5x overloaded).
TEST(BenchDeadlines, TheLoadFollowsThePolicysCostModel) {
  const std::string file =
      ::testing::TempDir() + "/bench_deadlines_cost_model_" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream out(file);
    out << "cost_model:\n  pcie_p2p:\n    PIX: {bandwidth_gbps: 5, latency_us: 3}\n";
  }
  const auto plain = run_json("--duration-ms 5");
  const auto slowed = run_json("--duration-ms 5 --policy-file " + file);
  std::remove(file.c_str());
  EXPECT_EQ(plain["link_gbps"], 24.0);  // gpu0 -> gpu1 of the default model: pcie_p2p over a PIX switch
  EXPECT_EQ(slowed["link_gbps"], 5.0);
}

// A policy file is the caller's input in every command that takes one: a
// missing one, a directory or bad YAML exits 2 before anything runs
// (a missing one exited 1, as if the run had failed).
TEST(BenchDeadlines, APolicyFileThatCannotBeUsedIsBadInputEverywhere) {
  // Per process: another suite's test wrote and removed a file of the same name.
  const std::string bad = ::testing::TempDir() + "/bench_deadlines_bad_policy_" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream out(bad);
    out << "bogus: [";
  }
  const std::pair<std::string, std::string> files[] = {
      {"/nonexistent/policy.yaml", "not a readable regular file (no such file)"},
      {"/tmp", "not a readable regular file (a directory)"},
      {bad, "invalid YAML"},
  };
  for (const char* command : {"bench deadlines --duration-ms 5", "bench mixed --duration-ms 5",
                              "bench throughput --spawn", "bench latency --spawn"}) {
    for (const auto& [file, message] : files) {
      const CommandRun r = baton(std::string(command) + " --policy-file " + file);
      EXPECT_EQ(r.exit_code, 2) << command << " " << file << ": " << r.err;
      EXPECT_NE(r.err.find(message), std::string::npos) << command << " " << file << ": " << r.err;
    }
  }
  std::remove(bad.c_str());
}

// A topology model's name is a flag: an unknown one exits 2 (bad input),
// as in `baton topo --model`, naming the models there are.
TEST(BenchDeadlines, AnUnknownTopologyModelIsBadInput) {
  for (const char* args : {"bench deadlines --model dgx9000", "bench plan --topology-model dgx9000",
                           "topo --model dgx9000"}) {
    const CommandRun r = baton(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("\"dgx9000\" does not exist (expected one of: nvlink-pairs, nvswitch8, pcie4)"),
              std::string::npos)
        << args << ": " << r.err;
  }
}

// A simulated link between nodes the model lacks is the caller's error,
// named, whether or not --link-gbps spares the lookup of its bandwidth.
TEST(BenchDeadlines, ALinkTheModelLacksIsBadInput) {
  for (const char* args : {"bench deadlines --from bogus --duration-ms 5",
                           "bench deadlines --to gpu9 --link-gbps 10 --duration-ms 5"}) {
    const CommandRun r = baton(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_NE(r.err.find("no link"), std::string::npos) << args << ": " << r.err;
    EXPECT_NE(r.err.find("topology model \"pcie4\""), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace
