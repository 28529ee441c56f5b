// What a UCX_TLS list lets UCX open, read as UCX 1.13 reads it: empty or
// "all" (only as the whole list) is every transport; "^a,b" every one but
// those named; a name may carry a ":aux" suffix; names are case-sensitive.
#pragma once

#include <algorithm>
#include <string_view>

namespace baton::transport::ucx {

// Whether UCX may open TCP with these transports on this NIC; an RDMA
// device and port ("mlx5_0:1") carries none.
inline bool may_use_tcp(std::string_view tls, std::string_view nic) {
  if (nic.find(':') != std::string_view::npos) return false;
  const bool negated = tls.starts_with('^');
  if (negated) tls.remove_prefix(1);
  if (tls.empty()) return true;  // UCX's default (a bare "^" it refuses anyway)
  if (tls == "all") return !negated;
  bool named = false;
  for (std::size_t at = 0; at <= tls.size();) {
    const std::size_t end = std::min(tls.find(',', at), tls.size());
    const std::string_view name = tls.substr(at, end - at);
    named = named || name.substr(0, name.find(':')) == "tcp";
    at = end + 1;
  }
  return named != negated;
}

}  // namespace baton::transport::ucx
