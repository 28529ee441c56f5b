// libFuzzer target for the plan decoder: any bytes a peer can send must give
// a Plan that passes validate() (and can be laid out and rebuilt without
// overflow) or a clear Status — never a crash, a hang or undefined behaviour.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "baton/plan/plan.h"
#include "baton/plan/rebuild.h"
#include "baton/plan/slab_layout.h"
#include "baton/plan/wire.h"

namespace {

// Slabs at a fake address, never touched: the rebuild only computes views.
baton::Result<baton::plan::SlabMemory> fake_slab(int numa, std::uint64_t bytes) {
  if (bytes > (1ull << 40)) return std::unexpected(baton::Status::resource_exhausted("fuzz: slab too large"));
  static std::byte* const kBase = reinterpret_cast<std::byte*>(std::uintptr_t{1} << 44);
  return baton::plan::SlabMemory(kBase, bytes, numa, false, {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto plan = baton::plan::parse_plan(bytes);
  if (!plan) {
    if (plan.error().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  // What the decoder accepted must be what validate() accepts, and must
  // survive the requester's next steps.
  if (!baton::plan::validate(*plan).is_ok()) std::abort();
  if (baton::plan::parse_plan(baton::plan::serialize_plan(*plan)) != plan) std::abort();
  (void)baton::plan::layout_slabs(*plan);
  baton::plan::Rebuilder rebuilder(fake_slab);
  auto rebuilt = rebuilder.rebuild(*plan);
  if (!rebuilt) return 0;
  // Bulk views and single views agree on a bounded corner of the plan.
  const std::uint32_t blocks = std::min<std::uint32_t>(rebuilt->blocks(), 256);
  std::vector<std::byte*> views(blocks);
  for (std::uint32_t slot = 0; slot < std::min<std::uint32_t>(rebuilt->slots(), 4); ++slot) {
    for (std::uint32_t segment = 0; segment < rebuilt->segments_per_slot(); ++segment) {
      rebuilt->views(slot, segment, 0, views);
      for (std::uint32_t b = 0; b < blocks; ++b) {
        if (views[b] != rebuilt->view(b, slot, segment)) std::abort();
      }
    }
  }
  return 0;
}
