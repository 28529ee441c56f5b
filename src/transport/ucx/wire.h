// The active messages engines exchange over UCP lanes, private to
// transport/ucx: lane binding and compressed slices (the handshake itself
// travels over Baton's control socket, control_wire.h), and the region
// descriptors both carry. A message is a fixed header (MessageHeader, in the
// AM header) and a payload (the AM data). Everything a peer sends is validated here before
// the transport acts on it; a malformed message fails the path, never the
// process. Integers are little-endian (the engines of one deployment share an
// architecture; the magic and version catch a mismatch).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "baton/common/status.h"

namespace baton::transport::ucx {

inline constexpr std::uint32_t kWireMagic = 0x4e544142;  // "BATN"
inline constexpr std::uint16_t kWireVersion = 2;  // 2: bundles

// Active message ids (the transport owns its worker, so no one else uses them).
enum class MessageKind : unsigned {
  kQuery = 1,  // initiator → listener, once per lane: binds the lane (payload: the session token)
  // 2–4 (bind answers, region removal, notifications) moved to the control
  // socket (control_wire.h).
  // Compressed slices, which RMA cannot carry (it moves exactly the bytes it
  // is given). header.seq is the initiator's slice id; the payload starts
  // with a SliceDescriptor.
  kWriteData = 5,  // initiator → holder: bytes (compressed or raw) to write at addr
  kWriteDone = 6,  // holder → initiator: written, or why not (text after the descriptor)
  kReadAsk = 7,    // initiator → holder: send [addr, +payload_len), compressed with `codec`
  kReadData = 8,   // holder → initiator: those bytes (compressed or raw), or why not
  // Small raw slices of one lane, posted in one loop turn, travel together
  // and are answered together: over TCP every message is a send and a
  // wake-up on each side, which capped 4 KiB requests at one message and
  // one answer each. Payload: a bundle (encode_bundle); header.seq is 0.
  kSliceBundle = 9,   // initiator → holder: kWriteData / kReadAsk entries
  kReplyBundle = 10,  // holder → initiator: kWriteDone / kReadData entries
};

// How a compressed slice's bytes travel: 0 raw (the codec could not shrink
// them), else the codec that compressed them.
enum class WireCodec : std::uint8_t { kRaw = 0, kLz4 = 1, kZstd = 2 };

// Over TCP a lane's bind is padded to this size: a path whose lanes had
// carried no message this large, cut by a partition and failed by the
// stall timeout (its endpoints force-closed), crashed the initiator when
// the link healed, in UCX 1.13's TCP transport (SIGSEGV under
// uct_tcp_iface_progress: 6 of 6 runs; after a 256 KiB slice on each lane,
// or binds padded so, none of 14). The listener reads the token and skips
// the rest.
inline constexpr std::size_t kBindTokenBytes = sizeof(std::uint64_t);
inline constexpr std::size_t kBindPaddingBytes = 256 * 1024;

struct SliceDescriptor {
  std::uint32_t key = 0;     // the holder's region
  WireCodec codec = WireCodec::kRaw;
  std::uint8_t failed = 0;   // replies: 1 when the holder refused (the text follows)
  std::uint64_t addr = 0;    // in the holder's region
  std::uint64_t payload_len = 0;  // raw bytes, what lands
};
inline constexpr std::size_t kSliceDescriptorBytes = 24;
// A compressed slice is one scheduler slice (256 KiB on TCP by default);
// anything far larger is not ours, and is refused before allocating.
inline constexpr std::uint64_t kMaxCompressedSliceBytes = 64ULL << 20;

struct MessageHeader {
  std::uint32_t magic = kWireMagic;
  std::uint16_t version = kWireVersion;
  std::uint16_t flags = 0;
  std::uint32_t path = 0;  // the initiator's path id, echoed by the listener
  std::uint32_t lane = 0;
  std::uint64_t seq = 0;   // the initiator's query number, echoed in the answer
};
inline constexpr std::size_t kHeaderBytes = 24;

// A region as its owner describes it to peers: the key is the owner's
// RegionHandle, which initiators put in SliceMemory::remote_key.
struct RegionDescriptor {
  std::uint32_t key = 0;
  std::uint64_t base = 0;
  std::uint64_t length = 0;
  // One per rail of the owner (a UCP context per NIC, UcxConfig::nics), in
  // rail order: a lane unpacks the one of the rail it reaches. None: a
  // staged region (UcxTransport::register_staged), reached by messages only.
  std::vector<std::vector<std::uint8_t>> packed_rkeys;
  // Memory allocated by the owner lives in a memfd: its number in the owner
  // and its inode, for a peer on the same host to map it (same_host.h). -1: none.
  std::int32_t memfd = -1;
  std::uint64_t memfd_inode = 0;
  friend bool operator==(const RegionDescriptor&, const RegionDescriptor&) = default;
};

// Bounds on what a peer may send, so a hostile or corrupt message cannot make
// us allocate without limit.
inline constexpr std::uint32_t kMaxRegions = 1 << 16;
inline constexpr std::uint32_t kMaxRkeyBytes = 1 << 16;
// Rails (UCP contexts, one per NIC) an engine may have: what it announces
// per region and in the handshake is bounded by it.
inline constexpr std::size_t kMaxRails = 8;
// Notifications go eager in one message (at most kMaxNotificationBytes);
// the receiver keeps at most this many untaken, and at most this many bytes
// of them (text and sender), dropping the oldest of the peer holding the
// most: 65 536 of 4 KiB held 270 MiB in an engine that never took them.
inline constexpr std::size_t kMaxPendingNotifications = 1 << 16;
inline constexpr std::size_t kMaxPendingNotificationBytes = 16 << 20;

[[nodiscard]] std::vector<std::uint8_t> encode_header(const MessageHeader& header);
[[nodiscard]] Result<MessageHeader> decode_header(std::span<const std::uint8_t> bytes);

[[nodiscard]] std::vector<std::uint8_t> encode_regions(const std::vector<RegionDescriptor>& regions);
[[nodiscard]] Result<std::vector<RegionDescriptor>> decode_regions(std::span<const std::uint8_t> bytes);

[[nodiscard]] std::vector<std::uint8_t> encode_keys(const std::vector<std::uint32_t>& keys);
[[nodiscard]] Result<std::vector<std::uint32_t>> decode_keys(std::span<const std::uint8_t> bytes);

// A descriptor and the bytes after it (written into `into`'s memory, whose
// capacity is reused); decode checks the codec and the size bound and hands
// back where the data starts.
[[nodiscard]] std::vector<std::uint8_t> encode_slice(const SliceDescriptor& d, std::span<const std::uint8_t> data,
                                                   std::vector<std::uint8_t> into = {});
[[nodiscard]] Result<SliceDescriptor> decode_slice(std::span<const std::uint8_t> bytes, std::size_t& data_offset);

// A bundle: u32 count, then per entry u8 kind, u64 seq (the initiator's
// slice id), u32 data bytes, a descriptor and the data. Entries are what a
// kWriteData … kReadData message would carry, one slice each.
struct BundleEntry {
  MessageKind kind = MessageKind::kWriteData;
  std::uint64_t seq = 0;
  SliceDescriptor descriptor;
  std::span<const std::uint8_t> data;  // into the decoded bytes
};
inline constexpr std::size_t kMaxBundleEntries = 256;
inline constexpr std::size_t kBundleEntryBytes = 13 + kSliceDescriptorBytes;  // before its data
// Starts a bundle in `into`'s memory (emptied first), then appends entries.
[[nodiscard]] std::vector<std::uint8_t> begin_bundle(std::vector<std::uint8_t> into = {});
void add_to_bundle(std::vector<std::uint8_t>& bundle, MessageKind kind, std::uint64_t seq, const SliceDescriptor& d,
                   std::span<const std::uint8_t> data);
[[nodiscard]] std::size_t bundle_entries(std::span<const std::uint8_t> bundle);
// Every entry checked (kind 5..8, descriptor as decode_slice, data inside
// the bytes, 1..kMaxBundleEntries entries, nothing after the last).
[[nodiscard]] Result<std::vector<BundleEntry>> decode_bundle(std::span<const std::uint8_t> bytes);


}  // namespace baton::transport::ucx
