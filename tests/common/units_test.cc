#include "baton/common/units.h"

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(ParseSize, DecimalAndBinaryUnits) {
  EXPECT_EQ(parse_size("64KB").value(), 64'000u);
  EXPECT_EQ(parse_size("64KiB").value(), 65'536u);
  EXPECT_EQ(parse_size("1MiB").value(), 1'048'576u);
  EXPECT_EQ(parse_size("32 MB").value(), 32'000'000u);
  EXPECT_EQ(parse_size("2GiB").value(), 2'147'483'648u);
  EXPECT_EQ(parse_size("1TB").value(), 1'000'000'000'000u);
  EXPECT_EQ(parse_size("4096").value(), 4096u);
  EXPECT_EQ(parse_size("4096B").value(), 4096u);
  EXPECT_EQ(parse_size("  8 kib  ").value(), 8192u);  // case and spaces do not matter
  EXPECT_EQ(parse_size("0B").value(), 0u);
}

TEST(ParseSize, ExactDecimals) {
  EXPECT_EQ(parse_size("1.5MiB").value(), 1'572'864u);
  EXPECT_EQ(parse_size("0.5KiB").value(), 512u);
  EXPECT_EQ(parse_size("2.25 GB").value(), 2'250'000'000u);
  EXPECT_EQ(parse_size("16EiB").has_value(), false);
  EXPECT_EQ(parse_size("16383.99999999999999TiB").has_value(), false);
}

TEST(ParseSize, BadInputIsQuotedInTheError) {
  for (const char* bad : {"", "   ", "-1KB", "64XB", "KB", "1.5B", "1..5MB", "1.MB", "64 K B", ".5MiB", "0x10"}) {
    const auto r = parse_size(bad);
    ASSERT_FALSE(r.has_value()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find(fmt::format("\"{}\"", bad)), std::string::npos)
        << r.error().message();
  }
  EXPECT_NE(parse_size("64XB").error().message().find("unknown unit \"XB\""), std::string::npos);
}

TEST(ParseSize, OverflowIsOutOfRange) {
  EXPECT_EQ(parse_size("18446744073709551615").value(), 18'446'744'073'709'551'615u);
  EXPECT_EQ(parse_size("18446744073709551616").error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(parse_size("17000000TiB").error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(parse_size("99999999999999999999999999999999999999").error().code(), StatusCode::kOutOfRange);
}

TEST(ParseDuration, Units) {
  EXPECT_EQ(parse_duration("2ms").value(), 2'000'000);
  EXPECT_EQ(parse_duration("250us").value(), 250'000);
  EXPECT_EQ(parse_duration("250\xc2\xb5s").value(), 250'000);
  EXPECT_EQ(parse_duration("1.5s").value(), 1'500'000'000);
  EXPECT_EQ(parse_duration("10ns").value(), 10);
  EXPECT_EQ(parse_duration("13.3 ms").value(), 13'300'000);
  EXPECT_EQ(parse_duration("2min").value(), 120'000'000'000);
  EXPECT_EQ(parse_duration("0s").value(), 0);
}

TEST(ParseDuration, BadInputIsQuotedInTheError) {
  for (const char* bad : {"", "250", "2 parsecs", "-2ms", "1.5ns", "ms", "2m s"}) {
    const auto r = parse_duration(bad);
    ASSERT_FALSE(r.has_value()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find(fmt::format("\"{}\"", bad)), std::string::npos)
        << r.error().message();
  }
  EXPECT_NE(parse_duration("250").error().message().find("no unit"), std::string::npos);
  EXPECT_EQ(parse_duration("9999999999h").error().code(), StatusCode::kOutOfRange);
}

TEST(Format, RoundTripsThroughTheParsers) {
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(64 * 1024), "64 KiB");
  EXPECT_EQ(format_size(1536ULL << 20), "1.50 GiB");
  EXPECT_EQ(parse_size(format_size(64 * 1024)).value(), 64u * 1024);
  EXPECT_EQ(format_duration(250'000), "250 us");
  EXPECT_EQ(format_duration(1'500'000'000), "1.5 s");
  EXPECT_EQ(parse_duration(format_duration(2'000'000)).value(), 2'000'000);
}

}  // namespace
}  // namespace baton
