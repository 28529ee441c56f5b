// How much memory this machine can still give: what a registration or an
// allocation is checked against before anything is mapped, so that a size
// larger than the machine (a typo, 2^64 − 1) is refused with both numbers
// instead of filling /dev/shm until the kernel's OOM killer picks a victim.
#pragma once

#include <cstdint>

#include "baton/common/status.h"

namespace baton {

struct MemoryBudget {
  std::uint64_t available_bytes = 0;  // MemAvailable in /proc/meminfo
  std::uint64_t shm_free_bytes = 0;   // free space of /dev/shm (where UCX puts memory peers map)
};

// unavailable when /proc/meminfo or /dev/shm cannot be read.
[[nodiscard]] Result<MemoryBudget> memory_budget();

// ok when `length` bytes of shared memory fit both figures (and leave an
// eighth of each for everyone else), else resource_exhausted naming the
// call, the length and both figures.
[[nodiscard]] Status check_shared_allocation(std::string_view call, std::uint64_t length);

}  // namespace baton
