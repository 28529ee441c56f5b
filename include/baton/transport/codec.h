// Lossless codecs for degrading a transfer that would otherwise miss its
// deadline: fewer bytes on a slow path, at the price of CPU time on both
// ends. Admission decides when (CodecProfile: does it pay); a transport that
// carries compressed slices runs them on both ends. A compressed slice is never larger than the raw one: when the codec
// cannot shrink it, compress() says so and the raw bytes travel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "baton/common/status.h"

namespace baton::transport {

class Codec {
 public:
  virtual ~Codec() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;  // "lz4", "zstd"

  // Compresses `in` into `out` (resized to the compressed size). Returns
  // false (and leaves `out` empty) when the result would not be smaller than
  // `in`: send the raw bytes then. Errors only for codec failures.
  [[nodiscard]] virtual Result<bool> compress(std::span<const std::byte> in, std::vector<std::byte>& out) const = 0;

  // Decompresses `in` into exactly `out.size()` bytes (the raw size travels
  // with the slice). invalid_argument for corrupt input or a size mismatch.
  [[nodiscard]] virtual Status decompress(std::span<const std::byte> in, std::span<std::byte> out) const = 0;
};

// LZ4 (fast) and Zstandard at `level` (1..19; 1 is the fast default).
[[nodiscard]] std::unique_ptr<Codec> make_lz4_codec();
[[nodiscard]] Result<std::unique_ptr<Codec>> make_zstd_codec(int level = 1);
// "lz4", "zstd", "zstd:3" → a codec; invalid_argument naming the text otherwise.
[[nodiscard]] Result<std::unique_ptr<Codec>> make_codec(std::string_view spec);

// How a codec behaves on some data: measured by running it, so admission can
// decide whether compression pays on a given path.
struct CodecProfile {
  double ratio = 1.0;             // raw bytes / compressed bytes (>= 1)
  double compress_gbps = 0.0;     // raw GB/s through compress()
  double decompress_gbps = 0.0;   // raw GB/s through decompress(); +inf when
                                  // the codec refused (ratio 1: nothing to undo)
};

// Runs the codec on `sample` (round trip checked byte for byte) and times it
// with the steady clock. invalid_argument for an empty sample; internal if the
// round trip does not reproduce the sample.
[[nodiscard]] Result<CodecProfile> measure(const Codec& codec, std::span<const std::byte> sample, int repeats = 3);

// Seconds to move `bytes` raw on a path of `path_gbps`, versus compressed with
// `profile` (compress, send fewer bytes, decompress, one after the other: the
// conservative, unpipelined cost). Compression pays when the second is smaller.
[[nodiscard]] double raw_seconds(std::uint64_t bytes, double path_gbps);
[[nodiscard]] double compressed_seconds(std::uint64_t bytes, double path_gbps, const CodecProfile& profile);

}  // namespace baton::transport
