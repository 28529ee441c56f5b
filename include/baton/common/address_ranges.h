// Registered memory ranges [base, base + length) kept in a std::map keyed by
// base, as each transport keeps its regions: the one that holds a span, and
// the one a new range would overlap. The mapped type has a `length`.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>

namespace baton {

// The range holding [addr, addr + bytes), or null.
template <typename T>
T* find_containing(std::map<std::uint64_t, T>& ranges, std::uint64_t addr, std::uint64_t bytes) {
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return nullptr;
  --it;
  const std::uint64_t offset = addr - it->first;
  if (offset >= it->second.length || bytes > it->second.length - offset) return nullptr;
  return &it->second;
}

// Whether [a, a + bytes) and [b, b + bytes) share a byte: a copy between
// them in slices, or on threads, reads bytes it already wrote.
inline bool ranges_overlap(std::uint64_t a, std::uint64_t b, std::uint64_t bytes) {
  return bytes != 0 && (a < b ? b - a < bytes : a - b < bytes);
}

// A range that [base, base + length) overlaps, or null.
template <typename T>
const T* find_overlapping(const std::map<std::uint64_t, T>& ranges, std::uint64_t base, std::uint64_t length) {
  auto next = ranges.lower_bound(base);
  if (next != ranges.begin() && std::prev(next)->first + std::prev(next)->second.length > base) {
    return &std::prev(next)->second;
  }
  if (next != ranges.end() && next->first < base + length) return &next->second;
  return nullptr;
}

}  // namespace baton
