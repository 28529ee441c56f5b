// The control channel's wire form: what engines say over Baton's own TCP
// handshake socket (control_channel.h). Private to transport/ucx.
//
// A frame is a 4-byte little-endian body length, a 1-byte kind and the body.
// The length is checked against a bound before anything is allocated; the
// bound is small (kMaxHandshakeFrameBytes) until the peer proved the
// deployment secret. Every decoder checks every length and count against
// what is left, so a hostile or truncated body fails with a Status.
//
//   listener                              initiator
//   kChallenge{server nonce}        →
//                                   ←     kHello{client nonce, proof, name, lanes, worker addresses}
//   kWelcome{proof, session token,  →     (or kRefusal{why}, then close)
//            worker addresses, pid and
//            cookie, regions}
//   -- each side creates UCP endpoints from the other's worker addresses, lane
//      i from our rail i mod (our rails) to its rail i mod (its rails) (the
//      listener answers slices on its own); the initiator binds each lane
//      with the session token (an active message, wire.h) --
//                                   ←     kDirect{pid, cookie} (a same-host initiator)
//   kDirectAnswer{confirmed}        →     (it copies by address only if confirmed)
//   kReady (every lane bound)       →     (ready once both arrived)
//   kRegions / kRevoke              →     ←  kRefresh / kRevokeAck / kNotify
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "baton/common/status.h"
#include "transport/ucx/wire.h"

namespace baton::transport::ucx {

// 4: a region may come without rkeys (staged: reached by messages only).
// 5: the proof covers the lane count, and the name by its length.
// 6: over TCP a lane's bind is padded (wire.h, kBindPaddingBytes).
// 7: kDirect.
// 8: kDirectAnswer (the initiator copies directly only once the listener
//    confirmed its pid, so that the listener waits for it at a revocation).
inline constexpr std::uint16_t kControlVersion = 8;
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;  // HMAC-SHA256
using Nonce = std::array<std::uint8_t, kNonceBytes>;
using Proof = std::array<std::uint8_t, kProofBytes>;
inline constexpr std::size_t kCookieBytes = 16;
using Cookie = std::array<std::uint8_t, kCookieBytes>;  // same_host.h

inline constexpr std::size_t kFrameHeaderBytes = 5;
// Before the peer proved the secret: a hello with a worker address per rail
// (200 bytes for TCP and shared memory here; more with RDMA devices).
inline constexpr std::uint32_t kMaxHandshakeFrameBytes = 16U << 10;
// After: a region list (a packed rkey is tens of bytes on TCP, hundreds on RDMA).
inline constexpr std::uint32_t kMaxFrameBytes = 16U << 20;
inline constexpr std::size_t kMaxNameBytes = 256;
inline constexpr std::size_t kMaxWorkerAddressBytes = 7U << 10;
inline constexpr std::size_t kMaxReasonBytes = 1024;
inline constexpr std::uint16_t kMaxLanes = 64;

enum class ControlKind : std::uint8_t {
  kChallenge = 1,  // listener → initiator
  kHello = 2,      // initiator → listener
  kWelcome = 3,    // listener → initiator: authenticated
  kRefusal = 4,    // listener → initiator: why not, then close
  kRegions = 5,    // listener → initiator: the regions exported to you now (all of them)
  kRefresh = 6,    // initiator → listener: send kRegions with this seq
  kRevoke = 7,     // listener → initiator: forget these regions, then acknowledge
  kRevokeAck = 8,  // initiator → listener: nothing of mine can still touch them
  kNotify = 9,     // initiator → listener: a user's message (after a batch)
  kReady = 10,     // listener → initiator: every lane is bound, slices may flow
  kDirect = 11,    // initiator → listener: it would copy into our memory itself, from this pid of this host
  kDirectAnswer = 12,  // listener → initiator: whether it confirmed that pid (and will wait for it)
};

struct Frame {
  ControlKind kind = ControlKind::kChallenge;
  std::vector<std::uint8_t> body;
};

struct Challenge {
  Nonce nonce{};
};
struct Hello {
  Nonce nonce{};
  Proof proof{};
  std::string name;  // the initiator's own listen address, for logs and exports
  std::uint16_t lanes = 0;
  // One per rail (UcxConfig::nics), in rail order: the listener answers
  // slices there.
  std::vector<std::vector<std::uint8_t>> worker_addresses;
};
struct Welcome {
  Proof proof{};
  std::uint64_t session = 0;  // binds the initiator's lanes (kQuery carries it)
  std::vector<std::vector<std::uint8_t>> worker_addresses;  // one per rail
  // For a peer on this host: the listener's pid and where its cookie lies
  // (same_host.h); the initiator reads it to know it can copy directly.
  std::uint32_t pid = 0;
  std::uint64_t cookie_address = 0;
  Cookie cookie{};
  std::vector<RegionDescriptor> regions;
};
// kDirect: the initiator's pid and where its own cookie lies, which the
// listener reads back before it believes the pid (a peer could name any).
struct Direct {
  std::uint64_t pid = 0;
  std::uint64_t cookie_address = 0;
  Cookie cookie{};
};
struct Regions {
  std::uint64_t seq = 0;  // a kRefresh's, or 0 when the listener's exports changed
  std::vector<RegionDescriptor> regions;
};
struct Revoke {
  std::uint64_t seq = 0;
  std::vector<std::uint32_t> keys;
};

[[nodiscard]] std::vector<std::uint8_t> encode_frame(ControlKind kind, std::span<const std::uint8_t> body);
// The first whole frame of `bytes`, `taken` set to the bytes it spans:
// nullopt while it is incomplete; invalid_argument for an unknown kind or a
// body over `max_body` (known from the length alone, before the body
// arrived).
[[nodiscard]] Result<std::optional<Frame>> take_frame(std::span<const std::uint8_t> bytes, std::size_t& taken,
                                                      std::uint32_t max_body);
// The same, erased off the front of `buffer`.
[[nodiscard]] Result<std::optional<Frame>> take_frame(std::vector<std::uint8_t>& buffer, std::uint32_t max_body);
// Whether `bytes` start with a whole frame (its header's length alone).
[[nodiscard]] bool whole_frame(std::span<const std::uint8_t> bytes);

[[nodiscard]] std::vector<std::uint8_t> encode(const Challenge& m);
[[nodiscard]] std::vector<std::uint8_t> encode(const Hello& m);
[[nodiscard]] std::vector<std::uint8_t> encode(const Welcome& m);
[[nodiscard]] std::vector<std::uint8_t> encode(const Regions& m);
[[nodiscard]] std::vector<std::uint8_t> encode(const Revoke& m);
[[nodiscard]] std::vector<std::uint8_t> encode(const Direct& m);
[[nodiscard]] std::vector<std::uint8_t> encode_flag(bool flag);                 // kDirectAnswer
[[nodiscard]] std::vector<std::uint8_t> encode_seq(std::uint64_t seq);          // kRefresh, kRevokeAck
[[nodiscard]] std::vector<std::uint8_t> encode_text(std::string_view text);     // kRefusal, kNotify

[[nodiscard]] Result<Challenge> decode_challenge(std::span<const std::uint8_t> body);
[[nodiscard]] Result<Hello> decode_hello(std::span<const std::uint8_t> body);
// What an initiator's proof covers beside the nonces: every field of its
// hello, each length-prefixed so that no bytes can move from one to another
// on the way (a name holding "|5:" could take a rail's address).
[[nodiscard]] std::string hello_description(const Hello& hello);
[[nodiscard]] Result<Welcome> decode_welcome(std::span<const std::uint8_t> body);
[[nodiscard]] Result<Regions> decode_regions_update(std::span<const std::uint8_t> body);
[[nodiscard]] Result<Revoke> decode_revoke(std::span<const std::uint8_t> body);
[[nodiscard]] Result<std::uint64_t> decode_seq(std::span<const std::uint8_t> body);
[[nodiscard]] Result<Direct> decode_direct(std::span<const std::uint8_t> body);
[[nodiscard]] Result<bool> decode_flag(std::span<const std::uint8_t> body);
[[nodiscard]] Result<std::string> decode_text(std::span<const std::uint8_t> body, std::size_t max_bytes);

}  // namespace baton::transport::ucx
