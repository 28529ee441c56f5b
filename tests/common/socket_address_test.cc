#include "baton/common/socket_address.h"

#include <unistd.h>

#include <gtest/gtest.h>

namespace baton {
namespace {

TEST(SocketAddress, ParsesAndFormats) {
  auto a = parse_socket_address("127.0.0.1:4000");
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  EXPECT_EQ(format_socket_address(a->get()), "127.0.0.1:4000");
  EXPECT_EQ(port_of(a->get()), 4000);
  EXPECT_TRUE(is_loopback(a->get()));
  auto v6 = parse_socket_address("[::1]:0");
  ASSERT_TRUE(v6.has_value()) << v6.error().to_string();
  EXPECT_EQ(format_socket_address(v6->get()), "[::1]:0");
  EXPECT_TRUE(is_loopback(v6->get()));
  auto any = parse_socket_address("0.0.0.0:1");
  ASSERT_TRUE(any.has_value());
  EXPECT_FALSE(is_loopback(any->get()));
}

TEST(SocketAddress, AWildcardListenerIsNamedByTheInterfaceItReachesAPeerThrough) {
  auto address = [](const char* text) {
    auto a = parse_socket_address(text);
    EXPECT_TRUE(a.has_value()) << text;
    return a.value_or(SocketAddress{});
  };
  const auto local = address("10.1.2.3:45678");  // a connected socket's own end
  EXPECT_EQ(reachable_address(address("0.0.0.0:7000").get(), local.get()), "10.1.2.3:7000");
  EXPECT_EQ(reachable_address(address("[::]:7000").get(), local.get()), "10.1.2.3:7000");
  EXPECT_EQ(reachable_address(address("[::]:7000").get(), address("[fd00::5]:1").get()), "[fd00::5]:7000");
  // A listen address with a host names itself, whatever the socket.
  EXPECT_EQ(reachable_address(address("127.0.0.1:7000").get(), local.get()), "127.0.0.1:7000");
  EXPECT_EQ(reachable_address(address("10.9.9.9:7000").get(), local.get()), "10.9.9.9:7000");
  const SocketAddress unknown;  // not a socket address: the listen address stands
  EXPECT_EQ(reachable_address(address("0.0.0.0:7000").get(), unknown.get()), "0.0.0.0:7000");
}

TEST(SocketAddress, RefusesWhatIsNotAnAddress) {
  // ".invalid" never resolves (RFC 6761), with or without a resolver.
  for (const char* bad : {"", "127.0.0.1", ":4000", "127.0.0.1:", "127.0.0.1:xx", "127.0.0.1:65536",
                          "127.0.0.1:-1", "127.0.0.1:40 00", "no-such-host.invalid:4000", "::1:0", "fe80::1:4000",
                          "[::1:0", "::1]:0", "[[::1]]:0", "[::1]x:0"}) {
    auto r = parse_socket_address(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find(bad), std::string::npos) << r.error().message();
  }
  // The resolver stops at a NUL: this would reach 127.0.0.1.
  const std::string nul("127.0.0.1\0evil.example:80", 25);
  auto r = parse_socket_address(nul);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("NUL"), std::string::npos) << r.error().message();
  EXPECT_FALSE(split_host_port(nul).has_value());
  // A caller's 100 KB address comes back cut, not whole in the message.
  for (const std::string& huge : {std::string(100'000, 'a'), std::string(100'000, 'a') + ":80"}) {
    auto h = parse_socket_address(huge);
    ASSERT_FALSE(h.has_value());
    EXPECT_LT(h.error().message().size(), 400u) << h.error().message().substr(0, 400);
  }
}

// A listener bound to port 0 reports its real port; a second one on that
// port is refused saying why, and a socket that is not one is an error,
// not a crash.
TEST(SocketAddress, ListensAndSaysWhyItCannot) {
  auto any = parse_socket_address("127.0.0.1:0");
  ASSERT_TRUE(any.has_value());
  auto fd = listen_tcp(*any, 4);
  ASSERT_TRUE(fd.has_value()) << fd.error().to_string();
  auto bound = bound_address(*fd);
  ASSERT_TRUE(bound.has_value()) << bound.error().to_string();
  EXPECT_NE(port_of(bound->get()), 0);
  auto taken = listen_tcp(*bound, 4);
  ASSERT_FALSE(taken.has_value());
  EXPECT_EQ(taken.error().code(), StatusCode::kUnavailable);
  EXPECT_EQ(taken.error().message(),
            "cannot listen on " + format_socket_address(bound->get()) + ": Address already in use");
  ::close(*fd);
  auto none = bound_address(-1);
  ASSERT_FALSE(none.has_value());
  EXPECT_EQ(none.error().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace baton
