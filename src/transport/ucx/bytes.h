// Little-endian byte writing and bounds-checked reading for the transport's
// wire forms (wire.h, control_wire.h). Private to transport/ucx.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

namespace baton::transport::ucx {

class Writer {
 public:
  Writer() = default;
  // Writes into `reuse`'s memory (emptied first) instead of a new buffer.
  explicit Writer(std::vector<std::uint8_t> reuse) : out_(std::move(reuse)) { out_.clear(); }
  // Appends to `bytes` (kept) instead.
  enum Append { kAppend };
  Writer(std::vector<std::uint8_t> bytes, Append) : out_(std::move(bytes)) {}
  template <typename T>
  void put(T value) {
    const auto at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  void bytes(std::span<const std::uint8_t> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  std::vector<std::uint8_t> take() { return std::move(out_); }

 private:
  std::vector<std::uint8_t> out_;
};

// Every read checks what is left first, so a short input fails the read
// instead of running past it.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) : in_(in) {}
  template <typename T>
  bool get(T& value) {
    if (in_.size() - at_ < sizeof(T)) return false;
    std::memcpy(&value, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool bytes(std::size_t n, std::vector<std::uint8_t>& out) {
    if (in_.size() - at_ < n) return false;
    out.assign(in_.begin() + static_cast<std::ptrdiff_t>(at_), in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return true;
  }
  bool skip(std::size_t n) {
    if (in_.size() - at_ < n) return false;
    at_ += n;
    return true;
  }
  [[nodiscard]] std::span<const std::uint8_t> rest() const { return in_.subspan(at_); }
  [[nodiscard]] std::size_t offset() const { return at_; }
  [[nodiscard]] std::size_t left() const { return in_.size() - at_; }

 private:
  std::span<const std::uint8_t> in_;
  std::size_t at_ = 0;
};

}  // namespace baton::transport::ucx
