#include "baton/common/socket_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace baton {

Result<SocketAddress> parse_socket_address(std::string_view text) {
  auto split = split_host_port(text);
  if (!split) return std::unexpected(split.error());
  const auto [host, port] = *split;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string host_z(host);
  const std::string port_z = std::to_string(port);
  if (const int rc = getaddrinfo(host_z.c_str(), port_z.c_str(), &hints, &found); rc != 0) {
    return std::unexpected(Status::invalid_argument("address \"{}\": cannot resolve host \"{}\": {}",
                                                    shown(text), shown(host), gai_strerror(rc)));
  }
  SocketAddress out;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) && a->ai_addrlen <= sizeof(out.storage)) {
      std::memcpy(&out.storage, a->ai_addr, a->ai_addrlen);
      out.length = a->ai_addrlen;
      break;
    }
  }
  freeaddrinfo(found);
  if (out.length == 0) {
    return std::unexpected(
        Status::invalid_argument("address \"{}\": host \"{}\" has no IPv4 or IPv6 address", shown(text), shown(host)));
  }
  return out;
}

std::string format_socket_address(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "?";
}

int port_of(const sockaddr* address) {
  if (address->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(address)->sin_port);
  if (address->sa_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(address)->sin6_port);
  }
  return -1;
}

bool is_wildcard(const sockaddr* address) {
  return (address->sa_family == AF_INET &&
          reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr == INADDR_ANY) ||
         (address->sa_family == AF_INET6 &&
          IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr));
}

std::string reachable_address(const sockaddr* listen, const sockaddr* local) {
  if (!is_wildcard(listen) || (local->sa_family != AF_INET && local->sa_family != AF_INET6)) {
    return format_socket_address(listen);
  }
  sockaddr_storage named{};
  std::memcpy(&named, local, local->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  const auto port = htons(static_cast<std::uint16_t>(port_of(listen)));
  if (local->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(&named)->sin_port = port;
  else reinterpret_cast<sockaddr_in6*>(&named)->sin6_port = port;
  return format_socket_address(reinterpret_cast<const sockaddr*>(&named));
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

Result<int> listen_tcp(const SocketAddress& at, int backlog) {
  const int fd = ::socket(at.get()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::unexpected(Status::unavailable("socket: {}", std::strerror(errno)));
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, at.get(), at.length) != 0 || ::listen(fd, backlog) != 0) {
    const int error = errno;
    ::close(fd);
    return std::unexpected(
        Status::unavailable("cannot listen on {}: {}", format_socket_address(at.get()), std::strerror(error)));
  }
  return fd;
}

Result<SocketAddress> bound_address(int fd) {
  SocketAddress bound;
  bound.length = sizeof bound.storage;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound.storage), &bound.length) != 0) {
    return std::unexpected(Status::unavailable("getsockname: {}", std::strerror(errno)));
  }
  return bound;
}

}  // namespace baton
