#include "baton/engine/pattern.h"

namespace baton::engine {

void fill_pattern(std::span<std::byte> out, std::uint64_t salt, std::uint64_t first_index) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = pattern_byte(salt, first_index + i);
}

std::optional<std::size_t> pattern_mismatch(std::span<const std::byte> bytes, std::uint64_t salt,
                                            std::uint64_t first_index) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != pattern_byte(salt, first_index + i)) return i;
  }
  return std::nullopt;
}

}  // namespace baton::engine
