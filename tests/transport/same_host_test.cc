// The same-host copy's pieces on their own: the cookie proof, memfd
// allocations mapped by "a peer" (this process through /proc), CMA, and what
// each says when the peer is not what it claims or is gone.
#include "transport/ucx/same_host.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <vector>

namespace baton::transport::ucx {
namespace {

// A pid that was a process and is not one now.
pid_t reaped_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

TEST(SameHost, TheCookieProvesTheProcessAndNothingElseDoes) {
  const Cookie cookie{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const auto where = reinterpret_cast<std::uint64_t>(cookie.data());
  EXPECT_TRUE(cookie_matches(getpid(), where, cookie));
  Cookie other = cookie;
  other[15] = 0;
  EXPECT_FALSE(cookie_matches(getpid(), where, other));
  EXPECT_FALSE(cookie_matches(getpid(), 0, cookie));
  EXPECT_FALSE(cookie_matches(getpid(), 8, cookie));  // not mapped
  EXPECT_FALSE(cookie_matches(0, where, cookie));
  EXPECT_FALSE(cookie_matches(-1, where, cookie));
  EXPECT_FALSE(cookie_matches(reaped_pid(), where, cookie));
}

TEST(SameHost, AnAllocationIsMappedByAPeerThroughItsMemfd) {
  auto a = SharedAllocation::create(1 << 20);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  std::memset(a->mapping->address(), 0x5a, 1 << 20);
  auto m = map_peer_memfd(getpid(), a->fd.get(), a->inode, 1 << 20);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_NE(m->address(), a->mapping->address());  // a second mapping of the same pages
  EXPECT_EQ(m->address()[12345], std::byte{0x5a});
  m->address()[7] = std::byte{0x11};
  EXPECT_EQ(a->mapping->address()[7], std::byte{0x11});
}

TEST(SameHost, AMappingOfTheWrongFileOrSizeOrPeerIsRefused) {
  auto a = SharedAllocation::create(4096);
  ASSERT_TRUE(a.has_value());
  auto wrong_inode = map_peer_memfd(getpid(), a->fd.get(), a->inode + 1, 4096);
  ASSERT_FALSE(wrong_inode.has_value());
  EXPECT_EQ(wrong_inode.error().code(), StatusCode::kUnavailable);
  EXPECT_NE(wrong_inode.error().message().find("expected inode"), std::string::npos) << wrong_inode.error().message();
  EXPECT_FALSE(map_peer_memfd(getpid(), a->fd.get(), a->inode, 8192).has_value());  // longer than the file
  EXPECT_FALSE(map_peer_memfd(getpid(), 0, a->inode, 4096).has_value());        // stdin is not it
  EXPECT_FALSE(map_peer_memfd(getpid(), 99999, a->inode, 4096).has_value());
  EXPECT_FALSE(map_peer_memfd(reaped_pid(), a->fd.get(), a->inode, 4096).has_value());
}

TEST(SameHost, CmaCopiesBothWaysAndNamesAGonePeer) {
  std::vector<std::uint8_t> there(3 << 20, 7);
  std::vector<std::uint8_t> here(there.size(), 0);
  const auto remote = reinterpret_cast<std::uint64_t>(there.data());
  ASSERT_TRUE(cma_copy(getpid(), Op::kRead, here.data(), remote, here.size()).is_ok());
  EXPECT_EQ(here, there);
  std::fill(here.begin(), here.end(), 9);
  ASSERT_TRUE(cma_copy(getpid(), Op::kWrite, here.data(), remote, here.size()).is_ok());
  EXPECT_EQ(there, here);

  const Status gone = cma_copy(reaped_pid(), Op::kRead, here.data(), remote, 64);
  EXPECT_EQ(gone.code(), StatusCode::kUnavailable);
  EXPECT_NE(gone.message().find("the peer is gone"), std::string::npos) << gone.message();
  const Status unmapped = cma_copy(getpid(), Op::kRead, here.data(), 4096, 64);
  EXPECT_EQ(unmapped.code(), StatusCode::kUnavailable);
  EXPECT_NE(unmapped.message().find("Bad address"), std::string::npos) << unmapped.message();
}

// A process is exiting from the moment it was killed until it is reaped;
// a live one (ourselves) is not.
TEST(SameHost, AKilledProcessIsSeenExitingUntilReapedAndGoneAfter) {
  EXPECT_FALSE(process_exiting(getpid()));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  EXPECT_FALSE(process_exiting(child));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  for (int i = 0; i < 1000 && !process_exiting(child); ++i) usleep(1000);
  EXPECT_TRUE(process_exiting(child)) << "a zombie, or exiting";
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(process_exiting(child)) << "reaped: no such process";
}

}  // namespace
}  // namespace baton::transport::ucx
