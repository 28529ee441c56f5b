// A checkable byte pattern for buffers that cross engines: byte i of a
// buffer is a function of (salt, i), so a reader can tell which bytes
// landed where without a copy of the source. `baton serve` fills its buffer
// with it; `baton bench throughput`, the demo and the tests verify it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace baton::engine {

[[nodiscard]] constexpr std::byte pattern_byte(std::uint64_t salt, std::uint64_t index) {
  std::uint64_t x = (index + salt * 0x9e3779b97f4a7c15ULL) * 0xbf58476d1ce4e5b9ULL;
  return static_cast<std::byte>((x >> 29) ^ (x >> 47));
}

// Writes pattern bytes first_index, first_index + 1, … into `out`.
void fill_pattern(std::span<std::byte> out, std::uint64_t salt, std::uint64_t first_index = 0);

// The offset into `bytes` of the first byte that differs from the pattern
// starting at first_index; nullopt when all match.
[[nodiscard]] std::optional<std::size_t> pattern_mismatch(std::span<const std::byte> bytes, std::uint64_t salt,
                                                          std::uint64_t first_index = 0);

}  // namespace baton::engine
