// UTF-8 as RFC 3629 defines it, for text that must be UTF-8 on its way out
// (a policy file for yaml-cpp, a name in a protobuf string field).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace baton {

// The byte length (1..4) of the UTF-8 sequence that starts at text[at], or
// 0 where none does: a stray continuation byte, an overlong form, a
// surrogate, a code point above U+10FFFF, or a sequence cut short.
[[nodiscard]] inline std::size_t utf8_sequence_length(std::string_view text, std::size_t at) {
  const auto u = static_cast<unsigned char>(text[at]);
  if (u < 0x80) return 1;
  const std::size_t extra = u >= 0xf0 && u <= 0xf4 ? 3 : u >= 0xe0 && u <= 0xef ? 2 : u >= 0xc2 && u <= 0xdf ? 1 : 0;
  if (extra == 0 || at + extra >= text.size()) return 0;
  for (std::size_t k = 1; k <= extra; ++k) {
    if ((static_cast<unsigned char>(text[at + k]) & 0xc0) != 0x80) return 0;
  }
  const auto b1 = static_cast<unsigned char>(text[at + 1]);
  if ((u == 0xe0 && b1 < 0xa0) || (u == 0xed && b1 >= 0xa0)) return 0;  // overlong; a surrogate
  if ((u == 0xf0 && b1 < 0x90) || (u == 0xf4 && b1 >= 0x90)) return 0;  // overlong; above U+10FFFF
  return extra + 1;
}

// Where `text` stops being UTF-8, if it does.
[[nodiscard]] inline std::optional<std::size_t> first_non_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence_length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

}  // namespace baton
