#include "baton/transport/transport.h"

#include <fmt/format.h>

namespace baton::transport {

std::string PathInfo::name() const {
  return fmt::format("{}->{}/{}", from, to, topology::to_string(type));
}

}  // namespace baton::transport
