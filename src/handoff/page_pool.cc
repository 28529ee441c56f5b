#include "baton/handoff/page_pool.h"

#include <algorithm>

namespace baton::handoff {

PagePool::PagePool(std::uint64_t page_bytes, std::uint32_t pages) : page_bytes_(page_bytes), pages_(pages) {
  for (std::uint32_t p = 0; p < pages; ++p) free_.insert(free_.end(), p);
}

Result<std::vector<std::uint32_t>> PagePool::allocate(std::uint32_t count) {
  if (count == 0) return std::unexpected(Status::invalid_argument("PagePool::allocate: 0 pages"));
  std::lock_guard lock(mutex_);
  if (count > free_.size()) {
    return std::unexpected(Status::resource_exhausted("PagePool::allocate: {} pages asked, {} of {} free", count,
                                                      free_.size(), pages_));
  }
  std::vector<std::uint32_t> out;
  out.reserve(count);
  auto it = free_.begin();
  for (std::uint32_t i = 0; i < count; ++i) out.push_back(*it++);
  free_.erase(free_.begin(), it);
  return out;
}

Status PagePool::check_locked(std::span<const std::uint32_t> pages, const char* call, bool handed_out) const {
  std::vector<std::uint32_t> sorted(pages.begin(), pages.end());
  std::ranges::sort(sorted);
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] >= pages_) {
      return Status::out_of_range("{}: page {} is outside the pool of {} pages", call, sorted[i], pages_);
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return Status::failed_precondition("{}: page {} is named twice", call, sorted[i]);
    }
    if (handed_out && free_.contains(sorted[i])) return Status::failed_precondition("{}: page {} is free", call, sorted[i]);
  }
  return Status::ok();
}

Status PagePool::free(std::span<const std::uint32_t> pages) {
  std::lock_guard lock(mutex_);
  if (auto s = check_locked(pages, "PagePool::free", true); !s.is_ok()) return s;
  free_.insert(pages.begin(), pages.end());
  return Status::ok();
}

Status PagePool::check(std::span<const std::uint32_t> pages) const {
  std::lock_guard lock(mutex_);
  return check_locked(pages, "PagePool::check", true);
}

Status PagePool::check_range(std::span<const std::uint32_t> pages) const {
  return check_locked(pages, "PagePool::check_range", false);  // reads no state: no lock
}

std::uint32_t PagePool::free_pages() const {
  std::lock_guard lock(mutex_);
  return static_cast<std::uint32_t>(free_.size());
}

}  // namespace baton::handoff
