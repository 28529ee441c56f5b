#include "baton/transport/codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace baton::transport {
namespace {

using Bytes = std::vector<std::byte>;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;

// IEEE binary16 bits of `f` (truncating the mantissa; values too small for a
// normal half become zero — rare for N(0, 1), and irrelevant to a codec test).
std::uint16_t to_half_bits(float f) {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127 + 15;
  if (exponent <= 0) return sign;
  if (exponent >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  return static_cast<std::uint16_t>(sign | (exponent << 10) | ((bits >> 13) & 0x3ffu));
}

// What a KV cache slice looks like: fp16 activations, roughly N(0, 1). Its
// exponent bits repeat a little, its mantissas not at all.
Bytes kv_fp16(std::size_t bytes, std::uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Bytes out(bytes);
  for (std::size_t i = 0; i + 1 < bytes; i += 2) {
    const std::uint16_t h = to_half_bits(normal(rng));
    std::memcpy(&out[i], &h, sizeof h);
  }
  if (bytes % 2 == 1) out.back() = std::byte{0x3c};
  return out;
}

Bytes random_bytes(std::size_t bytes, std::uint64_t seed = 2) {
  std::mt19937_64 rng(seed);
  Bytes out(bytes);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

Bytes zeros(std::size_t bytes) { return Bytes(bytes, std::byte{0}); }

// One random 4 KiB page, repeated: a prefix shared by many sequences.
Bytes repeated_page(std::size_t bytes) {
  const Bytes page = random_bytes(4 * kKiB, 3);
  Bytes out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = page[i % page.size()];
  return out;
}

std::unique_ptr<Codec> codec_for(std::string_view spec) {
  auto c = make_codec(spec);
  EXPECT_TRUE(c.has_value()) << spec;
  return std::move(c).value();
}

// Compresses and, when the codec shrank the data, decompresses and compares
// byte for byte. Returns whether the codec compressed.
bool round_trip(const Codec& codec, const Bytes& raw) {
  Bytes packed{std::byte{0xaa}, std::byte{0xbb}};  // stale bytes must go
  const Result<bool> shrunk = codec.compress(raw, packed);
  EXPECT_TRUE(shrunk.has_value()) << shrunk.error().to_string();
  if (!shrunk.value_or(false)) {
    EXPECT_TRUE(packed.empty()) << codec.name() << " left " << packed.size() << " bytes";
    return false;
  }
  EXPECT_LT(packed.size(), raw.size());
  Bytes back(raw.size(), std::byte{0x5a});
  const Status s = codec.decompress(packed, back);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(back == raw) << codec.name() << ": round trip of " << raw.size()
                           << " bytes differs";
  return true;
}

class CodecTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Codec> codec_ = codec_for(GetParam());
};

INSTANTIATE_TEST_SUITE_P(Codecs, CodecTest, ::testing::Values("lz4", "zstd", "zstd:6"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == ':') c = '_';
                           }
                           return name;
                         });

TEST_P(CodecTest, RoundTripsKvFp16) {
  for (std::size_t bytes : {std::size_t{2}, 4 * kKiB, 64 * kKiB + 6, 4 * kMiB}) {
    SCOPED_TRACE(bytes);
    const Bytes raw = kv_fp16(bytes);
    Bytes packed;
    round_trip(*codec_, raw);
    // Realistic KV barely compresses: that is why compression only pays on
    // slow paths.
    if (codec_->compress(raw, packed).value()) {
      EXPECT_GT(static_cast<double>(packed.size()), 0.6 * static_cast<double>(bytes));
    }
  }
}

TEST_P(CodecTest, RoundTripsZerosAndRepeatedPages) {
  for (std::size_t bytes : {4 * kKiB, 64 * kKiB + 3, 4 * kMiB}) {
    SCOPED_TRACE(bytes);
    EXPECT_TRUE(round_trip(*codec_, zeros(bytes)));
    EXPECT_TRUE(round_trip(*codec_, repeated_page(bytes + 4 * kKiB)));
  }
}

TEST_P(CodecTest, OneByteIsNotCompressed) {
  EXPECT_FALSE(round_trip(*codec_, Bytes{std::byte{7}}));
}

TEST_P(CodecTest, EmptyInputIsNotCompressed) {
  Bytes packed{std::byte{1}};
  const Result<bool> shrunk = codec_->compress({}, packed);
  ASSERT_TRUE(shrunk.has_value());
  EXPECT_FALSE(*shrunk);
  EXPECT_TRUE(packed.empty());
}

TEST_P(CodecTest, NeverLargerThanRaw) {
  for (std::size_t bytes : {std::size_t{16}, std::size_t{255}, 64 * kKiB, 4 * kMiB}) {
    SCOPED_TRACE(bytes);
    Bytes packed(3, std::byte{9});
    const Result<bool> shrunk = codec_->compress(random_bytes(bytes), packed);
    ASSERT_TRUE(shrunk.has_value());
    EXPECT_FALSE(*shrunk);
    EXPECT_TRUE(packed.empty());
  }
}

TEST_P(CodecTest, RejectsCorruptInput) {
  const Bytes raw = repeated_page(64 * kKiB);
  Bytes packed;
  ASSERT_TRUE(codec_->compress(raw, packed).value());
  Bytes back(raw.size());

  const Bytes truncated(packed.begin(), packed.begin() + static_cast<long>(packed.size() / 2));
  EXPECT_EQ(codec_->decompress(truncated, back).code(), StatusCode::kInvalidArgument);

  // 0xff tokens claim literal runs longer than the input (lz4) and are no
  // zstd frame magic.
  const Bytes garbage(64, std::byte{0xff});
  const Status s = codec_->decompress(garbage, back);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(codec_->name()), std::string::npos) << s.message();

  EXPECT_EQ(codec_->decompress({}, back).code(), StatusCode::kInvalidArgument);
}

TEST_P(CodecTest, RejectsWrongOutputSize) {
  const Bytes raw = zeros(64 * kKiB);
  Bytes packed;
  ASSERT_TRUE(codec_->compress(raw, packed).value());
  for (std::size_t size : {raw.size() - 1, raw.size() + 1, std::size_t{0}}) {
    SCOPED_TRACE(size);
    Bytes back(size);
    const Status s = codec_->decompress(packed, back);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  }
  Bytes exact(raw.size());
  EXPECT_TRUE(codec_->decompress(packed, exact).is_ok());
}

TEST_P(CodecTest, MeasuresZerosAsVeryCompressible) {
  const Bytes raw = zeros(1 * kMiB);
  const Result<CodecProfile> p = measure(*codec_, raw);
  ASSERT_TRUE(p.has_value()) << p.error().to_string();
  EXPECT_GT(p->ratio, 10.0);
  EXPECT_GT(p->compress_gbps, 0.0);
  EXPECT_GT(p->decompress_gbps, 0.0);
  EXPECT_TRUE(std::isfinite(p->decompress_gbps));
}

TEST_P(CodecTest, MeasuresRandomBytesAsRatioOne) {
  const Bytes raw = random_bytes(256 * kKiB);
  const Result<CodecProfile> p = measure(*codec_, raw, 2);
  ASSERT_TRUE(p.has_value()) << p.error().to_string();
  EXPECT_EQ(p->ratio, 1.0);
  // Nothing to gain: never worth it, whatever the path.
  for (double path_gbps : {0.01, 0.5, 24.0, 400.0}) {
    EXPECT_GT(compressed_seconds(raw.size(), path_gbps, *p),
              raw_seconds(raw.size(), path_gbps));
  }
}

TEST_P(CodecTest, MeasureRejectsBadArguments) {
  EXPECT_EQ(measure(*codec_, {}).error().code(), StatusCode::kInvalidArgument);
  const Bytes raw = zeros(kKiB);
  EXPECT_EQ(measure(*codec_, raw, 0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(measure(*codec_, raw, -1).error().code(), StatusCode::kInvalidArgument);
}

// A codec that loses data, so measure() must notice.
class LossyCodec final : public Codec {
 public:
  explicit LossyCodec(bool fail_decompress) : fail_decompress_(fail_decompress) {}
  std::string_view name() const override { return "lossy"; }
  Result<bool> compress(std::span<const std::byte> in,
                        std::vector<std::byte>& out) const override {
    out.assign(in.begin(), in.begin() + static_cast<long>(in.size() / 2));
    return true;
  }
  Status decompress(std::span<const std::byte>, std::span<std::byte> out) const override {
    if (fail_decompress_) return Status::invalid_argument("lossy: corrupt");
    for (auto& b : out) b = std::byte{1};
    return Status::ok();
  }

 private:
  bool fail_decompress_;
};

TEST(Measure, ReportsABrokenRoundTripAsInternal) {
  const Bytes raw = random_bytes(kKiB);
  EXPECT_EQ(measure(LossyCodec(false), raw).error().code(), StatusCode::kInternal);
  EXPECT_EQ(measure(LossyCodec(true), raw).error().code(), StatusCode::kInternal);
}

TEST(MakeCodec, AcceptsKnownSpecs) {
  EXPECT_EQ(make_codec("lz4").value()->name(), "lz4");
  EXPECT_EQ(make_codec("zstd").value()->name(), "zstd");
  EXPECT_EQ(make_codec("zstd:1").value()->name(), "zstd");
  EXPECT_EQ(make_codec("zstd:19").value()->name(), "zstd");
  EXPECT_EQ(make_lz4_codec()->name(), "lz4");
  EXPECT_TRUE(make_zstd_codec(19).has_value());
}

TEST(MakeCodec, RejectsBadSpecsQuotingThem) {
  for (std::string_view spec : {"", "gzip", "zstd:0", "zstd:20", "zstd:x", "zstd:",
                                "zstd:3x", "zstd:-1", "LZ4", " lz4", "lz4:1"}) {
    SCOPED_TRACE(spec);
    const auto c = make_codec(spec);
    ASSERT_FALSE(c.has_value());
    EXPECT_EQ(c.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find(fmt::format("\"{}\"", spec)), std::string::npos)
        << c.error().message();
  }
  EXPECT_EQ(make_zstd_codec(0).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_zstd_codec(20).error().code(), StatusCode::kInvalidArgument);
}

TEST(PathCost, CompressionPaysOnlyOnSlowPaths) {
  const CodecProfile profile{.ratio = 4.0, .compress_gbps = 2.0, .decompress_gbps = 4.0};
  constexpr std::uint64_t kBytes = 1'000'000'000;
  // 0.5 s compress + 0.25 GB at 0.5 GB/s + 0.25 s decompress = 1.25 s < 2 s raw.
  EXPECT_DOUBLE_EQ(raw_seconds(kBytes, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(compressed_seconds(kBytes, 0.5, profile), 1.25);
  EXPECT_LT(compressed_seconds(kBytes, 0.5, profile), raw_seconds(kBytes, 0.5));
  // On a 24 GB/s path the codec's own time alone exceeds the raw transfer.
  EXPECT_GT(compressed_seconds(kBytes, 24.0, profile), raw_seconds(kBytes, 24.0));
  // The decision does not depend on the size: costs are linear in bytes.
  EXPECT_LT(compressed_seconds(64 * kMiB, 0.5, profile), raw_seconds(64 * kMiB, 0.5));
  EXPECT_GT(compressed_seconds(64 * kMiB, 24.0, profile), raw_seconds(64 * kMiB, 24.0));
}

TEST(PathCost, UnusablePathsCostForever) {
  const CodecProfile profile{.ratio = 4.0, .compress_gbps = 2.0, .decompress_gbps = 4.0};
  EXPECT_TRUE(std::isinf(raw_seconds(1, 0.0)));
  EXPECT_TRUE(std::isinf(compressed_seconds(1, 0.0, profile)));
  EXPECT_TRUE(std::isinf(compressed_seconds(1, 1.0, CodecProfile{})));  // never measured
  EXPECT_EQ(raw_seconds(0, 1.0), 0.0);
}

}  // namespace
}  // namespace baton::transport
