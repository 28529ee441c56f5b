// "host:port" ↔ sockaddr, resolved: for the listeners (the engine's, its
// metrics endpoint's, the store's) and for connect.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "baton/common/host_port.h"
#include "baton/common/status.h"

namespace baton {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  [[nodiscard]] const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// "127.0.0.1:4000", "[::1]:4000", "node7:4000" (resolved with getaddrinfo,
// first IPv4 or IPv6 answer). Port: decimal 0…65535. invalid_argument names
// the text and what was wrong with it.
[[nodiscard]] Result<SocketAddress> parse_socket_address(std::string_view host_port);

// "127.0.0.1:4000" / "[::1]:4000".
[[nodiscard]] std::string format_socket_address(const sockaddr* address);

[[nodiscard]] int port_of(const sockaddr* address);

// A TCP socket bound to `at` and listening: nonblocking, close-on-exec,
// SO_REUSEADDR (a restart while old connections sit in TIME_WAIT) but not
// SO_REUSEPORT (a second listener on a taken port is refused, not handed
// half the connections). The caller owns the fd. unavailable says why
// ("cannot listen on 127.0.0.1:80: Permission denied").
[[nodiscard]] Result<int> listen_tcp(const SocketAddress& at, int backlog);

// The address a socket is bound to (its real port after binding port 0).
[[nodiscard]] Result<SocketAddress> bound_address(int fd);

// 127.0.0.0/8, ::1 or an IPv4-mapped 127.x: reachable from this host only.
[[nodiscard]] bool is_loopback(const sockaddr* address);

// 0.0.0.0 or ::, any port: every interface, no host a peer could name.
[[nodiscard]] bool is_wildcard(const sockaddr* address);

// A listen address as a peer can name it: `listen` itself, or, where its
// host is a wildcard (0.0.0.0, ::), which names no host, `local`'s host (a
// connected socket's own address: the interface this host reaches that
// peer through) with `listen`'s port.
[[nodiscard]] std::string reachable_address(const sockaddr* listen, const sockaddr* local);

}  // namespace baton
