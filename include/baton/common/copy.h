// The byte copy of a same-host transfer: std::memcpy's contract (ranges that
// do not overlap) at memcpy's speed whatever the two addresses' alignment to
// each other.
//
// Why not std::memcpy alone: glibc copies 2 KiB .. a few MiB with `rep movsb`,
// and on AMD EPYC (this project's machines, glibc 2.36) that instruction runs
// at a fifth of its speed when the destination sits 8..24 bytes past the
// source modulo 64: 2.0-2.8 GB/s against 10-20 for a 4-256 KiB copy
// (BM_Memcpy in bench/copy_bench.cc). A buffer
// from malloc (16 bytes past a page, as std::vector's and numpy's large
// arrays are) against a page-aligned peer region is exactly that case, and
// it made reads through the loop 5x slower (docs/results.md, "Misaligned
// copies"). Such copies go through a vector loop with aligned stores here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace baton {
namespace detail {
// Below this glibc copies with vector moves, at full speed already; from the
// upper bound on it streams with non-temporal stores, which mind no alignment.
inline constexpr std::size_t kLoopCopyFrom = 2048;
inline constexpr std::size_t kLoopCopyBelow = std::size_t{4} << 20;
// n >= 16 (the head it copies to align the stores); copy_bytes calls it
// from kLoopCopyFrom on.
void copy_loop(void* to, const void* from, std::size_t n) noexcept;
}  // namespace detail

inline void copy_bytes(void* to, const void* from, std::size_t n) noexcept {
#if defined(__x86_64__)
  const auto apart = reinterpret_cast<std::uintptr_t>(to) - reinterpret_cast<std::uintptr_t>(from);
  if (n >= detail::kLoopCopyFrom && n < detail::kLoopCopyBelow && (apart & 63) != 0) {
    detail::copy_loop(to, from, n);
    return;
  }
#endif
  std::memcpy(to, from, n);
}

}  // namespace baton
