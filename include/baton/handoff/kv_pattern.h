// A checkable KV pattern that survives reshaping: every byte of a request's
// logical KV — (row, layer, K|V, head, token, byte) — has a value that is a
// function of (salt, row, its logical position), so a producer rank fills its
// pages from its share of the KV and a consumer rank with another layout
// checks its pages from its own share, without a copy of the source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "baton/common/status.h"
#include "baton/handoff/layout.h"

namespace baton::handoff {

// The pages of one row that rank `rank` holds, in order, each
// layout.page_bytes() long.
struct RankPages {
  const KvLayout& layout;
  std::uint32_t rank = 0;
  std::uint32_t tokens = 0;  // the request's
  std::uint32_t row = 0;
  std::span<const std::span<std::byte>> pages;
};

// invalid_argument when the page count or a page's size does not match the
// layout, rank or row.
[[nodiscard]] Status fill_kv(const RankPages& pages, std::uint64_t salt);
// ok, or internal naming the first mismatching page, layer, head, token
// and byte; the same invalid_argument errors as fill_kv.
[[nodiscard]] Status check_kv(const RankPages& pages, std::uint64_t salt);

}  // namespace baton::handoff
