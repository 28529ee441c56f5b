// libFuzzer target for the policy file: any YAML must give a policy that
// validate() accepts, or a clear Status — never a crash or an uncaught
// exception from the YAML library.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "baton/sched/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto policy = baton::sched::parse_policy(text, "<fuzz>");
  if (policy) {
    if (!policy->validate().is_ok()) std::abort();  // what the reader accepts is valid
  } else if (policy.error().message().empty()) {
    std::abort();
  }
  return 0;
}
