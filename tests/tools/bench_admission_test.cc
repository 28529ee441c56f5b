// `baton bench mlu-sweep` as a user runs it: the JSON contract and one-line
// errors for bad input.
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

TEST(BenchMluSweep, JsonContract) {
  const CommandRun r = baton("bench mlu-sweep --duration-ms 5 --deadlines-us 100,2000 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    for (const char* key : {"deadline_us", "count", "mean_mlu", "feasible_rate", "unbounded_rate"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    for (const char* policy : {"fifo", "fifo_drop", "edf", "edf_drop"}) {
      EXPECT_TRUE(row["attainment"].contains(policy)) << policy;
      EXPECT_TRUE(row["signalled"].contains(policy)) << policy;
    }
  }
  EXPECT_EQ(j["rows"][0]["deadline_us"], 100);
  EXPECT_GT(j["rows"][0]["mean_mlu"].get<double>(), j["rows"][1]["mean_mlu"].get<double>());
}

TEST(BenchMluSweep, BadInputFailsWithOneLine) {
  for (const auto& [args, needle] : {std::pair<std::string, std::string>{"bench mlu-sweep --deadlines-us 0", "--deadlines-us"},
                                     {"bench mlu-sweep --duration-ms -1", "--duration-ms"},
                                     {"bench mlu-sweep --request-size 1XB", "--request-size"},
                                     {"bench mlu-sweep --transport pigeon", "expected sim or ucx"},
                                     {"bench mlu-sweep --transport ucx", "needs one of --target and --spawn"},
                                     {"bench mlu-sweep --transport ucx --spawn --load 0", "--load 0 must be > 0"},
                                     {"bench mlu-sweep --transport ucx --spawn --load 1e300", "at most 10"},
                                     {"bench mlu-sweep --duration-ms inf", "at most 3.6e6"},
                                     {"bench mlu-sweep --deadlines-us nan", "--deadlines-us"},
                                     {"bench mlu-sweep --spawn", "need --transport ucx"},
                                     {"bench mlu-sweep --load 0.5", "--load needs --transport ucx"}}) {
    const CommandRun r = baton(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
