#include "baton/plan/rebuild.h"

#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

namespace baton::plan {

SlabMemory& SlabMemory::operator=(SlabMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr && release_) release_(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    numa_ = other.numa_;
    bound_ = other.bound_;
    release_ = std::move(other.release_);
  }
  return *this;
}

SlabMemory::~SlabMemory() {
  if (data_ != nullptr && release_) release_(data_, bytes_);
}

Result<SlabMemory> allocate_slab(int numa, std::uint64_t bytes) {
  if (bytes == 0) return std::unexpected(Status::invalid_argument("allocate_slab: 0 bytes for NUMA node {}", numa));
  if (numa < 0 || numa > kMaxNuma) {
    return std::unexpected(Status::invalid_argument("allocate_slab: NUMA node {}, expected 0..{}", numa, kMaxNuma));
  }
  // MAP_NORESERVE: a slab is as large as the plan's chunks but its pages
  // exist only once the ops write them.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return std::unexpected(Status::resource_exhausted("allocate_slab: cannot map {} bytes for NUMA node {}: {}", bytes,
                                                      numa, std::strerror(errno)));
  }
  // mbind through the raw syscall (glibc has no wrapper; libnuma is not
  // needed for one call). It fails with EINVAL when this machine has no such
  // node: the slab stays unbound and says so.
  constexpr std::size_t kWords = (kMaxNuma + 1) / 64;
  std::array<unsigned long, kWords> mask{};
  mask[static_cast<std::size_t>(numa) / 64] = 1ul << (numa % 64);
  const bool bound = syscall(SYS_mbind, p, bytes, MPOL_BIND, mask.data(), kWords * 64 + 1, 0) == 0;
  return SlabMemory(static_cast<std::byte*>(p), bytes, numa, bound,
                    [](std::byte* data, std::uint64_t size) { munmap(data, size); });
}

void RebuiltPlan::views(std::uint32_t slot, std::uint32_t segment, std::uint32_t first_block,
                        std::span<std::byte*> out) const {
  assert(first_block <= blocks_ && out.size() <= blocks_ - first_block);
  if (out.empty()) return;
  const std::size_t c = column(slot, segment);
  const std::uint32_t column_end = column_runs_[c + 1];
  std::uint32_t at = search(first_block, c);  // a lone run or a group's last lane
  std::uint32_t block = first_block;
  std::byte** to = out.data();
  std::byte** const end = to + out.size();
  while (to != end) {
    const Run& run = runs_[at];
    const std::uint32_t begin = run_begin_[at];
    const std::uint32_t run_end = at + 1 == column_end ? blocks_ : run_begin_[at + 1];
    const std::uint32_t count = std::min<std::uint64_t>(run_end - block, end - to);
    const std::uint32_t offset = block - begin;
    if (run.step == 1) {
      std::byte* view = run.base + std::uint64_t{offset} * run.stride;
      for (std::uint32_t i = 0; i < count; ++i, view += run.stride) *to++ = view;
    } else {
      const Run* lanes = &run - (run.step - 1);
      std::uint32_t lane = offset % run.step;  // one division, then counters
      std::uint64_t index = offset / run.step;
      for (std::uint32_t i = 0; i < count; ++i) {
        *to++ = lanes[lane].base + index * lanes[lane].stride;
        if (++lane == run.step) {
          lane = 0;
          ++index;
        }
      }
    }
    block += count;
    ++at;
  }
}

namespace {

// One slot segment's placements as groups in block order (a lone run is a
// group of one lane): the cursor of the K/V check.
struct GroupCursor {
  const Plan& plan;
  std::size_t at;  // the group's first placement

  [[nodiscard]] const Placement& head() const { return plan.placements[at]; }
  [[nodiscard]] std::uint32_t begin() const { return head().block_start; }
  [[nodiscard]] std::uint32_t end() const {
    std::uint32_t blocks = 0;
    for (std::uint32_t lane = 0; lane < head().block_step; ++lane) blocks += plan.placements[at + lane].block_count;
    return begin() + blocks;
  }
  [[nodiscard]] int numa(std::uint32_t block) const {
    const std::uint32_t lane = (block - begin()) % head().block_step;
    return plan.chunks[plan.placements[at + lane].chunk].numa;
  }
};

}  // namespace

Result<RebuiltPlan> Rebuilder::rebuild(const Plan& plan) {
  auto refuse = [](std::uint64_t& counter, Status s) -> Result<RebuiltPlan> {
    ++counter;
    return std::unexpected(std::move(s));
  };
  if (Status s = validate(plan); !s.is_ok()) {
    return refuse(metrics_.rejected_invalid, Status::invalid_argument("rebuild: {}", s.message()));
  }
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    if (plan.chunks[c].numa == kUnknownNuma) {
      return refuse(metrics_.rejected_unknown_numa,
                    Status::invalid_argument("rebuild: chunk {} is on an unknown NUMA node; its blocks cannot be "
                                             "rebuilt where the holder kept them",
                                             c));
    }
  }
  const std::uint32_t segments = plan.segments_per_slot;
  if (segments == 2) {
    // Both segments of a (block, slot) must come from one node. Placements
    // tile each slot segment in block order, so walk K's and V's groups side
    // by side. Where both are plain runs one comparison covers the overlap;
    // where a group of lanes is involved the nodes repeat with the lcm of
    // the two steps (≤ kMaxBlockStep²), so that many blocks cover it.
    std::size_t k_at = 0;
    for (std::uint32_t slot = 0; slot < plan.slots; ++slot) {
      std::size_t v_at = k_at;
      while (plan.placements[v_at].segment == 0) v_at += plan.placements[v_at].block_step;
      std::size_t next_slot = v_at;
      while (next_slot < plan.placements.size() && plan.placements[next_slot].slot == slot) {
        next_slot += plan.placements[next_slot].block_step;
      }
      GroupCursor k{plan, k_at};
      GroupCursor v{plan, v_at};
      for (;;) {
        const std::uint32_t k_end = k.end();
        const std::uint32_t v_end = v.end();
        const std::uint32_t lo = std::max(k.begin(), v.begin());
        const std::uint32_t hi = std::min(k_end, v_end);
        const std::uint32_t k_step = k.head().block_step;
        const std::uint32_t v_step = v.head().block_step;
        const std::uint32_t period = k_step == 1 && v_step == 1 ? 1 : std::lcm(k_step, v_step);
        for (std::uint32_t block = lo; block < hi && block < lo + period; ++block) {
          const int k_numa = k.numa(block);
          const int v_numa = v.numa(block);
          if (k_numa != v_numa) {
            return refuse(metrics_.rejected_split_slot,
                          Status::invalid_argument("rebuild: block {} slot {} has K on NUMA node {} and V on node {}",
                                                   block, slot, k_numa, v_numa));
          }
        }
        if (k_end == plan.blocks && v_end == plan.blocks) break;
        if (k_end <= v_end) k.at += k_step;
        if (v_end <= k_end) v.at += v_step;
      }
      k_at = next_slot;
    }
  }

  auto layout = layout_slabs(plan);
  if (!layout) return refuse(metrics_.rejected_invalid, layout.error());

  RebuiltPlan out;
  out.blocks_ = plan.blocks;
  out.slots_ = plan.slots;
  out.segments_ = segments;
  out.layout_ = std::move(*layout);
  out.slabs_.reserve(out.layout_.slabs.size());
  for (const SlabSpec& spec : out.layout_.slabs) {
    auto slab = allocator_(spec.numa, spec.bytes);
    if (!slab) return refuse(metrics_.rejected_invalid, slab.error());
    out.slabs_.push_back(std::move(*slab));
  }
  out.segment_bytes_.resize(plan.schema.size());
  for (std::size_t i = 0; i < plan.schema.size(); ++i) out.segment_bytes_[i] = plan.schema[i].bytes;

  // One descriptor per placement; validate() guarantees the order, the
  // tiling and whole groups.
  out.runs_.resize(plan.placements.size());
  out.run_begin_.resize(plan.placements.size());
  out.column_runs_.resize(plan.schema.size() + 1);
  for (std::size_t i = 0; i < plan.placements.size();) {
    const Placement& head = plan.placements[i];
    const std::size_t c = std::size_t{head.slot} * segments + head.segment;
    if (head.block_start == 0) out.column_runs_[c] = static_cast<std::uint32_t>(i);
    const std::uint32_t step = head.block_step;
    const auto shift = static_cast<std::uint8_t>(std::has_single_bit(step) ? std::countr_zero(step)
                                                                            : RebuiltPlan::kNoShift);
    for (std::uint32_t lane = 0; lane < step; ++lane, ++i) {
      const Placement& p = plan.placements[i];
      const ChunkLocation& where = out.layout_.chunks[p.chunk];
      out.runs_[i] = {out.slabs_[where.slab].data() + where.offset + p.offset, plan.schema[c].stride,
                      static_cast<std::uint16_t>(step), shift, static_cast<std::int16_t>(plan.chunks[p.chunk].numa)};
      out.run_begin_[i] = head.block_start;
    }
  }
  out.column_runs_.back() = static_cast<std::uint32_t>(plan.placements.size());
  ++metrics_.plans_rebuilt;
  return out;
}

}  // namespace baton::plan
