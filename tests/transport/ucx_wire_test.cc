// The handshake's wire form: round trips, and every malformed message a peer
// could send is refused with a Status (never a crash or a huge allocation).
#include "transport/ucx/wire.h"

#include <gtest/gtest.h>

#include "transport/ucx/socket_address.h"

namespace baton::transport::ucx {
namespace {

TEST(UcxWire, HeaderRoundTripsAndRefusesStrangers) {
  MessageHeader h{kWireMagic, kWireVersion, 1, 7, 3, 42};
  const auto bytes = encode_header(h);
  ASSERT_EQ(bytes.size(), kHeaderBytes);
  auto back = decode_header(bytes);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->path, 7u);
  EXPECT_EQ(back->lane, 3u);
  EXPECT_EQ(back->seq, 42u);
  EXPECT_EQ(back->flags, 1);

  EXPECT_FALSE(decode_header(std::span(bytes).first(kHeaderBytes - 1)).has_value());
  auto bad_magic = bytes;
  bad_magic[0] ^= 0xff;
  EXPECT_EQ(decode_header(bad_magic).error().code(), StatusCode::kInvalidArgument);
  h.version = kWireVersion + 1;
  EXPECT_NE(decode_header(encode_header(h)).error().message().find("version"), std::string::npos);
}

TEST(UcxWire, RegionsRoundTrip) {
  const std::vector<RegionDescriptor> regions{{1, 0x1000, 4096, {{1, 2, 3}}}, {9, 0x7f0000, 1 << 20, {{4}, {5, 6}}}};
  auto back = decode_regions(encode_regions(regions));
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(*back, regions);
  auto empty = decode_regions(encode_regions({}));
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->empty());
}

TEST(UcxWire, MalformedRegionListsAreRefused) {
  const auto good = encode_regions({{1, 0x1000, 4096, {{1, 2, 3}}}});
  EXPECT_FALSE(decode_regions({}).has_value());                                     // no count
  EXPECT_FALSE(decode_regions(std::span(good).first(good.size() - 1)).has_value());  // truncated rkey
  auto trailing = good;
  trailing.push_back(0);
  EXPECT_FALSE(decode_regions(trailing).has_value());
  auto huge_count = good;
  huge_count[3] = 0x7f;  // count ≈ 2^30: refused before allocating
  EXPECT_FALSE(decode_regions(huge_count).has_value());
  EXPECT_FALSE(decode_regions(encode_regions({{1, 0x1000, 0, {{1}}}})).has_value());          // empty range
  EXPECT_FALSE(decode_regions(encode_regions({{1, ~0ull - 10, 4096, {{1}}}})).has_value());  // wraps
  EXPECT_FALSE(decode_regions(encode_regions({{1, 0x1000, 4096, {}}})).has_value());         // no rkey
  EXPECT_FALSE(decode_regions(encode_regions({{1, 0x1000, 4096, {{1}, {}}}})).has_value());  // an empty one
  const std::vector<std::vector<std::uint8_t>> nine(kMaxRails + 1, {1});
  EXPECT_FALSE(decode_regions(encode_regions({{1, 0x1000, 4096, nine}})).has_value());  // more rkeys than rails
}

TEST(UcxWire, KeysRoundTripAndMalformedAreRefused) {
  auto back = decode_keys(encode_keys({3, 5}));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, (std::vector<std::uint32_t>{3, 5}));
  auto bytes = encode_keys({3, 5});
  bytes.pop_back();
  EXPECT_FALSE(decode_keys(bytes).has_value());
}

TEST(UcxSocketAddress, ParsesAndFormats) {
  auto a = parse_socket_address("127.0.0.1:4000");
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  EXPECT_EQ(format_socket_address(a->get()), "127.0.0.1:4000");
  EXPECT_EQ(port_of(a->get()), 4000);
  auto v6 = parse_socket_address("[::1]:0");
  ASSERT_TRUE(v6.has_value()) << v6.error().to_string();
  EXPECT_EQ(format_socket_address(v6->get()), "[::1]:0");
  for (const char* bad : {"", "127.0.0.1", ":4000", "127.0.0.1:", "127.0.0.1:xx", "127.0.0.1:65536",
                          "127.0.0.1:-1", "127.0.0.1:40 00"}) {
    auto r = parse_socket_address(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find(bad), std::string::npos) << r.error().message();
  }
}

}  // namespace
}  // namespace baton::transport::ucx
