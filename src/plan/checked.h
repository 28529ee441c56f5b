// Overflow-checked arithmetic for plan spans (private to plan/).
#pragma once

#include <cstdint>
#include <optional>

namespace baton::plan {

// The end of `count` segments of `bytes` placed `stride` apart from `base`:
// base + (count − 1)·stride + bytes, or nullopt when it passes 2^64.
inline std::optional<std::uint64_t> span_end(std::uint64_t base, std::uint64_t count, std::uint64_t stride,
                                             std::uint64_t bytes) {
  std::uint64_t steps = 0;
  std::uint64_t end = 0;
  if (count == 0) return base;
  if (__builtin_mul_overflow(count - 1, stride, &steps)) return std::nullopt;
  if (__builtin_add_overflow(base, steps, &end)) return std::nullopt;
  if (__builtin_add_overflow(end, bytes, &end)) return std::nullopt;
  return end;
}

}  // namespace baton::plan
