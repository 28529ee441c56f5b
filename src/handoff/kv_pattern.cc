#include "baton/handoff/kv_pattern.h"

#include "baton/engine/pattern.h"

namespace baton::handoff {
namespace {

// Calls visit(page span, offset in page, logical index) for every
// head_bytes-long cell of the rank's pages.
template <typename Visit>
Status for_each_cell(const RankPages& in, Visit&& visit) {
  const KvLayout& l = in.layout;
  if (auto s = l.validate(); !s.is_ok()) return s;
  if (in.rank >= l.ranks() || in.row >= l.cfg || in.tokens == 0) {
    return Status::invalid_argument("kv pattern: rank {} of {}, row {} of {}, {} tokens", in.rank, l.ranks(), in.row,
                                    l.cfg, in.tokens);
  }
  const std::uint32_t total = l.pages_for(in.tokens);
  if (in.pages.size() != l.rank_pages(in.rank, total)) {
    return Status::invalid_argument("kv pattern: {} pages for rank {} (expected {})", in.pages.size(), in.rank,
                                    l.rank_pages(in.rank, total));
  }
  const std::uint32_t tp_rank = in.rank % l.tp;
  const std::uint32_t first = l.first_page(in.rank / l.tp, total);
  const std::uint64_t padded_tokens = std::uint64_t{total} * l.page_tokens;
  for (std::size_t i = 0; i < in.pages.size(); ++i) {
    if (in.pages[i].size() != l.page_bytes()) {
      return Status::invalid_argument("kv pattern: page {} is {} bytes (expected {})", i, in.pages[i].size(),
                                      l.page_bytes());
    }
    for (std::uint32_t layer = 0; layer < l.layers; ++layer) {
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        for (std::uint32_t h = 0; h < l.heads_per_rank(); ++h) {
          const std::uint64_t head = std::uint64_t{tp_rank} * l.heads_per_rank() + h;
          const std::uint64_t plane = ((std::uint64_t{in.row} * l.layers + layer) * 2 + kv) * l.kv_heads + head;
          for (std::uint32_t t = 0; t < l.page_tokens; ++t) {
            const std::uint64_t token = (first + i) * std::uint64_t{l.page_tokens} + t;
            const std::uint64_t offset = l.offset(layer, kv, h, t);
            auto cell = in.pages[i].subspan(offset, l.head_bytes);
            if (auto s = visit(cell, (plane * padded_tokens + token) * l.head_bytes); !s.is_ok()) {
              return Status::internal("kv pattern: rank {} row {} page {} layer {} {} head {} token {}: {}", in.rank,
                                      in.row, i, layer, kv == 0 ? "K" : "V", head, token, s.message());
            }
          }
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace

Status fill_kv(const RankPages& pages, std::uint64_t salt) {
  return for_each_cell(pages, [salt](std::span<std::byte> cell, std::uint64_t index) {
    engine::fill_pattern(cell, salt, index);
    return Status::ok();
  });
}

Status check_kv(const RankPages& pages, std::uint64_t salt) {
  return for_each_cell(pages, [salt](std::span<std::byte> cell, std::uint64_t index) {
    if (auto at = engine::pattern_mismatch(cell, salt, index)) return Status::internal("byte {} differs", *at);
    return Status::ok();
  });
}

}  // namespace baton::handoff
