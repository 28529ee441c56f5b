#include "baton/plan/rebuild.h"

#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
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

int RebuiltPlan::numa(std::uint32_t block, std::uint32_t slot) const {
  const std::byte* v = view(block, slot, 0);
  for (const SlabMemory& s : slabs_) {
    if (v >= s.data() && v < s.data() + s.bytes()) return s.numa();
  }
  return kUnknownNuma;
}

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
    // tile each slot segment in block order, so walk K and V side by side.
    std::size_t k = 0;
    for (std::uint32_t slot = 0; slot < plan.slots; ++slot) {
      std::size_t v = k;
      while (plan.placements[v].segment == 0) ++v;
      const std::size_t next_slot = [&] {
        std::size_t e = v;
        while (e < plan.placements.size() && plan.placements[e].slot == slot) ++e;
        return e;
      }();
      while (k < next_slot && plan.placements[k].segment == 0 && v < next_slot) {
        const Placement& pk = plan.placements[k];
        const Placement& pv = plan.placements[v];
        if (plan.chunks[pk.chunk].numa != plan.chunks[pv.chunk].numa) {
          const std::uint32_t block = std::max(pk.block_start, pv.block_start);
          return refuse(metrics_.rejected_split_slot,
                        Status::invalid_argument("rebuild: block {} slot {} has K on NUMA node {} and V on node {}",
                                                 block, slot, plan.chunks[pk.chunk].numa,
                                                 plan.chunks[pv.chunk].numa));
        }
        const std::uint32_t k_end = pk.block_start + pk.block_count;
        const std::uint32_t v_end = pv.block_start + pv.block_count;
        if (k_end <= v_end) ++k;
        if (v_end <= k_end) ++v;
      }
      k = next_slot;
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

  // Every view, column by column: one strided fill per placement.
  const std::size_t cells = plan.schema.size() * plan.blocks;
  out.views_.reset(new std::byte*[cells]);  // no value-init: every cell is written below
  std::byte** views = out.views_.get();
  for (const Placement& p : plan.placements) {
    const ChunkLocation& where = out.layout_.chunks[p.chunk];
    std::byte* base = out.slabs_[where.slab].data() + where.offset + p.offset;
    const std::uint64_t stride = plan.segment(p.slot, p.segment).stride;
    std::byte** column = views + (std::size_t{p.slot} * segments + p.segment) * plan.blocks + p.block_start;
    for (std::uint32_t i = 0; i < p.block_count; ++i) column[i] = base + i * stride;
  }
  ++metrics_.plans_rebuilt;
  return out;
}

}  // namespace baton::plan
