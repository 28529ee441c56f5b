// How a serving stage lays out one request's KV cache over its ranks, and the
// reshape plan between a producer's layout and a consumer's: which byte
// range of which producer rank's page lands where in which consumer rank's
// page. A plan depends only on the two layouts, so it is computed once per
// layout pair (PlanCache) and applied to every request's page tables.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "baton/common/status.h"

namespace baton::handoff {

// The order of one layer's K (or V) inside a page: [head][token][byte]
// (HND, FlashInfer's; vLLM needs it for heterogeneous TP) or
// [token][head][byte] (NHD, vLLM's default).
enum class KvOrder : std::uint8_t { kHnd, kNhd };

// A page holds `page_tokens` tokens of every layer's K and V for the heads
// of its rank: [layer][K|V][order], head_bytes (head_dim × dtype size) per
// head and token. A request's tokens fill pages 0, 1, … (the last one may
// be partly used); with sequence parallelism (sp) rank group s holds the
// contiguous pages [s·P/sp, (s+1)·P/sp) of the P pages, Ulysses-style; with
// tensor parallelism (tp) rank t holds kv heads [t·H/tp, (t+1)·H/tp). Rank
// index = sp_rank · tp + tp_rank. Classifier-free guidance: `cfg` rows,
// each a separate KV set with its own pages.
struct KvLayout {
  std::uint32_t layers = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_bytes = 0;
  std::uint32_t page_tokens = 0;
  KvOrder order = KvOrder::kHnd;
  std::uint32_t tp = 1;
  std::uint32_t sp = 1;
  std::uint32_t cfg = 1;

  // tp, sp and cfg each at most this; layers x 2 x kv_heads x page_tokens
  // (the cells a plan walks) at most kMaxPageCells.
  static constexpr std::uint32_t kMaxParallel = 1024;
  static constexpr std::uint64_t kMaxPageCells = std::uint64_t{1} << 24;

  // invalid_argument for a zero field, a field above its bound, an order
  // that is not a KvOrder, tp not dividing kv_heads, or a page above 4 GiB.
  [[nodiscard]] Status validate() const;
  [[nodiscard]] std::uint32_t ranks() const { return tp * sp; }
  [[nodiscard]] std::uint32_t heads_per_rank() const { return kv_heads / tp; }
  [[nodiscard]] std::uint64_t page_bytes() const {
    return std::uint64_t{layers} * 2 * heads_per_rank() * page_tokens * head_bytes;
  }
  // Where (layer, K|V, head within the rank, token within the page) starts
  // in a page.
  [[nodiscard]] std::uint64_t offset(std::uint32_t layer, std::uint32_t kv, std::uint32_t head,
                                     std::uint32_t token) const {
    const std::uint64_t heads = heads_per_rank();
    const std::uint64_t block = (std::uint64_t{layer} * 2 + kv) * heads * page_tokens;
    const std::uint64_t cell =
        order == KvOrder::kHnd ? std::uint64_t{head} * page_tokens + token : std::uint64_t{token} * heads + head;
    return (block + cell) * head_bytes;
  }
  // Pages of one row of a request of `tokens` tokens, over all sp groups.
  [[nodiscard]] std::uint32_t pages_for(std::uint32_t tokens) const {
    return static_cast<std::uint32_t>((std::uint64_t{tokens} + page_tokens - 1) / page_tokens);
  }
  // The first of the row's `pages` pages held by sp group `sp_rank`.
  [[nodiscard]] std::uint32_t first_page(std::uint32_t sp_rank, std::uint32_t pages) const {
    return static_cast<std::uint32_t>(std::uint64_t{sp_rank} * pages / sp);
  }
  // How many of a row's `pages` pages rank `rank` holds.
  [[nodiscard]] std::uint32_t rank_pages(std::uint32_t rank, std::uint32_t pages) const {
    const std::uint32_t s = rank / tp;
    return first_page(s + 1, pages) - first_page(s, pages);
  }

  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

// One contiguous byte range inside a page: from producer tp rank
// `producer_tp`'s page at `src_offset` to consumer tp rank `consumer_tp`'s
// page at `dst_offset`.
struct PageRun {
  std::uint32_t producer_tp = 0;
  std::uint32_t consumer_tp = 0;
  std::uint64_t src_offset = 0;
  std::uint64_t dst_offset = 0;
  std::uint64_t length = 0;
};

class ReshapePlan {
 public:
  // invalid_argument when either layout is invalid, they describe
  // different KV (layers, kv heads, head bytes, page tokens, cfg rows), or
  // the pair cuts a page into more than kMaxRuns pieces (1-byte heads in
  // HND against NHD made one per byte: a load of one 4 MiB page was 4 M
  // engine requests, 1.4 GB and 8 s).
  [[nodiscard]] static Result<ReshapePlan> compute(const KvLayout& producer, const KvLayout& consumer);
  // Runs of a plan, over all consumer tp ranks (a real pair of orders cuts
  // a page into layers x 2 x heads x tokens: 20 480 for 80 layers, 8 heads
  // and 16 tokens).
  static constexpr std::size_t kMaxRuns = std::size_t{1} << 20;

  [[nodiscard]] const KvLayout& producer() const { return producer_; }
  [[nodiscard]] const KvLayout& consumer() const { return consumer_; }
  // The runs landing on consumer tp rank `consumer_tp`, coalesced, in
  // destination order; together they cover its page exactly once. Empty
  // for a rank the consumer does not have.
  [[nodiscard]] std::span<const PageRun> runs(std::uint32_t consumer_tp) const {
    if (consumer_tp >= runs_.size()) return {};
    return runs_[consumer_tp];
  }

 private:
  KvLayout producer_, consumer_;
  std::vector<std::vector<PageRun>> runs_;  // by consumer tp rank
};

// ReshapePlan::compute, once per layout pair; safe from any thread.
class PlanCache {
 public:
  [[nodiscard]] Result<std::shared_ptr<const ReshapePlan>> get(const KvLayout& producer, const KvLayout& consumer);
  [[nodiscard]] std::size_t size() const;
  // A serving pair has one or two layout pairs; orders naming many more
  // (a hostile or confused sender) start the cache afresh past this.
  static constexpr std::size_t kMaxPlans = 8;

 private:
  using Key = std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t, int, std::uint32_t, std::uint32_t,
                         int, std::uint32_t, std::uint32_t, std::uint32_t>;
  mutable std::mutex mutex_;
  std::map<Key, std::shared_ptr<const ReshapePlan>> plans_;
};

}  // namespace baton::handoff
