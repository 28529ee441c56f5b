#include "baton/common/status.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(Status, DefaultIsOk) {
  const Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, FactoriesFormatTheMessage) {
  const Status s = Status::invalid_argument("register_memory: length is {} (address {})", 0, "0x10");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "register_memory: length is 0 (address 0x10)");
  EXPECT_EQ(s.to_string(), "invalid_argument: register_memory: length is 0 (address 0x10)");
}

// The message is shared between copies; a copy, an assignment or a move
// never changes what either side says, and equality compares the text.
TEST(Status, CopiesAndMovesKeepTheirOwnCodeAndMessage) {
  Status a = Status::timeout("wait: batch {} still running", 7);
  const Status copy = a;
  EXPECT_EQ(copy, a);
  EXPECT_EQ(copy.message(), "wait: batch 7 still running");
  a = Status::ok();
  EXPECT_TRUE(a.is_ok());
  EXPECT_EQ(a.message(), "");
  EXPECT_EQ(copy.message(), "wait: batch 7 still running");  // unchanged by a's reassignment
  Status moved = std::move(a = copy);
  EXPECT_EQ(moved, copy);
  EXPECT_EQ(Status::timeout("wait: batch {} still running", 7), copy);  // equal text, separate strings
  EXPECT_NE(Status::timeout("wait: batch 8 still running"), copy);
  EXPECT_NE(Status::cancelled("wait: batch 7 still running"), copy);
  EXPECT_EQ(Status(StatusCode::kInternal, ""), Status(StatusCode::kInternal, std::string()));
  EXPECT_EQ(Status(StatusCode::kInternal, "").message(), "");
  EXPECT_NE(Status(StatusCode::kInternal, ""), Status::ok());
}

TEST(Status, EveryCodeHasItsSnakeCaseName) {
  const std::pair<Status, std::string_view> cases[] = {
      {Status::invalid_argument("x"), "invalid_argument"},
      {Status::not_found("x"), "not_found"},
      {Status::already_exists("x"), "already_exists"},
      {Status::out_of_range("x"), "out_of_range"},
      {Status::timeout("x"), "timeout"},
      {Status::cancelled("x"), "cancelled"},
      {Status::unavailable("x"), "unavailable"},
      {Status::deadline_infeasible("x"), "deadline_infeasible"},
      {Status::resource_exhausted("x"), "resource_exhausted"},
      {Status::permission_denied("x"), "permission_denied"},
      {Status::internal("x"), "internal"},
  };
  for (const auto& [status, name] : cases) {
    EXPECT_EQ(to_string(status.code()), name);
    EXPECT_EQ(status.to_string(), std::string(name) + ": x");
  }
}

TEST(Status, ResultCarriesValueOrStatus) {
  auto half = [](int v) -> Result<int> {
    if (v % 2 != 0) return std::unexpected(Status::invalid_argument("half: {} is odd", v));
    return v / 2;
  };
  ASSERT_TRUE(half(4).has_value());
  EXPECT_EQ(*half(4), 2);
  const auto odd = half(3);
  ASSERT_FALSE(odd.has_value());
  EXPECT_EQ(odd.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(odd.error().message(), "half: 3 is odd");
}

TEST(StatusCodeName, EveryNameReadsBackAndOthersAreRefused) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    const auto code = static_cast<StatusCode>(c);
    EXPECT_EQ(status_code_from_string(to_string(code)), code);
  }
  EXPECT_FALSE(status_code_from_string("").has_value());
  EXPECT_FALSE(status_code_from_string("Invalid_Argument").has_value());
}

}  // namespace
}  // namespace baton
