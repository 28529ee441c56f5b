// libFuzzer target for the `nvidia-smi topo -m` parser: any text a user or a
// tool hands `baton topo --nvidia-smi` must give topology facts or a clear
// Status naming the line — never a crash, an uncaught exception or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "baton/topology/probe.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto facts = baton::topology::parse_nvidia_smi_topo(text);
  if (!facts && facts.error().message().empty()) std::abort();
  return 0;
}
