// Message payload buffers, reused. A fresh large allocation costs a page
// fault per 4 KiB page on first touch, and glibc hands freed ones back to
// the kernel; on a VM those faults cost more than the socket that carries
// the bytes (docs/results.md, "TCP against one kernel stream"). Loop-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace baton::transport::ucx {

class BufferPool {
 public:
  // Buffers below this go back to malloc, which keeps small ones warm itself.
  static constexpr std::size_t kMinKept = 64 << 10;

  explicit BufferPool(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  // An empty buffer that holds `capacity` bytes without reallocating.
  [[nodiscard]] std::vector<std::uint8_t> take(std::size_t capacity) {
    for (std::size_t i = capacity < kMinKept ? 0 : free_.size(); i-- > 0;) {
      if (free_[i].capacity() < capacity) continue;
      std::vector<std::uint8_t> out = std::move(free_[i]);
      free_[i] = std::move(free_.back());
      free_.pop_back();
      kept_ -= out.capacity();
      return out;
    }
    std::vector<std::uint8_t> out;
    out.reserve(capacity);
    return out;
  }

  // Keeps `buffer` for a later take while the pool holds at most its bound.
  void give(std::vector<std::uint8_t> buffer) {
    if (buffer.capacity() < kMinKept || kept_ + buffer.capacity() > max_bytes_) return;
    buffer.clear();
    kept_ += buffer.capacity();
    free_.push_back(std::move(buffer));
  }

  [[nodiscard]] std::size_t kept_bytes() const { return kept_; }

 private:
  std::size_t max_bytes_;
  std::size_t kept_ = 0;
  std::vector<std::vector<std::uint8_t>> free_;
};

}  // namespace baton::transport::ucx
