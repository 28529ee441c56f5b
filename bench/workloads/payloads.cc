#include "workloads/payloads.h"

#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace baton::workloads {
namespace {

constexpr std::array<std::string_view, 3> kNames{"fp16", "padded", "text"};

void fill_fp16(std::span<std::byte> out, std::mt19937_64& rng) {
  std::normal_distribution<float> value(0.0F, 1.0F);
  for (std::size_t i = 0; i + 1 < out.size(); i += 2) {
    // float -> fp16 by truncation of the mantissa: enough for byte statistics.
    const float f = value(rng);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    const auto half = static_cast<std::uint16_t>(((bits >> 16) & 0x8000U) |
                                                 ((((bits >> 23) & 0xFFU) - 112U) << 10 & 0x7C00U) |
                                                 ((bits >> 13) & 0x3FFU));
    std::memcpy(&out[i], &half, sizeof half);
  }
}

// A block of 64 KiB: two 16 KiB pages of values, two of zeros — KV blocks
// of sequences that filled half of their last, large block (paged KV with
// big blocks and short sequences).
void fill_padded(std::span<std::byte> out, std::mt19937_64& rng) {
  constexpr std::size_t kBlock = 64 << 10;
  constexpr std::size_t kFilled = 32 << 10;
  for (std::size_t at = 0; at < out.size(); at += kBlock) {
    const std::size_t block = std::min(kBlock, out.size() - at);
    const std::size_t filled = std::min(kFilled, block);
    fill_fp16(out.subspan(at, filled), rng);
    std::memset(out.data() + at + filled, 0, block - filled);
  }
}

void fill_text(std::span<std::byte> out, std::mt19937_64& rng) {
  // A vocabulary of 2000 made-up words of 2..10 letters, drawn Zipf-like.
  std::vector<std::string> words;
  std::uniform_int_distribution<int> letter('a', 'z');
  std::uniform_int_distribution<int> length(2, 10);
  for (int i = 0; i < 2000; ++i) {
    std::string w(static_cast<std::size_t>(length(rng)), ' ');
    for (char& c : w) c = static_cast<char>(letter(rng));
    words.push_back(std::move(w));
  }
  std::vector<double> weights;
  for (std::size_t i = 0; i < words.size(); ++i) weights.push_back(1.0 / static_cast<double>(i + 1));
  std::discrete_distribution<std::size_t> pick(weights.begin(), weights.end());
  std::uniform_int_distribution<int> punct(0, 11);
  std::size_t at = 0;
  while (at < out.size()) {
    std::string piece = words[pick(rng)];
    const int p = punct(rng);
    piece += p == 0 ? ". " : p == 1 ? ", " : p == 2 ? "\n" : " ";
    const std::size_t n = std::min(piece.size(), out.size() - at);
    std::memcpy(out.data() + at, piece.data(), n);
    at += n;
  }
}

}  // namespace

std::string_view to_string(PayloadKind kind) { return kNames[static_cast<int>(kind)]; }

Result<PayloadKind> parse_payload_kind(std::string_view name) {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<PayloadKind>(i);
  }
  return std::unexpected(
      Status::invalid_argument("unknown data kind \"{}\" (expected fp16, padded or text)", name));
}

void fill_payload(PayloadKind kind, std::span<std::byte> out, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  switch (kind) {
    case PayloadKind::kFp16Kv: fill_fp16(out, rng); break;
    case PayloadKind::kPaddedKv: fill_padded(out, rng); break;
    case PayloadKind::kText: fill_text(out, rng); break;
  }
}

}  // namespace baton::workloads
