// `baton bench mlu-sweep` as a user runs it: the JSON contract and one-line
// errors for bad input.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct CommandRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

CommandRun baton(const std::string& args) {
  static int runs = 0;
  const std::string stem = fmt::format("{}/baton_mlu_{}_{}", ::testing::TempDir(), getpid(), runs++);
  const int status = std::system(fmt::format("{} {} >{}.out 2>{}.err", BATON_BINARY, args, stem, stem).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(stem + ".out"), slurp(stem + ".err")};
}

TEST(BenchMluSweep, JsonContract) {
  const CommandRun r = baton("bench mlu-sweep --duration-ms 5 --deadlines-us 100,2000 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    for (const char* key : {"deadline_us", "count", "mean_mlu", "feasible_rate"}) EXPECT_TRUE(row.contains(key)) << key;
    for (const char* policy : {"fifo", "edf", "edf_drop"}) {
      EXPECT_TRUE(row["attainment"].contains(policy)) << policy;
      EXPECT_TRUE(row["signalled"].contains(policy)) << policy;
    }
  }
  EXPECT_EQ(j["rows"][0]["deadline_us"], 100);
  EXPECT_GT(j["rows"][0]["mean_mlu"].get<double>(), j["rows"][1]["mean_mlu"].get<double>());
}

TEST(BenchMluSweep, BadInputFailsWithOneLine) {
  for (const auto& [args, needle] : {std::pair<std::string, std::string>{"bench mlu-sweep --deadlines-us 0", "--deadlines-us"},
                                     {"bench mlu-sweep --duration-ms -1", "--duration-ms"}}) {
    const CommandRun r = baton(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
