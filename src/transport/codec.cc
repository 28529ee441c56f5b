#include "baton/transport/codec.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <limits>
#include <string>

#include <lz4.h>
#include <zstd.h>

namespace baton::transport {
namespace {

constexpr int kMinZstdLevel = 1;
constexpr int kMaxZstdLevel = 19;  // 20..22 are "ultra" levels: too slow for a deadline

// Both libraries take the output buffer as a pointer even when it is empty;
// hand them a real one so a zero-length span never becomes a null write target.
std::byte* writable(std::span<std::byte> out) {
  static thread_local std::byte scratch;
  return out.empty() ? &scratch : out.data();
}

// Keeps `out` only when strictly smaller than the input (the header's promise).
bool keep_if_smaller(std::vector<std::byte>& out, std::size_t compressed,
                     std::size_t raw) {
  if (compressed >= raw) {
    out.clear();
    return false;
  }
  out.resize(compressed);
  return true;
}

class Lz4Codec final : public Codec {
 public:
  std::string_view name() const override { return "lz4"; }

  Result<bool> compress(std::span<const std::byte> in,
                        std::vector<std::byte>& out) const override {
    out.clear();
    if (in.empty()) return false;  // nothing to shrink
    if (in.size() > static_cast<std::size_t>(LZ4_MAX_INPUT_SIZE)) {
      return std::unexpected(Status::invalid_argument(
          "lz4 compress: {} bytes is above LZ4's limit of {} bytes", in.size(),
          LZ4_MAX_INPUT_SIZE));
    }
    const int raw = static_cast<int>(in.size());
    out.resize(static_cast<std::size_t>(LZ4_compressBound(raw)));
    const int written = LZ4_compress_default(
        reinterpret_cast<const char*>(in.data()),
        reinterpret_cast<char*>(out.data()), raw, static_cast<int>(out.size()));
    if (written <= 0) {
      out.clear();
      return std::unexpected(Status::internal(
          "lz4 compress: LZ4_compress_default failed on {} bytes", in.size()));
    }
    return keep_if_smaller(out, static_cast<std::size_t>(written), in.size());
  }

  Status decompress(std::span<const std::byte> in,
                    std::span<std::byte> out) const override {
    if (in.empty()) {
      return Status::invalid_argument(
          "lz4 decompress: no compressed bytes (expected {} raw bytes)", out.size());
    }
    if (in.size() > INT_MAX || out.size() > INT_MAX) {
      return Status::invalid_argument(
          "lz4 decompress: {} compressed / {} raw bytes is above LZ4's int limit",
          in.size(), out.size());
    }
    const int got = LZ4_decompress_safe(
        reinterpret_cast<const char*>(in.data()),
        reinterpret_cast<char*>(writable(out)), static_cast<int>(in.size()),
        static_cast<int>(out.size()));
    if (got < 0) {
      return Status::invalid_argument(
          "lz4 decompress: {} bytes are corrupt or decompress to more than {} bytes",
          in.size(), out.size());
    }
    if (static_cast<std::size_t>(got) != out.size()) {
      return Status::invalid_argument(
          "lz4 decompress: {} bytes decompress to {} bytes, expected {}", in.size(),
          got, out.size());
    }
    return Status::ok();
  }
};

class ZstdCodec final : public Codec {
 public:
  explicit ZstdCodec(int level) : level_(level) {}

  std::string_view name() const override { return "zstd"; }

  Result<bool> compress(std::span<const std::byte> in,
                        std::vector<std::byte>& out) const override {
    out.clear();
    if (in.empty()) return false;
    const std::size_t bound = ZSTD_compressBound(in.size());
    if (ZSTD_isError(bound)) {
      return std::unexpected(Status::invalid_argument(
          "zstd compress: {} bytes is above zstd's limit", in.size()));
    }
    out.resize(bound);
    const std::size_t written =
        ZSTD_compress(out.data(), out.size(), in.data(), in.size(), level_);
    if (ZSTD_isError(written)) {
      out.clear();
      return std::unexpected(Status::internal(
          "zstd compress: level {} on {} bytes failed: {}", level_, in.size(),
          ZSTD_getErrorName(written)));
    }
    return keep_if_smaller(out, written, in.size());
  }

  Status decompress(std::span<const std::byte> in,
                    std::span<std::byte> out) const override {
    if (in.empty()) {
      return Status::invalid_argument(
          "zstd decompress: no compressed bytes (expected {} raw bytes)", out.size());
    }
    const std::size_t got =
        ZSTD_decompress(writable(out), out.size(), in.data(), in.size());
    if (ZSTD_isError(got)) {
      return Status::invalid_argument(
          "zstd decompress: {} bytes into {} bytes failed: {}", in.size(),
          out.size(), ZSTD_getErrorName(got));
    }
    if (got != out.size()) {
      return Status::invalid_argument(
          "zstd decompress: {} bytes decompress to {} bytes, expected {}", in.size(),
          got, out.size());
    }
    return Status::ok();
  }

 private:
  int level_;
};

using Seconds = std::chrono::duration<double>;

double gbps(std::size_t bytes, Seconds elapsed) {
  // A tiny sample can finish within one tick; count at least a nanosecond so
  // the rate stays finite.
  const double s = std::max(elapsed.count(), 1e-9);
  return static_cast<double>(bytes) / s / 1e9;
}

}  // namespace

std::unique_ptr<Codec> make_lz4_codec() { return std::make_unique<Lz4Codec>(); }

Result<std::unique_ptr<Codec>> make_zstd_codec(int level) {
  if (level < kMinZstdLevel || level > kMaxZstdLevel) {
    return std::unexpected(Status::invalid_argument(
        "make_zstd_codec: level {} is outside [{}, {}]", level, kMinZstdLevel,
        kMaxZstdLevel));
  }
  return std::make_unique<ZstdCodec>(level);
}

Result<std::unique_ptr<Codec>> make_codec(std::string_view spec) {
  if (spec == "lz4") return make_lz4_codec();
  if (spec == "zstd") return make_zstd_codec();
  constexpr std::string_view kZstdPrefix = "zstd:";
  if (spec.starts_with(kZstdPrefix)) {
    const std::string_view digits = spec.substr(kZstdPrefix.size());
    int level = 0;
    const auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), level);
    if (ec == std::errc{} && end == digits.data() + digits.size() &&
        level >= kMinZstdLevel && level <= kMaxZstdLevel) {
      return make_zstd_codec(level);
    }
    return std::unexpected(Status::invalid_argument(
        "make_codec: \"{}\" has a bad zstd level (expected an integer in [{}, {}])",
        spec, kMinZstdLevel, kMaxZstdLevel));
  }
  return std::unexpected(Status::invalid_argument(
      "make_codec: \"{}\" is not a codec (expected \"lz4\", \"zstd\" or "
      "\"zstd:<level {}..{}>\")",
      spec, kMinZstdLevel, kMaxZstdLevel));
}

Result<CodecProfile> measure(const Codec& codec, std::span<const std::byte> sample,
                             int repeats) {
  if (sample.empty()) {
    return std::unexpected(Status::invalid_argument(
        "measure: {}: the sample is empty", codec.name()));
  }
  if (repeats < 1) {
    return std::unexpected(Status::invalid_argument(
        "measure: {}: repeats = {}, expected at least 1", codec.name(), repeats));
  }
  using Clock = std::chrono::steady_clock;

  std::vector<std::byte> compressed;
  bool shrunk = false;
  auto best_compress = Seconds::max();
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    auto r = codec.compress(sample, compressed);
    const auto t1 = Clock::now();
    if (!r) return std::unexpected(r.error());
    shrunk = *r;
    best_compress = std::min<Seconds>(best_compress, t1 - t0);
  }

  CodecProfile profile;
  profile.compress_gbps = gbps(sample.size(), best_compress);
  if (!shrunk) {
    // The raw bytes travel: nothing to decompress, so the receiving side is free.
    profile.ratio = 1.0;
    profile.decompress_gbps = std::numeric_limits<double>::infinity();
    return profile;
  }
  profile.ratio =
      static_cast<double>(sample.size()) / static_cast<double>(compressed.size());

  std::vector<std::byte> restored(sample.size());
  auto best_decompress = Seconds::max();
  for (int i = 0; i < repeats; ++i) {
    std::ranges::fill(restored, std::byte{0});
    const auto t0 = Clock::now();
    const Status s = codec.decompress(compressed, restored);
    const auto t1 = Clock::now();
    if (!s.is_ok()) {
      return std::unexpected(Status::internal(
          "measure: {}: its own output does not decompress: {}", codec.name(),
          s.message()));
    }
    best_decompress = std::min<Seconds>(best_decompress, t1 - t0);
    if (std::memcmp(restored.data(), sample.data(), sample.size()) != 0) {
      return std::unexpected(Status::internal(
          "measure: {}: the round trip of {} bytes does not reproduce the sample",
          codec.name(), sample.size()));
    }
  }
  profile.decompress_gbps = gbps(sample.size(), best_decompress);
  return profile;
}

double raw_seconds(std::uint64_t bytes, double path_gbps) {
  if (!(path_gbps > 0.0)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(bytes) / (path_gbps * 1e9);
}

double compressed_seconds(std::uint64_t bytes, double path_gbps,
                          const CodecProfile& profile) {
  if (!(path_gbps > 0.0 && profile.compress_gbps > 0.0 &&
        profile.decompress_gbps > 0.0)) {
    return std::numeric_limits<double>::infinity();
  }
  // A ratio below 1 cannot happen on the wire: the raw bytes would travel.
  const double ratio = profile.ratio >= 1.0 ? profile.ratio : 1.0;
  const double raw = static_cast<double>(bytes);
  return raw / (profile.compress_gbps * 1e9) + raw / ratio / (path_gbps * 1e9) +
         raw / (profile.decompress_gbps * 1e9);
}

}  // namespace baton::transport
