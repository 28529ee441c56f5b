#include "baton/common/copy.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace baton {
namespace {

// Every byte of the range copied, none around it touched, for each
// alignment of either end within 64 bytes and sizes on both sides of where
// the vector loop starts and ends.
TEST(CopyBytes, CopiesExactlyTheRangeForEveryAlignmentAndSize) {
  constexpr std::size_t kGuard = 64;
  const std::vector<std::size_t> sizes = {0,    1,    15,   16,   17,   63,   64,   65,   2047,
                                          2048, 2049, 2111, 4096, 4099, 65536 + 7, detail::kLoopCopyBelow - 1,
                                          detail::kLoopCopyBelow, detail::kLoopCopyBelow + 5};
  std::vector<std::byte> from(detail::kLoopCopyBelow + 2 * kGuard + 128);
  for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<std::byte>(i * 131 + (i >> 8));
  for (std::size_t n : sizes) {
    std::vector<std::byte> to(n + 2 * kGuard + 64);
    for (std::size_t src_off : {0, 8, 16, 31, 48}) {
      for (std::size_t dst_off = 0; dst_off < 64; dst_off += n > 100'000 ? 8 : 1) {
        std::fill(to.begin(), to.end(), std::byte{0xEE});
        std::byte* d = to.data() + kGuard + dst_off;
        copy_bytes(d, from.data() + src_off, n);
        ASSERT_EQ(std::memcmp(d, from.data() + src_off, n), 0) << n << " bytes, from +" << src_off << " to +" << dst_off;
        for (const std::byte* p = to.data(); p < d; ++p) ASSERT_EQ(*p, std::byte{0xEE}) << "written before the range";
        for (const std::byte* p = d + n; p < to.data() + to.size(); ++p) {
          ASSERT_EQ(*p, std::byte{0xEE}) << "written past the range: " << n << " bytes, to +" << dst_off;
        }
      }
    }
  }
}

}  // namespace
}  // namespace baton
