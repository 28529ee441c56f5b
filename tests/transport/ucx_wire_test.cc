// The handshake's wire form: round trips, and every malformed message a peer
// could send is refused with a Status (never a crash or a huge allocation).
#include "transport/ucx/wire.h"

#include <gtest/gtest.h>

#include "transport/ucx/buffer_pool.h"

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
  // The third is staged (no rkey, no memfd): reached by messages only.
  const std::vector<RegionDescriptor> regions{
      {1, 0x1000, 4096, {{1, 2, 3}}}, {9, 0x7f0000, 1 << 20, {{4}, {5, 6}}}, {12, 0x9000, 100, {}}};
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
  EXPECT_FALSE(decode_regions(encode_regions({{1, 0x1000, 4096, {}, 5, 77}})).has_value());  // staged, with a memfd
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

TEST(UcxWire, SliceRoundTripsIntoAReusedBuffer) {
  const SliceDescriptor d{9, WireCodec::kRaw, 0, 0x1000, 5};
  const std::vector<std::uint8_t> data{1, 2, 3, 4, 5};
  std::vector<std::uint8_t> reuse(4096, 0xee);
  const auto* memory = reuse.data();
  const auto bytes = encode_slice(d, data, std::move(reuse));
  EXPECT_EQ(bytes.data(), memory);  // written where the old buffer was, nothing of it left
  ASSERT_EQ(bytes.size(), kSliceDescriptorBytes + data.size());
  std::size_t at = 0;
  auto back = decode_slice(bytes, at);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  EXPECT_EQ(back->key, 9u);
  EXPECT_EQ(back->addr, 0x1000u);
  EXPECT_EQ(back->payload_len, 5u);
  EXPECT_EQ(std::vector<std::uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end()), data);
  // A truncated descriptor is refused, not read past.
  EXPECT_FALSE(decode_slice(std::span(bytes).first(kSliceDescriptorBytes - 1), at).has_value());
}

TEST(UcxWire, BundlesRoundTripEveryEntry) {
  const std::vector<std::uint8_t> data{1, 2, 3, 4, 5};
  const std::string why = "region 3 is not exported to x";
  auto bundle = begin_bundle();
  EXPECT_EQ(bundle_entries(bundle), 0u);
  add_to_bundle(bundle, MessageKind::kWriteData, 7, {9, WireCodec::kRaw, 0, 0x1000, 5}, data);
  add_to_bundle(bundle, MessageKind::kReadAsk, 8, {9, WireCodec::kRaw, 0, 0x2000, 4096}, {});
  add_to_bundle(bundle, MessageKind::kReadData, 1ull << 40, {3, WireCodec::kRaw, 1, 0x10, 1},
                std::span(reinterpret_cast<const std::uint8_t*>(why.data()), why.size()));
  EXPECT_EQ(bundle_entries(bundle), 3u);
  EXPECT_EQ(bundle.size(), 4 + 3 * kBundleEntryBytes + data.size() + why.size());
  auto back = decode_bundle(bundle);
  ASSERT_TRUE(back.has_value()) << back.error().to_string();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[0].kind, MessageKind::kWriteData);
  EXPECT_EQ((*back)[0].seq, 7u);
  EXPECT_EQ((*back)[0].descriptor.addr, 0x1000u);
  EXPECT_EQ(std::vector<std::uint8_t>((*back)[0].data.begin(), (*back)[0].data.end()), data);
  EXPECT_EQ((*back)[1].kind, MessageKind::kReadAsk);
  EXPECT_EQ((*back)[1].descriptor.payload_len, 4096u);
  EXPECT_TRUE((*back)[1].data.empty());
  EXPECT_EQ((*back)[2].seq, 1ull << 40);
  EXPECT_EQ((*back)[2].descriptor.failed, 1);
  EXPECT_EQ(std::string((*back)[2].data.begin(), (*back)[2].data.end()), why);
  // Reused memory: a new bundle starts empty in it.
  const auto* memory = bundle.data();
  auto again = begin_bundle(std::move(bundle));
  EXPECT_EQ(again.data(), memory);
  EXPECT_EQ(bundle_entries(again), 0u);
}

TEST(UcxWire, MalformedBundlesAreRefused) {
  auto good = begin_bundle();
  add_to_bundle(good, MessageKind::kWriteData, 7, {9, WireCodec::kRaw, 0, 0x1000, 3}, std::vector<std::uint8_t>{1, 2, 3});
  ASSERT_TRUE(decode_bundle(good).has_value());
  auto refused = [](std::vector<std::uint8_t> bytes) {
    auto r = decode_bundle(bytes);
    return !r.has_value() && r.error().code() == StatusCode::kInvalidArgument && !r.error().message().empty();
  };
  EXPECT_TRUE(refused({}));                          // no count
  EXPECT_TRUE(refused(begin_bundle()));              // no entries
  EXPECT_TRUE(refused({good.begin(), good.end() - 1}));  // data cut short
  auto trailing = good;
  trailing.push_back(0);
  EXPECT_TRUE(refused(trailing));
  auto more = good;
  more[0] = 2;  // claims a second entry that is not there
  EXPECT_TRUE(refused(more));
  auto huge = good;
  huge[0] = 0xff;
  huge[1] = 0xff;  // 65 535 entries: over the bound, refused before reading them
  EXPECT_TRUE(refused(huge));
  auto kind = good;
  kind[4] = 4;  // not a slice message
  EXPECT_TRUE(refused(kind));
  kind[4] = 11;
  EXPECT_TRUE(refused(kind));
  auto length = good;
  length[4 + 9] = 0xff;  // data bytes beyond the message
  EXPECT_TRUE(refused(length));
  auto codec = good;
  codec[4 + 13 + 4] = 9;  // unknown codec in the descriptor
  EXPECT_TRUE(refused(codec));
}

TEST(UcxBufferPool, ReusesLargeBuffersWithinItsBound) {
  BufferPool pool(3 * BufferPool::kMinKept);
  auto a = pool.take(BufferPool::kMinKept);
  ASSERT_GE(a.capacity(), BufferPool::kMinKept);
  EXPECT_TRUE(a.empty());
  a.assign(100, 7);
  const auto* memory = a.data();
  pool.give(std::move(a));
  EXPECT_EQ(pool.kept_bytes(), BufferPool::kMinKept);
  // Small requests do not take a large buffer: malloc serves them.
  auto small = pool.take(16);
  EXPECT_NE(small.data(), memory);
  EXPECT_EQ(pool.kept_bytes(), BufferPool::kMinKept);
  // A large one gets the kept buffer back, empty.
  auto again = pool.take(BufferPool::kMinKept);
  EXPECT_TRUE(again.empty());
  EXPECT_EQ(again.data(), memory);
  EXPECT_EQ(pool.kept_bytes(), 0u);
  // One too small for the request is not handed out.
  pool.give(std::move(again));
  auto bigger = pool.take(2 * BufferPool::kMinKept);
  EXPECT_GE(bigger.capacity(), 2 * BufferPool::kMinKept);
  EXPECT_EQ(pool.kept_bytes(), BufferPool::kMinKept);
  // Past the bound, and below kMinKept, buffers go back to malloc.
  pool.give(std::move(bigger));
  EXPECT_EQ(pool.kept_bytes(), 3 * BufferPool::kMinKept);
  pool.give(pool.take(BufferPool::kMinKept * 2));  // would be 4 x: dropped
  EXPECT_LE(pool.kept_bytes(), 3 * BufferPool::kMinKept);
  std::vector<std::uint8_t> tiny;
  tiny.reserve(1024);
  const std::size_t before = pool.kept_bytes();
  pool.give(std::move(tiny));
  EXPECT_EQ(pool.kept_bytes(), before);
}

}  // namespace
}  // namespace baton::transport::ucx
