// Sizes and durations as people write them in configs and on the command line
// ("64KiB", "32 MB", "250us", "1.5s"), parsed exactly, with errors that quote
// the offending text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "baton/common/clock.h"
#include "baton/common/status.h"

namespace baton {

// Bytes from "<number>[ ]<unit>". Units: B, KB, MB, GB, TB (powers of 1000)
// and KiB, MiB, GiB, TiB (powers of 1024), case-insensitive; a bare integer is
// bytes. Decimals are allowed when the result is a whole number of bytes
// ("1.5MiB"). Negative, empty, fractional-byte or overflowing text is refused.
[[nodiscard]] Result<std::uint64_t> parse_size(std::string_view text);

// Nanoseconds from "<number>[ ]<unit>", unit one of ns, us (or µs), ms, s,
// min, h. The unit is required: a bare "250" is ambiguous and refused.
[[nodiscard]] Result<TimeNs> parse_duration(std::string_view text);

// Human-readable forms for tables and logs: "64 KiB", "1.50 GiB", "250 us".
[[nodiscard]] std::string format_size(std::uint64_t bytes);
[[nodiscard]] std::string format_duration(TimeNs ns);

}  // namespace baton
