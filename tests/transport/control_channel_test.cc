// The control connection's sockets: both ends (dialled and accepted) carry
// TCP keepalive, so a peer that vanished without a FIN or RST (a host gone,
// a partition) ends its path or session instead of holding it for good.
#include "transport/ucx/control_channel.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <thread>

#include "baton/common/socket_address.h"

namespace baton::transport::ucx {
namespace {

int option(int fd, int level, int name) {
  int value = -1;
  socklen_t length = sizeof value;
  EXPECT_EQ(::getsockopt(fd, level, name, &value, &length), 0);
  return value;
}

void expect_keepalive(int fd, const char* end) {
  EXPECT_EQ(option(fd, SOL_SOCKET, SO_KEEPALIVE), 1) << end;
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_KEEPIDLE), kKeepaliveIdleS) << end;
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_KEEPINTVL), kKeepaliveIntervalS) << end;
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_KEEPCNT), kKeepaliveProbes) << end;
  EXPECT_EQ(option(fd, IPPROTO_TCP, TCP_NODELAY), 1) << end;
}

TEST(ControlChannel, BothEndsProbeAnIdlePeerSoOneThatVanishedIsFound) {
  auto at = parse_socket_address("127.0.0.1:0");
  ASSERT_TRUE(at.has_value());
  auto listener = ControlListener::open(*at);
  ASSERT_TRUE(listener.has_value()) << listener.error().to_string();
  auto to = parse_socket_address(listener->address());
  ASSERT_TRUE(to.has_value());
  auto dialled = ControlConnection::dial(*to);
  ASSERT_TRUE(dialled.has_value()) << dialled.error().to_string();
  std::unique_ptr<ControlConnection> accepted;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!accepted && std::chrono::steady_clock::now() < until) {
    pollfd ready{listener->fd(), POLLIN, 0};
    (void)::poll(&ready, 1, 100);
    accepted = listener->accept();
  }
  ASSERT_NE(accepted, nullptr) << "no connection to accept within 5 s";
  expect_keepalive((*dialled)->fd(), "dialled");
  expect_keepalive(accepted->fd(), "accepted");
}

}  // namespace
}  // namespace baton::transport::ucx
