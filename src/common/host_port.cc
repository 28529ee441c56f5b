#include "baton/common/host_port.h"

#include <charconv>

namespace baton {

Result<HostPort> split_host_port(std::string_view text) {
  // The resolver stops at a NUL: "127.0.0.1\0evil.example:80" would reach
  // 127.0.0.1. Not echoed: the text is not printable.
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    return std::unexpected(Status::invalid_argument("address: a NUL byte at offset {}", nul));
  }
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return std::unexpected(Status::invalid_argument(
        "address \"{}\": expected host:port (e.g. 127.0.0.1:4000)", shown(text)));
  }
  std::string_view host = text.substr(0, colon);
  const std::string_view port_text = text.substr(colon + 1);
  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) host = host.substr(1, host.size() - 2);
  // "::1:0" read as host "::1", port 0 may have meant the address ::1:0
  // (a port left out): only brackets say where an IPv6 host ends.
  if (!bracketed && host.find(':') != std::string_view::npos) {
    return std::unexpected(Status::invalid_argument(
        "address \"{}\": an IPv6 host goes in brackets (e.g. [::1]:4000)", shown(text)));
  }
  if (host.find_first_of("[]") != std::string_view::npos) {
    return std::unexpected(Status::invalid_argument("address \"{}\": unbalanced brackets", shown(text)));
  }
  unsigned port = 0;
  const auto [end, error] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || error != std::errc{} || end != port_text.data() + port_text.size() ||
      port > 65535) {
    return std::unexpected(Status::invalid_argument(
        "address \"{}\": port \"{}\" is not a number in 0..65535", shown(text), shown(port_text)));
  }
  if (host.empty()) return std::unexpected(Status::invalid_argument("address \"{}\": empty host", shown(text)));
  return HostPort{host, port};
}

}  // namespace baton
