// PlacementTable: the holder's description of the blocks it is asked for,
// before encoding. Flat and column-major — [slot][segment][block] addresses
// and lengths, [slot][block] NUMA nodes — so that encoding scans contiguous
// memory and filling it makes no per-cell allocation. A holder keeps one and
// refills it per request (reset() keeps the capacity).
#pragma once

#include <cassert>
#include <cstdint>
#include <span>
#include <vector>

#include "baton/common/status.h"
#include "baton/plan/plan.h"

namespace baton::plan {

class PlacementTable {
 public:
  PlacementTable() = default;

  // What numa() answers for a node set_numa() was given past 16 bits.
  static constexpr std::int16_t kNumaOutOfRange = INT16_MIN;

  // blocks in [1, kMaxBlocks], slots in [1, kMaxSlots], segments_per_slot 1
  // or 2, blocks × slots × segments <= kMaxCells; else invalid_argument.
  // Cells start at address 0, length 0 (which encoding refuses) and
  // kUnknownNuma.
  [[nodiscard]] static Result<PlacementTable> create(std::uint32_t blocks, std::uint32_t slots,
                                                     std::uint32_t segments_per_slot);
  // Same rules as create(); reuses the buffers.
  Status reset(std::uint32_t blocks, std::uint32_t slots, std::uint32_t segments_per_slot);

  [[nodiscard]] std::uint32_t blocks() const { return blocks_; }
  [[nodiscard]] std::uint32_t slots() const { return slots_; }
  [[nodiscard]] std::uint32_t segments_per_slot() const { return segments_; }

  // Per-cell access; indices are the caller's invariant (asserted).
  void set(std::uint32_t block, std::uint32_t slot, std::uint32_t segment, std::uint64_t address,
           std::uint32_t length) {
    const std::size_t i = cell(block, slot, segment);
    addresses_[i] = address;
    lengths_[i] = length;
  }
  // A node that 16 bits cannot hold is kept as kNumaOutOfRange, which
  // encoding refuses as it refuses any node outside [kUnknownNuma,
  // kMaxNuma]: cast, 65537 would read as node 1.
  void set_numa(std::uint32_t block, std::uint32_t slot, int numa) {
    assert(block < blocks_ && slot < slots_);
    numa_[std::size_t{slot} * blocks_ + block] =
        numa <= kNumaOutOfRange || numa > INT16_MAX ? kNumaOutOfRange : static_cast<std::int16_t>(numa);
  }
  [[nodiscard]] std::uint64_t address(std::uint32_t block, std::uint32_t slot, std::uint32_t segment) const {
    return addresses_[cell(block, slot, segment)];
  }
  [[nodiscard]] std::uint32_t length(std::uint32_t block, std::uint32_t slot, std::uint32_t segment) const {
    return lengths_[cell(block, slot, segment)];
  }
  [[nodiscard]] int numa(std::uint32_t block, std::uint32_t slot) const {
    return numa_[std::size_t{slot} * blocks_ + block];
  }

  // Whole columns (blocks() long), for bulk filling and for the encoder.
  // A NUMA value outside [kUnknownNuma, kMaxNuma] is refused by encoding.
  [[nodiscard]] std::span<std::uint64_t> addresses(std::uint32_t slot, std::uint32_t segment) {
    return {addresses_.data() + column(slot, segment), blocks_};
  }
  [[nodiscard]] std::span<const std::uint64_t> addresses(std::uint32_t slot, std::uint32_t segment) const {
    return {addresses_.data() + column(slot, segment), blocks_};
  }
  [[nodiscard]] std::span<std::uint32_t> lengths(std::uint32_t slot, std::uint32_t segment) {
    return {lengths_.data() + column(slot, segment), blocks_};
  }
  [[nodiscard]] std::span<const std::uint32_t> lengths(std::uint32_t slot, std::uint32_t segment) const {
    return {lengths_.data() + column(slot, segment), blocks_};
  }
  [[nodiscard]] std::span<std::int16_t> numa_column(std::uint32_t slot) {
    return {numa_.data() + std::size_t{slot} * blocks_, blocks_};
  }
  [[nodiscard]] std::span<const std::int16_t> numa_column(std::uint32_t slot) const {
    return {numa_.data() + std::size_t{slot} * blocks_, blocks_};
  }

 private:
  [[nodiscard]] std::size_t column(std::uint32_t slot, std::uint32_t segment) const {
    assert(slot < slots_ && segment < segments_);
    return (std::size_t{slot} * segments_ + segment) * blocks_;
  }
  [[nodiscard]] std::size_t cell(std::uint32_t block, std::uint32_t slot, std::uint32_t segment) const {
    assert(block < blocks_);
    return column(slot, segment) + block;
  }

  std::uint32_t blocks_ = 0;
  std::uint32_t slots_ = 0;
  std::uint32_t segments_ = 0;
  std::vector<std::uint64_t> addresses_;
  // 32 bits: one (block, slot) segment of any KV layout is far below 4 GiB (a
  // 16-token block of 128 fp32 heads × 128 dims is 1 MiB), and the narrower
  // column cuts the encoder's memory traffic by a quarter.
  std::vector<std::uint32_t> lengths_;
  std::vector<std::int16_t> numa_;
};

}  // namespace baton::plan
