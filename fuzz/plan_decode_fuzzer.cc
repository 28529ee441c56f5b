// libFuzzer target for the plan decoder: any bytes a peer can send must give
// a Plan that passes validate() (and can be laid out without overflow) or a
// clear Status — never a crash, a hang or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "baton/plan/plan.h"
#include "baton/plan/slab_layout.h"
#include "baton/plan/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto plan = baton::plan::parse_plan(bytes);
  if (!plan) {
    if (plan.error().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  // What the decoder accepted must be what validate() accepts, and must
  // survive the requester's next step.
  if (!baton::plan::validate(*plan).is_ok()) std::abort();
  if (baton::plan::parse_plan(baton::plan::serialize_plan(*plan)) != plan) std::abort();
  (void)baton::plan::layout_slabs(*plan);
  return 0;
}
