// Baton's logger: its own, so that a program's logging stays the program's.
#include "baton/common/log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

namespace baton {
namespace {

TEST(Logger, IsBatonsOwnAndRegisteredSoAProgramCanReachIt) {
  const auto program_default = spdlog::default_logger();
  spdlog::logger& ours = logger();
  EXPECT_EQ(ours.name(), "baton");
  EXPECT_EQ(spdlog::get("baton").get(), &ours);
  EXPECT_EQ(&logger(), &ours);  // made once
  EXPECT_NE(spdlog::default_logger().get(), &ours);
  EXPECT_EQ(spdlog::default_logger(), program_default);
}

TEST(Logger, InitLoggingSetsOnlyBatonsLevel) {
  std::ostringstream program_out;
  auto program = std::make_shared<spdlog::logger>("program", std::make_shared<spdlog::sinks::ostream_sink_mt>(program_out));
  spdlog::register_logger(program);  // where spdlog::set_level would reach it
  program->set_level(spdlog::level::info);
  const auto default_level = spdlog::default_logger()->level();
  const auto before = logger().level();

  ASSERT_TRUE(init_logging("debug").is_ok());
  EXPECT_EQ(logger().level(), spdlog::level::debug);
  ASSERT_TRUE(init_logging("off").is_ok());
  EXPECT_EQ(logger().level(), spdlog::level::off);
  EXPECT_EQ(program->level(), spdlog::level::info);
  EXPECT_EQ(spdlog::default_logger()->level(), default_level);

  const Status bad = init_logging("debgu");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("\"debgu\""), std::string::npos) << bad.message();
  EXPECT_EQ(logger().level(), spdlog::level::off);  // unchanged by the refusal

  logger().set_level(before);
  spdlog::drop("program");
}

TEST(Logger, LinesGoToBatonsSinksNotTheDefaultLoggers) {
  std::ostringstream ours_out;
  std::ostringstream default_out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(ours_out);
  logger().sinks().push_back(sink);
  const auto before = logger().level();
  logger().set_level(spdlog::level::info);
  const auto program_default = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::ostream_sink_mt>(default_out)));

  logger().info("a line of Baton's");

  spdlog::set_default_logger(program_default);
  logger().sinks().pop_back();
  logger().set_level(before);
  EXPECT_NE(ours_out.str().find("a line of Baton's"), std::string::npos);
  EXPECT_EQ(default_out.str(), "");
}

}  // namespace
}  // namespace baton
