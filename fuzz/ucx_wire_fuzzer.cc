// libFuzzer target for the UCX transport's message decoders: any bytes a
// peer can send as a header, a region table, a key list or a
// compressed slice's descriptor or a bundle of slices must decode to something that re-encodes to
// the same bytes' meaning, or to a clear Status — never a crash or a huge
// allocation.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "transport/ucx/wire.h"

namespace ucx = baton::transport::ucx;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  if (auto h = ucx::decode_header(bytes)) {
    if (ucx::decode_header(ucx::encode_header(*h)).value().seq != h->seq) std::abort();
  } else if (h.error().message().empty()) {
    std::abort();  // every refusal says why
  }
  if (auto regions = ucx::decode_regions(bytes)) {
    if (ucx::decode_regions(ucx::encode_regions(*regions)).value() != *regions) std::abort();
  }
  if (auto keys = ucx::decode_keys(bytes)) {
    if (ucx::decode_keys(ucx::encode_keys(*keys)).value() != *keys) std::abort();
  }
  std::size_t at = 0;
  if (auto d = ucx::decode_slice(bytes, at)) {
    if (at > size || d->payload_len == 0 || d->payload_len > ucx::kMaxCompressedSliceBytes) std::abort();
    std::size_t again = 0;
    auto round = ucx::decode_slice(ucx::encode_slice(*d, bytes.subspan(at)), again);
    if (!round || round->addr != d->addr || round->key != d->key || again != at) std::abort();
  }
  if (auto entries = ucx::decode_bundle(bytes)) {
    if (entries->empty() || entries->size() > ucx::kMaxBundleEntries) std::abort();
    auto again = ucx::begin_bundle();
    for (const ucx::BundleEntry& e : *entries) {
      if (e.data.data() < data || e.data.data() + e.data.size() > data + size) std::abort();
      ucx::add_to_bundle(again, e.kind, e.seq, e.descriptor, e.data);
    }
    auto round = ucx::decode_bundle(again);
    if (!round || round->size() != entries->size()) std::abort();
    for (std::size_t i = 0; i < round->size(); ++i) {
      const auto& a = (*round)[i];
      const auto& b = (*entries)[i];
      if (a.seq != b.seq || a.kind != b.kind || a.descriptor.addr != b.descriptor.addr ||
          a.data.size() != b.data.size()) {
        std::abort();
      }
    }
  } else if (entries.error().message().empty()) {
    std::abort();
  }
  return 0;
}
