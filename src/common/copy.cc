#include "baton/common/copy.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace baton::detail {

// SSE2, which every x86-64 has: 16-byte unaligned loads, aligned stores, 64
// bytes a turn. As fast as an aligned memcpy here at 4 KiB .. 1 MiB, within
// the runs' spread (bench/copy_bench.cc), where `rep movsb` reached a fifth
// of it.
void copy_loop(void* to, const void* from, std::size_t n) noexcept {
#if defined(__x86_64__)
  auto* d = static_cast<std::byte*>(to);
  const auto* s = static_cast<const std::byte*>(from);
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_store_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_store_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_store_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_store_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);
#else
  std::memcpy(to, from, n);
#endif
}

}  // namespace baton::detail
