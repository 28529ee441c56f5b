#include "transport/ucx/wire.h"

#include <cstring>

#include "transport/ucx/bytes.h"

namespace baton::transport::ucx {

std::vector<std::uint8_t> encode_header(const MessageHeader& h) {
  Writer w;
  w.put(h.magic);
  w.put(h.version);
  w.put(h.flags);
  w.put(h.path);
  w.put(h.lane);
  w.put(h.seq);
  return w.take();
}

Result<MessageHeader> decode_header(std::span<const std::uint8_t> bytes) {
  if (bytes.size() != kHeaderBytes) {
    return std::unexpected(Status::invalid_argument(
        "ucx handshake: header is {} bytes (expected {})", bytes.size(), kHeaderBytes));
  }
  Reader r(bytes);
  MessageHeader h;
  r.get(h.magic);
  r.get(h.version);
  r.get(h.flags);
  r.get(h.path);
  r.get(h.lane);
  r.get(h.seq);
  if (h.magic != kWireMagic) {
    return std::unexpected(Status::invalid_argument(
        "ucx handshake: magic {:#x} (expected {:#x}): not a Baton peer", h.magic, kWireMagic));
  }
  if (h.version != kWireVersion) {
    return std::unexpected(Status::invalid_argument(
        "ucx handshake: protocol version {} (expected {})", h.version, kWireVersion));
  }
  return h;
}

namespace {

void put_slice(Writer& w, const SliceDescriptor& d, std::span<const std::uint8_t> data) {
  w.put(d.key);
  w.put(static_cast<std::uint8_t>(d.codec));
  w.put(d.failed);
  w.put(std::uint16_t{0});
  w.put(d.addr);
  w.put(d.payload_len);
  w.bytes(data);
}

}  // namespace

std::vector<std::uint8_t> encode_slice(const SliceDescriptor& d, std::span<const std::uint8_t> data,
                                       std::vector<std::uint8_t> into) {
  into.reserve(kSliceDescriptorBytes + data.size());
  Writer w(std::move(into));
  put_slice(w, d, data);
  return w.take();
}

Result<SliceDescriptor> decode_slice(std::span<const std::uint8_t> bytes, std::size_t& data_offset) {
  Reader r(bytes);
  SliceDescriptor d;
  std::uint8_t codec = 0;
  std::uint16_t reserved = 0;
  if (!r.get(d.key) || !r.get(codec) || !r.get(d.failed) || !r.get(reserved) || !r.get(d.addr) ||
      !r.get(d.payload_len)) {
    return std::unexpected(Status::invalid_argument("ucx slice: descriptor truncated ({} bytes, expected {})",
                                                    bytes.size(), kSliceDescriptorBytes));
  }
  if (codec > static_cast<std::uint8_t>(WireCodec::kZstd)) {
    return std::unexpected(Status::invalid_argument("ucx slice: unknown codec {}", codec));
  }
  d.codec = static_cast<WireCodec>(codec);
  if (d.failed > 1) return std::unexpected(Status::invalid_argument("ucx slice: failed flag {}", d.failed));
  if (d.payload_len == 0 || d.payload_len > kMaxCompressedSliceBytes) {
    return std::unexpected(Status::invalid_argument("ucx slice: payload of {} bytes (expected 1..{})", d.payload_len,
                                                    kMaxCompressedSliceBytes));
  }
  data_offset = r.offset();
  return d;
}

std::vector<std::uint8_t> begin_bundle(std::vector<std::uint8_t> into) {
  Writer w(std::move(into));
  w.put(std::uint32_t{0});
  return w.take();
}

void add_to_bundle(std::vector<std::uint8_t>& bundle, MessageKind kind, std::uint64_t seq, const SliceDescriptor& d,
                   std::span<const std::uint8_t> data) {
  std::uint32_t count = 0;
  std::memcpy(&count, bundle.data(), sizeof count);
  ++count;
  std::memcpy(bundle.data(), &count, sizeof count);
  Writer w(std::move(bundle), Writer::kAppend);
  w.put(static_cast<std::uint8_t>(kind));
  w.put(seq);
  w.put(static_cast<std::uint32_t>(data.size()));
  put_slice(w, d, data);
  bundle = w.take();
}

std::size_t bundle_entries(std::span<const std::uint8_t> bundle) {
  std::uint32_t count = 0;
  if (bundle.size() >= sizeof count) std::memcpy(&count, bundle.data(), sizeof count);
  return count;
}

Result<std::vector<BundleEntry>> decode_bundle(std::span<const std::uint8_t> bytes) {
  Reader r(bytes);
  std::uint32_t count = 0;
  if (!r.get(count) || count == 0 || count > kMaxBundleEntries) {
    return std::unexpected(Status::invalid_argument("ucx bundle: {} entries (expected 1..{})", count, kMaxBundleEntries));
  }
  std::vector<BundleEntry> out;
  out.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint8_t kind = 0;
    BundleEntry e;
    std::uint32_t data_bytes = 0;
    if (!r.get(kind) || !r.get(e.seq) || !r.get(data_bytes)) {
      return std::unexpected(Status::invalid_argument("ucx bundle: entry {} of {} truncated", i, count));
    }
    if (kind < static_cast<std::uint8_t>(MessageKind::kWriteData) ||
        kind > static_cast<std::uint8_t>(MessageKind::kReadData)) {
      return std::unexpected(Status::invalid_argument("ucx bundle: entry {} has kind {} (expected 5..8)", i, kind));
    }
    e.kind = static_cast<MessageKind>(kind);
    const auto rest = r.rest();
    if (rest.size() < kSliceDescriptorBytes || rest.size() - kSliceDescriptorBytes < data_bytes) {
      return std::unexpected(Status::invalid_argument("ucx bundle: entry {} claims {} data bytes, {} left", i,
                                                      data_bytes, rest.size()));
    }
    std::size_t at = 0;
    auto d = decode_slice(rest.first(kSliceDescriptorBytes + data_bytes), at);
    if (!d) return std::unexpected(Status::invalid_argument("ucx bundle: entry {}: {}", i, d.error().message()));
    e.descriptor = *d;
    e.data = rest.subspan(at, data_bytes);
    (void)r.skip(kSliceDescriptorBytes + data_bytes);
    out.push_back(e);
  }
  if (r.left() != 0) {
    return std::unexpected(Status::invalid_argument("ucx bundle: {} bytes after its {} entries", r.left(), count));
  }
  return out;
}

std::vector<std::uint8_t> encode_regions(const std::vector<RegionDescriptor>& regions) {
  Writer w;
  w.put(static_cast<std::uint32_t>(regions.size()));
  for (const RegionDescriptor& r : regions) {
    w.put(r.key);
    w.put(r.base);
    w.put(r.length);
    w.put(r.memfd);
    w.put(r.memfd_inode);
    w.put(static_cast<std::uint8_t>(r.packed_rkeys.size()));
    for (const auto& rkey : r.packed_rkeys) {
      w.put(static_cast<std::uint32_t>(rkey.size()));
      w.bytes(rkey);
    }
  }
  return w.take();
}

Result<std::vector<RegionDescriptor>> decode_regions(std::span<const std::uint8_t> bytes) {
  Reader r(bytes);
  std::uint32_t count = 0;
  if (!r.get(count)) {
    return std::unexpected(
        Status::invalid_argument("ucx handshake: region list of {} bytes has no count", bytes.size()));
  }
  // Each entry takes at least 33 bytes (a staged one has no rkey), so a
  // count the payload cannot hold is refused before anything is allocated.
  constexpr std::size_t kMinEntry = 4 + 8 + 8 + 4 + 8 + 1;
  if (count > kMaxRegions || count > r.left() / kMinEntry) {
    return std::unexpected(Status::invalid_argument(
        "ucx handshake: region count {} does not fit {} payload bytes (at most {})", count,
        bytes.size(), kMaxRegions));
  }
  std::vector<RegionDescriptor> out(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    RegionDescriptor& d = out[i];
    std::uint8_t rails = 0;
    if (!r.get(d.key) || !r.get(d.base) || !r.get(d.length) || !r.get(d.memfd) || !r.get(d.memfd_inode) ||
        !r.get(rails)) {
      return std::unexpected(Status::invalid_argument(
          "ucx handshake: region {} of {} truncated at byte {}", i, count, r.offset()));
    }
    if (d.length == 0 || d.base + d.length < d.base) {
      return std::unexpected(Status::invalid_argument(
          "ucx handshake: region key {} has range [{:#x}, +{}) (expected non-empty, no wrap)",
          d.key, d.base, d.length));
    }
    if (rails > kMaxRails || (rails == 0 && d.memfd != -1)) {
      return std::unexpected(Status::invalid_argument(
          "ucx handshake: region key {} comes with {} packed rkeys and memfd {} (expected one per rail, 1..{}, or "
          "none and no memfd for a staged region)",
          d.key, rails, d.memfd, kMaxRails));
    }
    d.packed_rkeys.resize(rails);
    for (auto& rkey : d.packed_rkeys) {
      std::uint32_t rkey_bytes = 0;
      if (!r.get(rkey_bytes) || rkey_bytes == 0 || rkey_bytes > kMaxRkeyBytes || !r.bytes(rkey_bytes, rkey)) {
        return std::unexpected(Status::invalid_argument(
            "ucx handshake: region key {} has a packed rkey of {} bytes ({} left, at most {})", d.key,
            rkey_bytes, r.left(), kMaxRkeyBytes));
      }
    }
  }
  if (r.left() != 0) {
    return std::unexpected(Status::invalid_argument(
        "ucx handshake: {} trailing bytes after {} regions", r.left(), count));
  }
  return out;
}

std::vector<std::uint8_t> encode_keys(const std::vector<std::uint32_t>& keys) {
  Writer w;
  w.put(static_cast<std::uint32_t>(keys.size()));
  for (std::uint32_t k : keys) w.put(k);
  return w.take();
}

Result<std::vector<std::uint32_t>> decode_keys(std::span<const std::uint8_t> bytes) {
  Reader r(bytes);
  std::uint32_t count = 0;
  if (!r.get(count) || count > kMaxRegions || r.left() != std::size_t{count} * 4) {
    return std::unexpected(Status::invalid_argument(
        "ucx handshake: key list of {} bytes does not hold its count {}", bytes.size(), count));
  }
  std::vector<std::uint32_t> keys(count);
  for (auto& k : keys) r.get(k);
  return keys;
}

}  // namespace baton::transport::ucx
