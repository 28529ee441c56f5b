#include "transport/ucx/control_wire.h"

#include "transport/ucx/bytes.h"

namespace baton::transport::ucx {
namespace {

template <typename... Args>
std::unexpected<Status> bad(fmt::format_string<Args...> format, Args&&... args) {
  return std::unexpected(Status::invalid_argument("control channel: {}", fmt::format(format, std::forward<Args>(args)...)));
}

// Magic and version open the first frame each side sends, so a stranger's
// bytes (or another program's) are told apart at once.
void put_preamble(Writer& w) {
  w.put(kWireMagic);
  w.put(kControlVersion);
}

Status check_preamble(Reader& r, std::string_view what) {
  std::uint32_t magic = 0;
  std::uint16_t version = 0;
  if (!r.get(magic) || !r.get(version)) {
    return Status::invalid_argument("control channel: {} of {} bytes is truncated", what, r.left() + r.offset());
  }
  if (magic != kWireMagic) {
    return Status::invalid_argument("control channel: {} has magic {:#x} (expected {:#x}): not a Baton peer", what,
                                    magic, kWireMagic);
  }
  if (version != kControlVersion) {
    return Status::invalid_argument("control channel: {} speaks version {} (expected {})", what, version,
                                    kControlVersion);
  }
  return Status::ok();
}

template <std::size_t N>
bool get_array(Reader& r, std::array<std::uint8_t, N>& out) {
  if (r.left() < N) return false;
  std::memcpy(out.data(), r.rest().data(), N);
  return r.skip(N);
}

// A u32 length and that many bytes, at most `max`.
bool get_blob(Reader& r, std::size_t max, std::vector<std::uint8_t>& out) {
  std::uint32_t n = 0;
  return r.get(n) && n <= max && r.bytes(n, out);
}

void put_blob(Writer& w, std::span<const std::uint8_t> b) {
  w.put(static_cast<std::uint32_t>(b.size()));
  w.bytes(b);
}

// A u8 count (1..kMaxRails) of worker addresses, each a non-empty blob.
void put_addresses(Writer& w, const std::vector<std::vector<std::uint8_t>>& addresses) {
  w.put(static_cast<std::uint8_t>(addresses.size()));
  for (const auto& a : addresses) put_blob(w, a);
}

bool get_addresses(Reader& r, std::vector<std::vector<std::uint8_t>>& out) {
  std::uint8_t count = 0;
  if (!r.get(count) || count == 0 || count > kMaxRails) return false;
  out.resize(count);
  for (auto& a : out) {
    if (!get_blob(r, kMaxWorkerAddressBytes, a) || a.empty()) return false;
  }
  return true;
}

std::span<const std::uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

}  // namespace

std::vector<std::uint8_t> encode_frame(ControlKind kind, std::span<const std::uint8_t> body) {
  Writer w;
  w.put(static_cast<std::uint32_t>(body.size()));
  w.put(static_cast<std::uint8_t>(kind));
  w.bytes(body);
  return w.take();
}

Result<std::optional<Frame>> take_frame(std::span<const std::uint8_t> buffer, std::size_t& taken,
                                        std::uint32_t max_body) {
  taken = 0;
  if (buffer.size() < kFrameHeaderBytes) return std::optional<Frame>{};
  Reader r(buffer);
  std::uint32_t length = 0;
  std::uint8_t kind = 0;
  r.get(length);
  r.get(kind);
  if (kind < static_cast<std::uint8_t>(ControlKind::kChallenge) ||
      kind > static_cast<std::uint8_t>(ControlKind::kDirectAnswer)) {
    // Most often another program answered (an HTTP server's "HTTP/1.1 ..."):
    // the bytes say who, where a kind number would not.
    return bad("unknown frame kind {} in bytes \"{}\": not a Baton peer, or a corrupt stream", kind,
               shown({reinterpret_cast<const char*>(buffer.data()), buffer.size()}, 16));
  }
  if (length > max_body) return bad("a frame of {} bytes (at most {} here)", length, max_body);
  if (r.left() < length) return std::optional<Frame>{};
  Frame frame{static_cast<ControlKind>(kind), {}};
  r.bytes(length, frame.body);
  taken = kFrameHeaderBytes + length;
  return std::optional<Frame>(std::move(frame));
}

Result<std::optional<Frame>> take_frame(std::vector<std::uint8_t>& buffer, std::uint32_t max_body) {
  std::size_t taken = 0;
  auto frame = take_frame(std::span<const std::uint8_t>(buffer), taken, max_body);
  buffer.erase(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(taken));
  return frame;
}

bool whole_frame(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < kFrameHeaderBytes) return false;
  Reader r(bytes);
  std::uint32_t length = 0;
  r.get(length);
  return bytes.size() - kFrameHeaderBytes >= length;
}

std::vector<std::uint8_t> encode(const Challenge& m) {
  Writer w;
  put_preamble(w);
  w.bytes(m.nonce);
  return w.take();
}

std::vector<std::uint8_t> encode(const Hello& m) {
  Writer w;
  put_preamble(w);
  w.bytes(m.nonce);
  w.bytes(m.proof);
  w.put(m.lanes);
  put_blob(w, as_bytes(m.name));
  put_addresses(w, m.worker_addresses);
  return w.take();
}

std::vector<std::uint8_t> encode(const Welcome& m) {
  Writer w;
  w.bytes(m.proof);
  w.put(m.session);
  put_addresses(w, m.worker_addresses);
  w.put(m.pid);
  w.put(m.cookie_address);
  w.bytes(m.cookie);
  w.bytes(encode_regions(m.regions));
  return w.take();
}

std::vector<std::uint8_t> encode(const Regions& m) {
  Writer w;
  w.put(m.seq);
  w.bytes(encode_regions(m.regions));
  return w.take();
}

std::vector<std::uint8_t> encode(const Revoke& m) {
  Writer w;
  w.put(m.seq);
  w.bytes(encode_keys(m.keys));
  return w.take();
}

std::vector<std::uint8_t> encode(const Direct& m) {
  Writer w;
  w.put(m.pid);
  w.put(m.cookie_address);
  w.bytes(m.cookie);
  return w.take();
}

std::vector<std::uint8_t> encode_flag(bool flag) { return {static_cast<std::uint8_t>(flag ? 1 : 0)}; }

std::vector<std::uint8_t> encode_seq(std::uint64_t seq) {
  Writer w;
  w.put(seq);
  return w.take();
}

std::vector<std::uint8_t> encode_text(std::string_view text) {
  const auto b = as_bytes(text);
  return {b.begin(), b.end()};
}

Result<Challenge> decode_challenge(std::span<const std::uint8_t> body) {
  Reader r(body);
  if (Status s = check_preamble(r, "challenge"); !s.is_ok()) return std::unexpected(s);
  Challenge m;
  if (!get_array(r, m.nonce) || r.left() != 0) return bad("challenge of {} bytes (expected {})", body.size(), 6 + kNonceBytes);
  return m;
}

Result<Hello> decode_hello(std::span<const std::uint8_t> body) {
  Reader r(body);
  if (Status s = check_preamble(r, "hello"); !s.is_ok()) return std::unexpected(s);
  Hello m;
  std::vector<std::uint8_t> name;
  if (!get_array(r, m.nonce) || !get_array(r, m.proof) || !r.get(m.lanes) || !get_blob(r, kMaxNameBytes, name) ||
      !get_addresses(r, m.worker_addresses) || r.left() != 0) {
    return bad("malformed hello of {} bytes (a name is at most {} bytes; 1..{} worker addresses of 1..{} bytes)",
               body.size(), kMaxNameBytes, kMaxRails, kMaxWorkerAddressBytes);
  }
  if (m.lanes == 0 || m.lanes > kMaxLanes) return bad("hello asks for {} lanes (expected 1..{})", m.lanes, kMaxLanes);
  m.name.assign(name.begin(), name.end());
  return m;
}

Result<Welcome> decode_welcome(std::span<const std::uint8_t> body) {
  Reader r(body);
  Welcome m;
  if (!get_array(r, m.proof) || !r.get(m.session) || !get_addresses(r, m.worker_addresses) || !r.get(m.pid) ||
      !r.get(m.cookie_address) || !get_array(r, m.cookie)) {
    return bad("malformed welcome of {} bytes (1..{} worker addresses of 1..{} bytes)", body.size(), kMaxRails,
               kMaxWorkerAddressBytes);
  }
  auto regions = decode_regions(r.rest());
  if (!regions) return std::unexpected(regions.error());
  m.regions = std::move(*regions);
  return m;
}

Result<Regions> decode_regions_update(std::span<const std::uint8_t> body) {
  Reader r(body);
  Regions m;
  if (!r.get(m.seq)) return bad("region list of {} bytes has no sequence number", body.size());
  auto regions = decode_regions(r.rest());
  if (!regions) return std::unexpected(regions.error());
  m.regions = std::move(*regions);
  return m;
}

Result<Revoke> decode_revoke(std::span<const std::uint8_t> body) {
  Reader r(body);
  Revoke m;
  if (!r.get(m.seq)) return bad("revocation of {} bytes has no sequence number", body.size());
  auto keys = decode_keys(r.rest());
  if (!keys) return std::unexpected(keys.error());
  m.keys = std::move(*keys);
  return m;
}

Result<std::uint64_t> decode_seq(std::span<const std::uint8_t> body) {
  Reader r(body);
  std::uint64_t seq = 0;
  if (!r.get(seq) || r.left() != 0) return bad("a sequence number of {} bytes (expected 8)", body.size());
  return seq;
}

Result<Direct> decode_direct(std::span<const std::uint8_t> body) {
  Reader r(body);
  Direct m;
  if (!r.get(m.pid) || !r.get(m.cookie_address) || !get_array(r, m.cookie) || r.left() != 0) {
    return bad("a direct-copy declaration of {} bytes (expected {})", body.size(), 16 + kCookieBytes);
  }
  return m;
}

Result<bool> decode_flag(std::span<const std::uint8_t> body) {
  if (body.size() != 1) return bad("a flag of {} bytes (expected 1)", body.size());
  if (body[0] > 1) return bad("a flag of {} (expected 0 or 1)", body[0]);
  return body[0] == 1;
}

Result<std::string> decode_text(std::span<const std::uint8_t> body, std::size_t max_bytes) {
  if (body.size() > max_bytes) return bad("a text of {} bytes (at most {})", body.size(), max_bytes);
  return std::string(body.begin(), body.end());
}

std::string hello_description(const Hello& hello) {
  std::string out = fmt::format("{}:{}|lanes {}", hello.name.size(), hello.name, hello.lanes);
  for (const auto& a : hello.worker_addresses) {
    out += fmt::format("|{}:", a.size());
    out.append(a.begin(), a.end());
  }
  return out;
}

}  // namespace baton::transport::ucx
