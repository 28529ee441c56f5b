// Synthetic payloads with the byte statistics of what Baton moves, for the
// benchmarks that compress: a codec's worth depends on the data, so each
// bench names the kind it ran on. Pure functions of the seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "baton/common/status.h"

namespace baton::workloads {

enum class PayloadKind : std::uint8_t {
  kFp16Kv,    // attention keys and values: fp16 of a unit normal (lz4 cannot shrink it)
  kPaddedKv,  // KV blocks half zero padding: each 64 KiB block has two pages of values, two of zeros
  kText,      // text-like bytes: words from a Zipf vocabulary (prompts, logs, JSON)
};
[[nodiscard]] std::string_view to_string(PayloadKind kind);
[[nodiscard]] Result<PayloadKind> parse_payload_kind(std::string_view name);

void fill_payload(PayloadKind kind, std::span<std::byte> out, std::uint64_t seed);

}  // namespace baton::workloads
