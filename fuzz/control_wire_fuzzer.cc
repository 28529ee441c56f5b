// libFuzzer target for the control channel (Baton's handshake socket): any
// byte stream a connection can carry is cut into frames under both bounds
// (before and after authentication) and every frame body goes through every
// message decoder. Each must end in a message that re-encodes to the same
// meaning or in a Status that says why — never a crash, a hang or an
// allocation beyond the frame bound.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "transport/ucx/control_wire.h"

namespace ucx = baton::transport::ucx;

namespace {

void decode_all(std::span<const std::uint8_t> body) {
  if (auto m = ucx::decode_challenge(body)) {
    if (ucx::decode_challenge(ucx::encode(*m)).value().nonce != m->nonce) std::abort();
  }
  if (auto m = ucx::decode_hello(body)) {
    auto back = ucx::decode_hello(ucx::encode(*m));
    if (!back || back->name != m->name || back->lanes != m->lanes || back->proof != m->proof) std::abort();
    if (m->lanes == 0 || m->lanes > ucx::kMaxLanes || m->name.size() > ucx::kMaxNameBytes) std::abort();
  }
  if (auto m = ucx::decode_welcome(body)) {
    auto back = ucx::decode_welcome(ucx::encode(*m));
    if (!back || back->regions != m->regions || back->worker_addresses != m->worker_addresses) std::abort();
  }
  if (auto m = ucx::decode_regions_update(body)) {
    if (ucx::decode_regions_update(ucx::encode(*m)).value().regions != m->regions) std::abort();
  }
  if (auto m = ucx::decode_revoke(body)) {
    if (ucx::decode_revoke(ucx::encode(*m)).value().keys != m->keys) std::abort();
  }
  if (auto seq = ucx::decode_seq(body)) {
    if (ucx::decode_seq(ucx::encode_seq(*seq)).value() != *seq) std::abort();
  }
  if (auto text = ucx::decode_text(body, ucx::kMaxReasonBytes)) {
    if (text->size() > ucx::kMaxReasonBytes) std::abort();
  }
}

void cut(const std::uint8_t* data, std::size_t size, std::uint32_t bound) {
  std::vector<std::uint8_t> buffer(data, data + size);
  for (;;) {
    const std::size_t before = buffer.size();
    auto frame = ucx::take_frame(buffer, bound);
    if (!frame) {
      if (frame.error().message().empty()) std::abort();  // every refusal says why
      return;
    }
    if (!*frame) return;  // incomplete: waits for more bytes
    if ((*frame)->body.size() > bound || buffer.size() >= before) std::abort();
    decode_all((*frame)->body);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cut(data, size, ucx::kMaxHandshakeFrameBytes);
  cut(data, size, ucx::kMaxFrameBytes);
  return 0;
}
