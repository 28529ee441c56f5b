// UCX_TLS lists read as UCX 1.13 reads them (checked against ucp_init):
// which of them let TCP open, so Baton sets its TCP settings only there.
#include "transport/ucx/tls_list.h"

#include <gtest/gtest.h>

#include <string_view>
#include <utility>

namespace baton::transport::ucx {
namespace {

TEST(TlsList, TcpMayOpenWhereUcxWouldOpenIt) {
  for (const auto& [tls, tcp] : {std::pair<std::string_view, bool>{"", true},
                                 {"all", true},
                                 {"tcp", true},
                                 {"sm,tcp", true},
                                 {"sm,tcp:aux", true},
                                 {"tcp,^rc", true},  // the '^' only counts first
                                 {"^rc,ud", true},   // everything but those: TCP opens ("^rc" ran over TCP)
                                 {"^ud:aux,tcp", false},
                                 {"^tcp", false},
                                 {"^all", false},
                                 {"sm", false},
                                 {"sm,all", false},  // "all" is every transport only as the whole list
                                 {"TCP", false},     // names are case-sensitive
                                 {"tcpx,rc", false},
                                 {"rc_x,ud_x", false}}) {
    EXPECT_EQ(may_use_tcp(tls, ""), tcp) << '"' << tls << '"';
    EXPECT_EQ(may_use_tcp(tls, "eth0"), tcp) << '"' << tls << "\" on eth0";
    EXPECT_FALSE(may_use_tcp(tls, "mlx5_0:1")) << '"' << tls << "\" on an RDMA port";
  }
}

}  // namespace
}  // namespace baton::transport::ucx
