#include "baton/common/units.h"

#include <array>
#include <cctype>
#include <cstdint>
#include <limits>
#include <string>

namespace baton {
namespace {

using u128 = unsigned __int128;

struct Unit {
  std::string_view name;  // compared case-insensitively
  u128 multiplier;
};

constexpr u128 kKi = 1024;
constexpr std::array<Unit, 10> kSizeUnits{{
    {"b", 1},
    {"kb", 1000},
    {"mb", 1000 * 1000},
    {"gb", u128{1000} * 1000 * 1000},
    {"tb", u128{1000} * 1000 * 1000 * 1000},
    {"kib", kKi},
    {"mib", kKi * kKi},
    {"gib", kKi * kKi * kKi},
    {"tib", kKi * kKi * kKi * kKi},
    {"", 1},  // a bare number is bytes
}};

constexpr std::array<Unit, 7> kDurationUnits{{
    {"ns", 1},
    {"us", 1000},
    {"\xc2\xb5s", 1000},  // µs
    {"ms", 1000 * 1000},
    {"s", u128{1000} * 1000 * 1000},
    {"min", u128{60} * 1000 * 1000 * 1000},
    {"h", u128{3600} * 1000 * 1000 * 1000},
}};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Parses "<digits>[.<digits>][ ]<unit>" exactly: the decimal mantissa is kept
// as an integer and a power of ten, so "1.5MiB" is computed without rounding.
template <std::size_t N>
Result<u128> parse_quantity(std::string_view call, std::string_view original,
                            const std::array<Unit, N>& units,
                            std::string_view expected_units, u128 max) {
  const std::string_view text = trim(original);
  auto fail = [&](std::string_view why) {
    return std::unexpected(Status::invalid_argument("{}: \"{}\": {}", call, original, why));
  };
  if (text.empty()) return fail("empty text");
  if (!std::isdigit(static_cast<unsigned char>(text.front()))) {
    return fail("expected a non-negative number first");
  }
  u128 mantissa = 0;
  u128 scale = 1;  // 10^(digits after the point)
  bool seen_point = false;
  std::size_t i = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.' && !seen_point) {
      seen_point = true;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    if (mantissa > std::numeric_limits<std::uint64_t>::max() || scale > u128{1} << 64) {
      return std::unexpected(Status::out_of_range("{}: \"{}\": too many digits", call, original));
    }
    mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
    if (seen_point) scale *= 10;
  }
  if (seen_point && scale == 1) return fail("a decimal point must be followed by digits");
  const std::string_view unit_text = trim(text.substr(i));
  const Unit* unit = nullptr;
  for (const Unit& u : units) {
    if (iequals(u.name, unit_text)) unit = &u;
  }
  if (unit == nullptr) {
    return fail(fmt::format("{} (expected {})",
                            unit_text.empty() ? std::string("no unit")
                                              : fmt::format("unknown unit \"{}\"", unit_text),
                            expected_units));
  }
  const u128 scaled = mantissa * unit->multiplier;  // < 2^64 · 2^42: no overflow
  if (scaled % scale != 0) return fail("not a whole number of the base unit");
  const u128 value = scaled / scale;
  if (value > max) {
    return std::unexpected(Status::out_of_range("{}: \"{}\": too large", call, original));
  }
  return value;
}

std::string format_scaled(double value, std::string_view unit) {
  return fmt::format("{:g} {}", value, unit);
}

}  // namespace

Result<std::uint64_t> parse_size(std::string_view text) {
  auto v = parse_quantity("parse_size", text, kSizeUnits,
                          "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB",
                          std::numeric_limits<std::uint64_t>::max());
  if (!v) return std::unexpected(v.error());
  return static_cast<std::uint64_t>(*v);
}

Result<TimeNs> parse_duration(std::string_view text) {
  auto v = parse_quantity("parse_duration", text, kDurationUnits,
                          "ns, us, ms, s, min or h",
                          static_cast<u128>(std::numeric_limits<TimeNs>::max()));
  if (!v) return std::unexpected(v.error());
  return static_cast<TimeNs>(*v);
}

std::string format_size(std::uint64_t bytes) {
  constexpr std::array<std::string_view, 5> kNames{"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t k = 0;
  std::uint64_t unit = 1;
  while (k + 1 < kNames.size() && bytes >= unit * 1024) {
    unit *= 1024;
    ++k;
  }
  if (bytes % unit == 0) return fmt::format("{} {}", bytes / unit, kNames[k]);
  return fmt::format("{:.2f} {}", static_cast<double>(bytes) / static_cast<double>(unit),
                     kNames[k]);
}

std::string format_duration(TimeNs ns) {
  const double v = static_cast<double>(ns);
  const double a = v < 0 ? -v : v;
  if (a < 1e3) return format_scaled(v, "ns");
  if (a < 1e6) return format_scaled(v / 1e3, "us");
  if (a < 1e9) return format_scaled(v / 1e6, "ms");
  return format_scaled(v / 1e9, "s");
}

}  // namespace baton
