#include "baton/common/memory_budget.h"

#include <sys/statvfs.h>

#include <fstream>
#include <sstream>
#include <string>

#include "baton/common/units.h"

namespace baton {

Result<MemoryBudget> memory_budget() {
  MemoryBudget b;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  bool found = false;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      b.available_bytes = kib * 1024;
      found = true;
      break;
    }
  }
  if (!found) return std::unexpected(Status::unavailable("memory_budget: no MemAvailable in /proc/meminfo"));
  struct statvfs fs{};
  if (::statvfs("/dev/shm", &fs) != 0) return std::unexpected(Status::unavailable("memory_budget: cannot stat /dev/shm"));
  b.shm_free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  return b;
}

Status check_shared_allocation(std::string_view call, std::uint64_t length) {
  auto b = memory_budget();
  if (!b) return b.error();
  const std::uint64_t limit = std::min(b->available_bytes, b->shm_free_bytes) / 8 * 7;
  if (length > limit) {
    return Status::resource_exhausted(
        "{}: {} is more than this machine can give ({} available memory, {} free in /dev/shm; at most {} is "
        "allowed, leaving an eighth for everyone else)",
        call, format_size(length), format_size(b->available_bytes), format_size(b->shm_free_bytes),
        format_size(limit));
  }
  return Status::ok();
}

}  // namespace baton
