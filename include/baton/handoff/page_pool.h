// A rank's page pool: fixed-size pages carved out of one registered region,
// handed out and taken back by page index. Bookkeeping only — the memory
// belongs to whoever registered the region. Safe from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <span>
#include <vector>

#include "baton/common/status.h"

namespace baton::handoff {

class PagePool {
 public:
  // Its bookkeeping takes about 48 bytes a free page; the workers refuse
  // pools above this (16 Mi pages: 256 GiB of 16 KiB pages).
  static constexpr std::uint32_t kMaxPages = 1u << 24;

  PagePool(std::uint64_t page_bytes, std::uint32_t pages);

  // `count` free pages, lowest first (neighbours coalesce into one
  // transfer), all or none: resource_exhausted when fewer are free;
  // invalid_argument for 0.
  [[nodiscard]] Result<std::vector<std::uint32_t>> allocate(std::uint32_t count);
  // Returns pages, all or none: out_of_range for a page outside the pool,
  // failed_precondition for one that is free already (or named twice).
  [[nodiscard]] Status free(std::span<const std::uint32_t> pages);
  // ok when every page is inside the pool, named once and handed out.
  [[nodiscard]] Status check(std::span<const std::uint32_t> pages) const;
  // ok when every page is inside the pool and named once (whoever hands
  // them out keeps its own table).
  [[nodiscard]] Status check_range(std::span<const std::uint32_t> pages) const;

  [[nodiscard]] std::uint64_t page_bytes() const { return page_bytes_; }
  [[nodiscard]] std::uint32_t pages() const { return pages_; }
  [[nodiscard]] std::uint32_t free_pages() const;

 private:
  Status check_locked(std::span<const std::uint32_t> pages, const char* call, bool handed_out) const;

  const std::uint64_t page_bytes_;
  const std::uint32_t pages_;
  mutable std::mutex mutex_;
  std::set<std::uint32_t> free_;
};

}  // namespace baton::handoff
