#include "baton/handoff/layout.h"

#include <algorithm>

namespace baton::handoff {

Status KvLayout::validate() const {
  if (layers == 0 || kv_heads == 0 || head_bytes == 0 || page_tokens == 0 || tp == 0 || sp == 0 || cfg == 0) {
    return Status::invalid_argument(
        "KvLayout: a zero field (layers {}, kv_heads {}, head_bytes {}, page_tokens {}, tp {}, sp {}, cfg {}); each "
        "must be at least 1",
        layers, kv_heads, head_bytes, page_tokens, tp, sp, cfg);
  }
  // Bounds that keep every product in range (ranks() is tp·sp in 32 bits)
  // and a plan's work small: a plan walks each (layer, K|V, head, token)
  // cell of a page once.
  if (tp > kMaxParallel || sp > kMaxParallel || cfg > kMaxParallel) {
    return Status::invalid_argument("KvLayout: tp {}, sp {}, cfg {}: each at most {}", tp, sp, cfg, kMaxParallel);
  }
  if (const std::uint64_t cells = std::uint64_t{layers} * 2 * kv_heads * page_tokens; cells > kMaxPageCells) {
    return Status::invalid_argument(
        "KvLayout: {} layers x 2 x {} kv heads x {} page tokens = {} cells a page (at most {})", layers, kv_heads,
        page_tokens, cells, kMaxPageCells);
  }
  if (order != KvOrder::kHnd && order != KvOrder::kNhd) {
    return Status::invalid_argument("KvLayout: order {} is neither HND (0) nor NHD (1)", static_cast<int>(order));
  }
  if (kv_heads % tp != 0) {
    return Status::invalid_argument("KvLayout: tp {} does not divide {} kv heads (replicated heads are not supported)",
                                    tp, kv_heads);
  }
  if (page_bytes() > (std::uint64_t{1} << 32)) {
    return Status::invalid_argument("KvLayout: a page of {} bytes (above 4 GiB)", page_bytes());
  }
  return Status::ok();
}

Result<ReshapePlan> ReshapePlan::compute(const KvLayout& producer, const KvLayout& consumer) {
  if (auto s = producer.validate(); !s.is_ok()) return std::unexpected(Status::invalid_argument("producer {}", s.message()));
  if (auto s = consumer.validate(); !s.is_ok()) return std::unexpected(Status::invalid_argument("consumer {}", s.message()));
  if (producer.layers != consumer.layers || producer.kv_heads != consumer.kv_heads ||
      producer.head_bytes != consumer.head_bytes || producer.page_tokens != consumer.page_tokens ||
      producer.cfg != consumer.cfg) {
    return std::unexpected(Status::invalid_argument(
        "ReshapePlan: the producer's KV (layers {}, kv_heads {}, head_bytes {}, page_tokens {}, cfg {}) is not the "
        "consumer's (layers {}, kv_heads {}, head_bytes {}, page_tokens {}, cfg {})",
        producer.layers, producer.kv_heads, producer.head_bytes, producer.page_tokens, producer.cfg, consumer.layers,
        consumer.kv_heads, consumer.head_bytes, consumer.page_tokens, consumer.cfg));
  }
  std::size_t runs_made = 0;
  ReshapePlan plan;
  plan.producer_ = producer;
  plan.consumer_ = consumer;
  plan.runs_.resize(consumer.tp);
  const std::uint32_t ph = producer.heads_per_rank(), ch = consumer.heads_per_rank();
  for (std::uint32_t ct = 0; ct < consumer.tp; ++ct) {
    auto& runs = plan.runs_[ct];
    // Walk the consumer page in its own order so runs come out in
    // destination order; each cell is one (layer, kv, head, token).
    for (std::uint32_t layer = 0; layer < consumer.layers; ++layer) {
      for (std::uint32_t kv = 0; kv < 2; ++kv) {
        const std::uint32_t outer = consumer.order == KvOrder::kHnd ? ch : consumer.page_tokens;
        const std::uint32_t inner = consumer.order == KvOrder::kHnd ? consumer.page_tokens : ch;
        for (std::uint32_t a = 0; a < outer; ++a) {
          for (std::uint32_t b = 0; b < inner; ++b) {
            const std::uint32_t local_head = consumer.order == KvOrder::kHnd ? a : b;
            const std::uint32_t token = consumer.order == KvOrder::kHnd ? b : a;
            const std::uint32_t head = ct * ch + local_head;
            const std::uint32_t pt = head / ph;
            const PageRun cell{pt, ct, producer.offset(layer, kv, head - pt * ph, token),
                               consumer.offset(layer, kv, local_head, token), producer.head_bytes};
            if (!runs.empty()) {
              PageRun& last = runs.back();
              if (last.producer_tp == pt && last.src_offset + last.length == cell.src_offset &&
                  last.dst_offset + last.length == cell.dst_offset) {
                last.length += cell.length;
                continue;
              }
            }
            if (++runs_made > kMaxRuns) {
              return std::unexpected(Status::invalid_argument(
                  "ReshapePlan: these layouts cut a page into more than {} pieces (of {} bytes and less): use one KV "
                  "order on both sides",
                  kMaxRuns, producer.head_bytes));
            }
            runs.push_back(cell);
          }
        }
      }
    }
  }
  return plan;
}

Result<std::shared_ptr<const ReshapePlan>> PlanCache::get(const KvLayout& producer, const KvLayout& consumer) {
  const Key key{producer.layers,  producer.kv_heads,  producer.head_bytes, producer.page_tokens,
                static_cast<int>(producer.order), producer.tp, producer.sp, static_cast<int>(consumer.order),
                consumer.tp,      consumer.sp,       producer.cfg};
  std::lock_guard lock(mutex_);
  if (auto it = plans_.find(key); it != plans_.end() && it->second->consumer() == consumer) return it->second;
  auto plan = ReshapePlan::compute(producer, consumer);
  if (!plan) return std::unexpected(plan.error());
  auto shared = std::make_shared<const ReshapePlan>(std::move(*plan));
  if (plans_.size() >= kMaxPlans) plans_.clear();  // plans in use live on in their holders
  plans_[key] = shared;
  return shared;
}

std::size_t PlanCache::size() const {
  std::lock_guard lock(mutex_);
  return plans_.size();
}

}  // namespace baton::handoff
