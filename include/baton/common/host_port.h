// "host:port" split and checked, without resolving the host: the one parser
// for every address a caller gives (listeners, peers, export names).
#pragma once

#include <string_view>

#include "baton/common/status.h"

namespace baton {

// The host and port of "host:port" / "[v6]:port" (the brackets dropped):
// port decimal 0…65535, host not empty, an IPv6 host only in brackets
// ("::1:0" is refused: the address ::1:0 with its port left out, or ::1
// with port 0?). No DNS lookup. invalid_argument names the text and what
// was wrong with it.
struct HostPort {
  std::string_view host;
  unsigned port = 0;
};
[[nodiscard]] Result<HostPort> split_host_port(std::string_view text);

}  // namespace baton
