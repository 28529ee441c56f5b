// The listener as an attacker and a careless user meet it: garbage, slow
// clients, wrong secrets, an impostor listener, exports and revocation.
// Real UcxTransports on loopback, polled by the test thread; the hostile
// sides are raw sockets. Every wait is bounded.
#include <fcntl.h>
#include <linux/capability.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <ucp/api/ucp.h>

#include "baton/common/log.h"
#include "baton/transport/secret.h"
#include "baton/transport/ucx_transport.h"
#include "transport/ucx/auth.h"
#include "transport/ucx/control_wire.h"
#include "transport/ucx/wire.h"
#include "baton/common/socket_address.h"

namespace baton::transport {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kSecret = "correct horse battery staple";

std::size_t open_fds() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A blocking client socket to `address` ("127.0.0.1:port") from `source`
// (another loopback address is another host to the listener), or -1.
int dial(const std::string& address, const char* source = nullptr) {
  auto to = parse_socket_address(address);
  if (!to) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (source != nullptr) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &from.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
      ::close(fd);
      return -1;
    }
  }
  if (::connect(fd, to->get(), to->length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, std::span<const std::uint8_t> bytes) {
  std::size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;  // the listener may close first: fine
    at += static_cast<std::size_t>(n);
  }
}

// Reads one whole frame from a blocking socket within `limit`, polling the
// transports meanwhile; nullopt at EOF or when none came.
std::optional<ucx::Frame> read_frame(int fd, std::vector<std::uint8_t>& got,
                                     const std::function<bool(const std::function<bool()>&)>& wait) {
  std::optional<ucx::Frame> frame;
  bool closed = false;
  wait([&] {
    if (auto f = ucx::take_frame(got, ucx::kMaxFrameBytes); f && *f) {
      frame = std::move(**f);
      return true;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    std::uint8_t chunk[65536];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) closed = true;
    else got.insert(got.end(), chunk, chunk + n);
    return closed;
  });
  return frame;
}

// A UCP worker of the test's own, for a raw client whose hello must carry a
// real worker address.
struct RawWorker {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<std::uint8_t> address;
  RawWorker() {
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return;
    ucp_config_modify(config, "TLS", "tcp");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
    const ucs_status_t s = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (s != UCS_OK) return;
    ucp_worker_params_t wp{};
    if (ucp_worker_create(context, &wp, &worker) != UCS_OK) return;
    ucp_address_t* a = nullptr;
    std::size_t length = 0;
    if (ucp_worker_get_address(worker, &a, &length) != UCS_OK) return;
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(a);
    address.assign(bytes, bytes + length);
    ucp_worker_release_address(worker, a);
  }
  ~RawWorker() {
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }
};

// The hello a raw client sends after the challenge in `challenge`, with the
// proof over these worker addresses.
ucx::Hello proven_hello(const ucx::Frame& challenge, std::string_view secret,
                        std::vector<std::vector<std::uint8_t>> addresses) {
  ucx::Hello hello;
  hello.name = "127.0.0.1:1";
  hello.lanes = 1;
  hello.worker_addresses = std::move(addresses);
  hello.nonce = ucx::random_nonce().value();
  hello.proof = ucx::initiator_proof(secret, ucx::decode_challenge(challenge.body).value().nonce, hello.nonce,
                                     ucx::hello_description(hello));
  return hello;
}

class UcxSecurityTest : public ::testing::Test {
 protected:
  static UcxConfig config(std::string secret = kSecret) {
    UcxConfig c;
    c.tls = "tcp";
    c.lanes_per_peer = 2;
    c.secret = std::move(secret);
    return c;
  }

  std::unique_ptr<UcxTransport> make(UcxConfig c) {
    auto t = UcxTransport::create(std::move(c));
    EXPECT_TRUE(t.has_value()) << t.error().to_string();
    return t ? std::move(*t) : nullptr;
  }

  void TearDown() override {
    for (auto* t : {&a_, &b_, &c_}) {
      if (*t) (*t)->shutdown();
    }
    wait_until([&] {
      for (auto* t : {&a_, &b_, &c_}) {
        if (*t && !(*t)->shutdown_complete()) return false;
      }
      return true;
    }, 2s);
  }

  TimeNs now() const { return clock_.now_ns(); }

  void poll_all() {
    for (auto* t : {&a_, &b_, &c_}) {
      if (*t) (*t)->poll(now(), done_);
    }
  }

  bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 5s) {
    const TimeNs deadline = now() + std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
    while (!done()) {
      if (now() > deadline) return false;
      poll_all();
    }
    return true;
  }

  // a_ connects to a listening socket of the test's own (an impostor, or
  // another program): `listener` and the accepted `fd` are the test's to
  // close; nullopt (a test failure) when either step did not happen.
  std::optional<PathId> connect_to_raw_listener(int& listener, int& fd) {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    EXPECT_EQ(::listen(listener, 4), 0);
    socklen_t len = sizeof sa;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
    auto path = a_->connect("127.0.0.1:" + std::to_string(ntohs(sa.sin_port)), now());
    EXPECT_TRUE(path.has_value());
    if (!path) return std::nullopt;
    const bool accepted = wait_until([&] {
      pollfd p{listener, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) fd = ::accept(listener, nullptr, nullptr);
      return fd >= 0;
    });
    EXPECT_TRUE(accepted);
    if (!accepted) return std::nullopt;
    return *path;
  }

  // a_ (or `from`) connects to b_; the path's final state.
  PathId connect(UcxTransport& from, UcxTransport& to) {
    auto path = from.connect(to.address(), now());
    EXPECT_TRUE(path.has_value()) << path.error().to_string();
    if (!path) return 0;
    EXPECT_TRUE(wait_until([&] { return from.path_state(*path) != PathState::kConnecting; }));
    return *path;
  }

  // Writes then reads back `n` bytes a_ → b_'s exported region: byte-exact.
  void expect_round_trip(std::size_t n) {
    auto& remote = buffer(n);
    auto region = b_->register_memory(remote.data(), n);
    ASSERT_TRUE(region.has_value());
    ASSERT_TRUE(b_->export_region(*region).is_ok());
    const PathId path = connect(*a_, *b_);
    ASSERT_EQ(a_->path_state(path), PathState::kReady) << a_->path_status(path).to_string();
    auto& out = buffer(n);
    auto& back = buffer(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(i * 7 + 3);
    ASSERT_TRUE(a_->register_memory(out.data(), n).has_value());
    ASSERT_TRUE(a_->register_memory(back.data(), n).has_value());
    done_.clear();
    const auto base = reinterpret_cast<std::uint64_t>(remote.data());
    ASSERT_TRUE(a_->submit({1, path, 0, n, {Op::kWrite, out.data(), base, *region}}, now()).is_ok());
    ASSERT_TRUE(wait_until([&] { return done_.size() == 1; }));
    ASSERT_TRUE(done_[0].status.is_ok()) << done_[0].status.to_string();
    ASSERT_TRUE(a_->submit({2, path, 1, n, {Op::kRead, back.data(), base, *region}}, now()).is_ok());
    ASSERT_TRUE(wait_until([&] { return done_.size() == 2; }));
    ASSERT_TRUE(done_[1].status.is_ok()) << done_[1].status.to_string();
    EXPECT_EQ(back, out);
    EXPECT_EQ(remote, out);
  }

  std::vector<std::uint8_t>& buffer(std::size_t n) { return buffers_.emplace_back(n, 0); }

  SteadyClock clock_;
  std::deque<std::vector<std::uint8_t>> buffers_;  // outlive the transports
  std::unique_ptr<UcxTransport> a_, b_, c_;
  std::vector<Completion> done_;
};

TEST_F(UcxSecurityTest, TenThousandGarbageConnectionsLeaveTheListenerServing) {
  b_ = make(config());
  ASSERT_TRUE(b_);
  const std::size_t fds_before = open_fds();
  std::mt19937 rng(7);
  ucx::Hello wrong;
  wrong.name = "impostor:1";
  wrong.lanes = 2;
  wrong.worker_addresses = {{1, 2, 3}};
  const std::vector<std::vector<std::uint8_t>> kinds = {
      std::vector<std::uint8_t>(64, 0),                                                    // what aborted UCX 1.13
      ucx::encode_frame(ucx::ControlKind::kHello, std::vector<std::uint8_t>(10, 0xab)),    // malformed hello
      {0xff, 0xff, 0xff, 0xff, 2},                                                         // a 4 GiB length
      {0x2c, 0x01, 0x00, 0x00, 2, 1, 2, 3},                                                // truncated: 300 announced
      ucx::encode_frame(ucx::ControlKind::kHello, ucx::encode(wrong)),                     // a wrong proof
      ucx::encode_frame(ucx::ControlKind::kNotify, std::vector<std::uint8_t>(8, 'x')),     // not before a hello
      {},                                                                                  // random, below
  };
  constexpr int kConnections = 10'000;
  constexpr int kBurst = 100;  // under the listen backlog
  for (int i = 0; i < kConnections; i += kBurst) {
    std::vector<int> fds;
    for (int j = 0; j < kBurst; ++j) {
      const int fd = dial(b_->address());
      ASSERT_GE(fd, 0) << "connection " << i + j << ": " << std::strerror(errno);
      auto bytes = kinds[static_cast<std::size_t>(i + j) % kinds.size()];
      if (bytes.empty()) {
        bytes.resize(1 + rng() % 512);
        for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
      }
      send_all(fd, bytes);
      fds.push_back(fd);
    }
    for (int fd : fds) ::close(fd);
    poll_all();
  }
  // Every one of them is closed on the listener's side too.
  EXPECT_TRUE(wait_until([&] { return open_fds() <= fds_before; }, 10s))
      << open_fds() << " fds open, " << fds_before << " before";
  // And a real peer still gets full service.
  a_ = make(config());
  ASSERT_TRUE(a_);
  expect_round_trip(4 << 20);
}

TEST_F(UcxSecurityTest, SilentClientsAreClosedAtTheDeadlineAndBoundedInNumber) {
  UcxConfig c = config();
  c.handshake_timeout_ms = 600;  // the round trip at the end binds its lanes within it
  c.max_unauthenticated = 4;
  b_ = make(c);
  ASSERT_TRUE(b_);
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(dial(b_->address()));
  ASSERT_TRUE(wait_until([&] { return b_->refused_connections() == 6; }, 2s)) << b_->refused_connections();
  const TimeNs start = now();
  // Each silent one gets a challenge and then EOF at the deadline.
  for (int fd : silent) {
    ASSERT_GE(fd, 0);
    std::vector<std::uint8_t> got(4096);
    std::size_t total = 0;
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      ASSERT_TRUE(wait_until([&] { return ::poll(&p, 1, 0) > 0; }, 3s));
      const ssize_t n = ::recv(fd, got.data() + total, got.size() - total, 0);
      if (n <= 0) break;
      total += static_cast<std::size_t>(n);
    }
    // A challenge, or (for the six over the bound) a refusal that says why.
    EXPECT_TRUE(total == 0 || got[4] == static_cast<std::uint8_t>(ucx::ControlKind::kChallenge) ||
                got[4] == static_cast<std::uint8_t>(ucx::ControlKind::kRefusal));
    ::close(fd);
  }
  EXPECT_GE(now() - start, 200'000'000) << "closed before the handshake deadline";
  a_ = make(config());
  ASSERT_TRUE(a_);
  expect_round_trip(1 << 20);
}

TEST_F(UcxSecurityTest, DifferentSecretsMeetNoRegionAndNoKey) {
  b_ = make(config());
  a_ = make(config("another secret of enough bytes"));
  c_ = make(config(""));  // loopback, no secret
  ASSERT_TRUE(a_ && b_ && c_);
  auto& remote = buffer(4096);
  auto region = b_->register_memory(remote.data(), remote.size());
  ASSERT_TRUE(region.has_value());
  ASSERT_TRUE(b_->export_region(*region).is_ok());
  for (UcxTransport* from : {a_.get(), c_.get()}) {
    const PathId path = connect(*from, *b_);
    EXPECT_EQ(from->path_state(path), PathState::kFailed);
    const Status st = from->path_status(path);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.to_string();
    EXPECT_NE(st.message().find("authentication failed"), std::string::npos) << st.message();
    EXPECT_TRUE(from->remote_regions(path)->empty());
  }
  // Nor does a listener without a secret accept an engine that has one; the
  // reason reaches the connecting side worded for it ("this engine" read
  // backwards there).
  const PathId reverse = connect(*b_, *c_);
  const Status refused = b_->path_status(reverse);
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("refused us: authentication failed: the listener has no secret and the connecting "
                                   "engine has one"),
            std::string::npos)
      << refused.message();
}

TEST_F(UcxSecurityTest, AHelloWithAWrongProofGetsARefusalAndNothingElse) {
  b_ = make(config());
  ASSERT_TRUE(b_);
  auto& remote = buffer(4096);
  auto region = b_->register_memory(remote.data(), remote.size());
  ASSERT_TRUE(b_->export_region(*region).is_ok());
  const int fd = dial(b_->address());
  ASSERT_GE(fd, 0);
  ucx::Hello hello;
  hello.name = "127.0.0.1:1";
  hello.lanes = 1;
  hello.worker_addresses = {{1, 2, 3}};
  hello.proof.fill(0x5a);
  send_all(fd, ucx::encode_frame(ucx::ControlKind::kHello, ucx::encode(hello)));
  std::vector<std::uint8_t> got;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_TRUE(wait_until([&] { return ::poll(&p, 1, 0) > 0; }, 3s));
    std::uint8_t chunk[4096];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) break;  // closed by the listener
    got.insert(got.end(), chunk, chunk + n);
  }
  ::close(fd);
  std::vector<ucx::ControlKind> kinds;
  while (auto frame = ucx::take_frame(got, ucx::kMaxFrameBytes)) {
    if (!*frame) break;
    kinds.push_back((*frame)->kind);
  }
  EXPECT_TRUE(got.empty()) << got.size() << " bytes that are not a frame";
  EXPECT_EQ(kinds, (std::vector<ucx::ControlKind>{ucx::ControlKind::kChallenge, ucx::ControlKind::kRefusal}));
}

TEST_F(UcxSecurityTest, AnImpostorListenerGetsNoEndpointsAndTheConnectFails) {
  a_ = make(config());
  ASSERT_TRUE(a_);
  // A listener that does not know the secret: challenges, then welcomes
  // with a made-up proof.
  int listener = -1;
  int fd = -1;
  const auto path = connect_to_raw_listener(listener, fd);
  ASSERT_TRUE(path.has_value());
  send_all(fd, ucx::encode_frame(ucx::ControlKind::kChallenge, ucx::encode(ucx::Challenge{})));
  ucx::Welcome welcome;
  welcome.session = 1;
  welcome.worker_addresses = {{1, 2, 3, 4}};
  send_all(fd, ucx::encode_frame(ucx::ControlKind::kWelcome, ucx::encode(welcome)));
  ASSERT_TRUE(wait_until([&] { return a_->path_state(*path) == PathState::kFailed; }));
  const Status st = a_->path_status(*path);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.to_string();
  EXPECT_NE(st.message().find("does not hold our secret"), std::string::npos) << st.message();
  ::close(fd);
  ::close(listener);
}

// A user who points the engine at another program's port (an HTTP server)
// learns so from the path's status, with the bytes that came back.
TEST_F(UcxSecurityTest, APortOfAnotherProgramFailsThePathNamingWhatItSaid) {
  a_ = make(config());
  ASSERT_TRUE(a_);
  int listener = -1;
  int fd = -1;
  const auto path = connect_to_raw_listener(listener, fd);
  ASSERT_TRUE(path.has_value());
  const std::string http = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
  send_all(fd, std::vector<std::uint8_t>(http.begin(), http.end()));
  ASSERT_TRUE(wait_until([&] { return a_->path_state(*path) == PathState::kFailed; }));
  const Status st = a_->path_status(*path);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("\"HTTP/1.1 400 Bad"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not a Baton peer"), std::string::npos) << st.message();
  ::close(fd);
  ::close(listener);
}

TEST_F(UcxSecurityTest, WithoutASecretOnlyLoopbackListensUnlessAllowed) {
  UcxConfig c = config("");
  c.listen_address = "0.0.0.0:0";
  auto refused = UcxTransport::create(c);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.error().message().find("without a secret"), std::string::npos) << refused.error().message();
  c.allow_unauthenticated = true;
  EXPECT_TRUE(UcxTransport::create(c).has_value());
  c = config();
  c.listen_address = "0.0.0.0:0";
  EXPECT_TRUE(UcxTransport::create(c).has_value());
  c.secret = "short";
  EXPECT_EQ(UcxTransport::create(c).error().code(), StatusCode::kInvalidArgument);
  c = config();
  c.max_unauthenticated = 0;
  EXPECT_EQ(UcxTransport::create(c).error().code(), StatusCode::kInvalidArgument);
  c = config();
  c.revoke_timeout_ms = 0;
  EXPECT_EQ(UcxTransport::create(c).error().code(), StatusCode::kInvalidArgument);
}

TEST_F(UcxSecurityTest, SecretFilesMustBePrivateAndLongEnough) {
  const fs::path dir = fs::temp_directory_path() / ("baton-secret-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text, fs::perms mode) {
    const fs::path p = dir / name;
    std::ofstream(p) << text;
    fs::permissions(p, mode);
    return p.string();
  };
  const auto owner = fs::perms::owner_read | fs::perms::owner_write;
  const std::string good = write("good", std::string(kSecret) + "\n", owner);
  auto read = read_secret_file(good);
  ASSERT_TRUE(read.has_value()) << read.error().to_string();
  EXPECT_EQ(*read, kSecret);  // the trailing newline is not part of it
  const auto open_to_all = write("open", kSecret, owner | fs::perms::others_read);
  EXPECT_EQ(read_secret_file(open_to_all).error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(read_secret_file(open_to_all).error().message().find("chmod 600"), std::string::npos);
  EXPECT_EQ(read_secret_file(write("short", "tiny", owner)).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(read_secret_file(write("huge", std::string(8192, 'k'), owner)).error().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(read_secret_file((dir / "missing").string()).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(read_secret_file(dir.string()).error().code(), StatusCode::kInvalidArgument);
  // A NUL ends the path for the system calls: the good file would be read.
  EXPECT_EQ(read_secret_file(good + std::string("\0.ignored", 9)).error().code(), StatusCode::kInvalidArgument);

  // The file named by BATON_TOKEN_FILE is the secret when none is said.
  ::setenv("BATON_TOKEN_FILE", good.c_str(), 1);
  b_ = make(config(""));
  a_ = make(config(kSecret));
  // Set but empty (a deployment's unset variable) is refused, not read as no secret.
  ::setenv("BATON_TOKEN_FILE", "", 1);
  auto empty = UcxTransport::create(config(""));
  ::unsetenv("BATON_TOKEN_FILE");
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.error().message().find("BATON_TOKEN_FILE is set but empty"), std::string::npos)
      << empty.error().to_string();
  ASSERT_TRUE(a_ && b_);
  const PathId path = connect(*a_, *b_);
  EXPECT_EQ(a_->path_state(path), PathState::kReady) << a_->path_status(path).to_string();
  UcxConfig c = config("");
  c.secret_file = open_to_all;
  EXPECT_EQ(UcxTransport::create(c).error().code(), StatusCode::kInvalidArgument);
  fs::remove_all(dir);
}

TEST_F(UcxSecurityTest, RegionsAreSeenOnlyWhereExported) {
  b_ = make(config());
  a_ = make(config());
  c_ = make(config());
  ASSERT_TRUE(a_ && b_ && c_);
  auto& mem = buffer(3 * 4096);
  auto hidden = b_->register_memory(mem.data(), 4096);
  auto for_a = b_->register_memory(mem.data() + 4096, 4096);
  auto for_other = b_->register_memory(mem.data() + 8192, 4096);
  ASSERT_TRUE(hidden && for_a && for_other);
  ASSERT_TRUE(b_->export_region(*for_a, {a_->address()}).is_ok());
  ASSERT_TRUE(b_->export_region(*for_other, {"10.9.9.9:7000"}).is_ok());
  EXPECT_EQ(b_->export_region(999).code(), StatusCode::kNotFound);
  EXPECT_EQ(b_->export_region(*hidden, {""}).code(), StatusCode::kInvalidArgument);
  // A peer is named by its listen address: anything else is refused, not
  // stored as a name no peer can ever present.
  // A host name too: peers present numeric addresses, so "localhost:P"
  // would reach no one without a word.
  for (const std::string bad : {"garbage", "127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:", ":7000", "host:port:x",
                                "127.0.0.1:70x", "localhost:7000", "peer.example:7000"}) {
    const Status refused = b_->export_region(*hidden, {a_->address(), bad});
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.message().find(bad), std::string::npos) << refused.message();
  }
  const PathId pa = connect(*a_, *b_);
  const PathId pc = connect(*c_, *b_);
  ASSERT_EQ(a_->path_state(pa), PathState::kReady);
  ASSERT_EQ(c_->path_state(pc), PathState::kReady);
  auto keys = [](UcxTransport& t, PathId p) {
    std::vector<RegionHandle> out;
    const auto regions = t.remote_regions(p);
    for (const RemoteRegion& r : *regions) out.push_back(r.key);
    return out;
  };
  EXPECT_EQ(keys(*a_, pa), (std::vector<RegionHandle>{*for_a}));
  EXPECT_TRUE(keys(*c_, pc).empty());
  // An export reaches connected peers without a refresh.
  ASSERT_TRUE(b_->export_region(*hidden).is_ok());
  EXPECT_TRUE(wait_until([&] { return keys(*a_, pa).size() == 2 && keys(*c_, pc).size() == 1; }));
  EXPECT_EQ(keys(*c_, pc), (std::vector<RegionHandle>{*hidden}));
}

// A peer listening on every interface names itself by the one it reaches
// the exporter through: "0.0.0.0:P" is no address anyone could export to.
TEST_F(UcxSecurityTest, APeerListeningOnEveryInterfaceIsNamedByItsAddress) {
  UcxConfig wildcard = config();
  wildcard.listen_address = "0.0.0.0:0";
  b_ = make(config());
  a_ = make(wildcard);
  ASSERT_TRUE(a_ && b_);
  const std::string port = a_->address().substr(a_->address().rfind(':') + 1);
  ASSERT_EQ(a_->address(), "0.0.0.0:" + port);
  auto& mem = buffer(4096);
  auto named = b_->register_memory(mem.data(), 4096);
  ASSERT_TRUE(named.has_value());
  ASSERT_TRUE(b_->export_region(*named, {"127.0.0.1:" + port}).is_ok());
  // Its own address names no peer: refused, not an export that reaches no one.
  for (const std::string& wildcard : {"0.0.0.0:" + port, "[::]:" + port}) {
    const Status refused = b_->export_region(*named, {wildcard});
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << wildcard;
    EXPECT_NE(refused.message().find("names every interface"), std::string::npos) << refused.message();
  }
  const PathId path = connect(*a_, *b_);
  ASSERT_EQ(a_->path_state(path), PathState::kReady);
  const auto regions = a_->remote_regions(path);
  ASSERT_TRUE(regions.has_value());
  ASSERT_EQ(regions->size(), 1u);
  EXPECT_EQ(regions->front().key, *named);
}

TEST_F(UcxSecurityTest, UnregisterWaitsUntilPeersFinishedAndAcknowledged) {
  b_ = make(config());
  a_ = make(config());
  ASSERT_TRUE(a_ && b_);
  constexpr std::size_t kBytes = 16 << 20;
  auto& remote = buffer(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) remote[i] = static_cast<std::uint8_t>(i * 13);
  auto region = b_->register_memory(remote.data(), kBytes);
  ASSERT_TRUE(b_->export_region(*region).is_ok());
  const PathId path = connect(*a_, *b_);
  ASSERT_EQ(a_->path_state(path), PathState::kReady);
  auto& local = buffer(kBytes);
  ASSERT_TRUE(a_->register_memory(local.data(), kBytes).has_value());
  const auto base = reinterpret_cast<std::uint64_t>(remote.data());
  ASSERT_TRUE(a_->submit({1, path, 0, kBytes, {Op::kRead, local.data(), base, *region}}, now()).is_ok());
  ASSERT_TRUE(b_->unregister(*region).is_ok());
  EXPECT_TRUE(b_->unregister_pending(*region));
  EXPECT_EQ(b_->unregister(*region).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b_->export_region(*region).code(), StatusCode::kFailedPrecondition);
  // The region stays until a_'s read finished and a_ acknowledged.
  bool read_done_first = false;
  ASSERT_TRUE(wait_until([&] {
    if (!done_.empty() && b_->unregister_pending(*region)) read_done_first = true;
    return !b_->unregister_pending(*region);
  }));
  ASSERT_EQ(done_.size(), 1u);
  EXPECT_TRUE(done_[0].status.is_ok()) << done_[0].status.to_string();
  EXPECT_TRUE(read_done_first) << "the region went before the read on it finished";
  EXPECT_EQ(local, remote);
  EXPECT_TRUE(a_->remote_regions(path)->empty());
  EXPECT_EQ(a_->path_state(path), PathState::kReady);  // the path itself lives on
  EXPECT_EQ(b_->unregister(*region).code(), StatusCode::kNotFound);
}

// A peer that copies through UCX: closing its endpoints fences it.
TEST_F(UcxSecurityTest, APeerThatDoesNotAcknowledgeIsDisconnected) {
  UcxConfig c = config();
  c.revoke_timeout_ms = 300;
  b_ = make(c);
  UcxConfig through_ucx = config();
  through_ucx.same_host_copy = false;
  a_ = make(through_ucx);
  ASSERT_TRUE(a_ && b_);
  auto& remote = buffer(4096);
  auto region = b_->register_memory(remote.data(), remote.size());
  ASSERT_TRUE(b_->export_region(*region).is_ok());
  const PathId path = connect(*a_, *b_);
  ASSERT_EQ(a_->path_state(path), PathState::kReady);
  ASSERT_TRUE(b_->unregister(*region).is_ok());
  const TimeNs start = now();
  std::vector<Completion> ignored;
  while (b_->unregister_pending(*region) && now() - start < 3'000'000'000) b_->poll(now(), ignored);  // a_ silent
  EXPECT_FALSE(b_->unregister_pending(*region));
  EXPECT_GE(now() - start, 250'000'000);
  // a_ learns it was dismissed as soon as it runs again.
  EXPECT_TRUE(wait_until([&] { return a_->path_state(path) == PathState::kFailed; }));
  EXPECT_EQ(a_->path_status(path).code(), StatusCode::kUnavailable);
}

// A peer of this host writes the caller's memory by address (CMA): closing
// its connection does not stop a copy it has queued, which a stopped process
// runs when continued, into whatever the caller put there after unregister
// answered. So while it lives it is waited for past the revoke timeout, and
// it acknowledges once it runs. A region in a memfd too: a peer that cannot
// map it (out of descriptors) writes it by address as well.
TEST_F(UcxSecurityTest, ASameHostPeerThatCopiesByAddressIsWaitedForNotDismissed) {
  UcxConfig c = config();
  c.revoke_timeout_ms = 200;
  b_ = make(c);
  a_ = make(config());
  ASSERT_TRUE(a_ && b_);
  auto& caller = buffer(4096);
  auto by_address = b_->register_memory(caller.data(), caller.size());
  auto mapped = b_->allocate_memory(4096);
  ASSERT_TRUE(by_address && mapped);
  ASSERT_TRUE(b_->export_region(*by_address).is_ok());
  ASSERT_TRUE(b_->export_region(mapped->handle).is_ok());
  const PathId path = connect(*a_, *b_);
  ASSERT_EQ(a_->path_state(path), PathState::kReady);
  ASSERT_EQ(a_->paths()[path].type, topology::PathType::kShm);  // it copies itself
  ASSERT_TRUE(b_->unregister(*by_address).is_ok());
  ASSERT_TRUE(b_->unregister(mapped->handle).is_ok());
  // a_ silent (not polled) for three revoke timeouts: still awaited.
  std::vector<Completion> ignored;
  const TimeNs start = now();
  while (now() - start < 600'000'000) b_->poll(now(), ignored);
  EXPECT_TRUE(b_->unregister_pending(*by_address));
  EXPECT_TRUE(b_->unregister_pending(mapped->handle));
  // Waiting, the loop may sleep: its next look is ahead, not the deadline
  // that passed (which would keep it awake, a core at 100%).
  const auto next = b_->next_event_ns();
  ASSERT_TRUE(next.has_value());
  EXPECT_GT(*next, now() - 50'000'000);
  // It runs again: acknowledges, and the regions go; the path lives on.
  EXPECT_TRUE(wait_until([&] { return !b_->unregister_pending(*by_address) && !b_->unregister_pending(mapped->handle); }));
  EXPECT_EQ(a_->path_state(path), PathState::kReady);
}

// Shutdown closed every session at once, and a same-host peer then copying
// into the caller's memory by address went on (a copy under way, or queued)
// after the engine said it had shut down. Such a peer is now told we are
// going (its path fails, as at a close) and the shutdown completes once it
// closed its connection, which it does when no copy of its can still reach
// us; one that does not is closed at the revoke timeout (an error says so).
TEST_F(UcxSecurityTest, ShutdownWaitsForASameHostPeerThatWritesCallerMemoryToStop) {
  for (const bool answers : {true, false}) {
    UcxConfig c = config();
    c.revoke_timeout_ms = answers ? 5000 : 300;
    b_ = make(c);
    a_ = make(config());
    ASSERT_TRUE(a_ && b_);
    auto& caller = buffer(4096);
    auto region = b_->register_memory(caller.data(), caller.size());
    ASSERT_TRUE(region && b_->export_region(*region).is_ok());
    const PathId path = connect(*a_, *b_);
    ASSERT_EQ(a_->paths()[path].type, topology::PathType::kShm);
    // The silent round unregisters first, a_ not acknowledging: the region
    // is no longer among those a_ was told of, and a_ is still waited for.
    if (!answers) {
      ASSERT_TRUE(b_->unregister(*region).is_ok());
    }
    b_->shutdown();
    std::vector<Completion> ignored;
    const TimeNs start = now();
    while (now() - start < 100'000'000) b_->poll(now(), ignored);  // a_ silent
    EXPECT_FALSE(b_->shutdown_complete()) << "answers " << answers;
    if (answers) {
      // a_ runs: its path fails, it closes, and the shutdown ends well before the timeout.
      EXPECT_TRUE(wait_until([&] { return b_->shutdown_complete(); }, 2s));
      EXPECT_EQ(a_->path_state(path), PathState::kFailed);
      EXPECT_EQ(a_->path_status(path).code(), StatusCode::kUnavailable) << a_->path_status(path).to_string();
    } else {
      while (!b_->shutdown_complete() && now() - start < 3'000'000'000) b_->poll(now(), ignored);
      EXPECT_TRUE(b_->shutdown_complete());
      EXPECT_GE(now() - start, 250'000'000);
    }
    a_.reset();
    b_.reset();
  }
}

// Drops CAP_SYS_PTRACE from the calling thread's effective set (threads it
// starts inherit that) and restores it when it goes. Without it, a process
// of our user that is not dumpable cannot be read: as a listener cannot
// read a root initiator's memory, which can still write its.
class WithoutPtraceCapability {
 public:
  WithoutPtraceCapability() {
    if (::syscall(SYS_capget, &header_, saved_) != 0) return;
    __user_cap_data_struct dropped[2] = {saved_[0], saved_[1]};
    dropped[CAP_TO_INDEX(CAP_SYS_PTRACE)].effective &= ~CAP_TO_MASK(CAP_SYS_PTRACE);
    dropped_ = ::syscall(SYS_capset, &header_, dropped) == 0;
  }
  [[nodiscard]] bool dropped() const { return dropped_; }
  ~WithoutPtraceCapability() {
    if (dropped_) (void)::syscall(SYS_capset, &header_, saved_);
  }
  WithoutPtraceCapability(const WithoutPtraceCapability&) = delete;
  WithoutPtraceCapability& operator=(const WithoutPtraceCapability&) = delete;

 private:
  __user_cap_header_struct header_{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct saved_[2]{};
  bool dropped_ = false;
};

// A same-host initiator copies into the listener's memory by address only
// once the listener confirmed its pid (and so will wait for its copies at a
// revocation). One the listener cannot read (here: not dumpable, and the
// listener without CAP_SYS_PTRACE; in a deployment a root initiator and a
// listener of another user) had copied by address anyway, and was
// dismissed at the revoke timeout with its copies unstopped; it now goes
// through UCX (TCP here), whose endpoints a disconnect closes. The
// initiator is a forked child (a process of its own to read), which says
// by its exit code what carries its path.
TEST_F(UcxSecurityTest, ASameHostPeerTheListenerCannotConfirmDoesNotCopyByAddress) {
  // Under Yama's ptrace_scope 1 or more the child cannot read us either.
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  if (int scope = 0; yama >> scope && scope >= 1) GTEST_SKIP() << "Yama ptrace_scope " << scope;
  if (!WithoutPtraceCapability().dropped()) GTEST_SKIP() << "capset refused: cannot drop CAP_SYS_PTRACE";
  for (const bool readable : {true, false}) {
    int to_child[2];
    ASSERT_EQ(::pipe(to_child), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(to_child[1]);
      if (!readable) ::prctl(PR_SET_DUMPABLE, 0);
      char address[256] = {};
      std::size_t got = 0;
      for (ssize_t n = 1; n > 0 && got < sizeof address - 1; got += static_cast<std::size_t>(n)) {
        n = ::read(to_child[0], address + got, sizeof address - 1 - got);
        if (n <= 0) break;
      }
      auto t = UcxTransport::create(config());
      if (!t) ::_exit(10);
      SteadyClock clock;
      auto path = (*t)->connect(address, clock.now_ns());
      if (!path) ::_exit(11);
      std::vector<Completion> ignored;
      const TimeNs until = clock.now_ns() + 10'000'000'000;
      while ((*t)->path_state(*path) == PathState::kConnecting && clock.now_ns() < until) {
        (*t)->poll(clock.now_ns(), ignored);
      }
      if ((*t)->path_state(*path) != PathState::kReady) ::_exit(12);
      ::_exit((*t)->paths()[*path].type == topology::PathType::kShm ? 20 : 21);
    }
    ::close(to_child[0]);
    int status = 0;
    {
      std::optional<WithoutPtraceCapability> unable;
      if (!readable) unable.emplace();
      b_ = make(config());
      ASSERT_TRUE(b_);
      const std::string& address = b_->address();
      EXPECT_EQ(::write(to_child[1], address.data(), address.size()), static_cast<ssize_t>(address.size()));
      ::close(to_child[1]);
      const bool ended = wait_until([&] { return ::waitpid(child, &status, WNOHANG) == child; }, 20s);
      if (!ended) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
      }
      EXPECT_TRUE(ended) << "readable " << readable;
      b_->shutdown();
      EXPECT_TRUE(wait_until([&] { return b_->shutdown_complete(); }, 2s));
      b_.reset();
    }
    ASSERT_TRUE(WIFEXITED(status)) << "readable " << readable << ": " << status;
    // 20: it copies into us itself (kShm); 21: UCX carries its path.
    EXPECT_EQ(WEXITSTATUS(status), readable ? 20 : 21) << "readable " << readable;
  }
}

// An initiator short of file descriptors for its lanes is told so at
// connect: its lanes had failed as "closed the connection", naming nothing,
// with UCX warnings (an audit; out of them, UCX aborts the process). As the
// listener refuses a hello it cannot hold.
TEST_F(UcxSecurityTest, AConnectShortOfFileDescriptorsSaysSo) {
  UcxConfig c = config();
  c.lanes_per_peer = 64;
  a_ = make(c);
  b_ = make(config());
  ASSERT_TRUE(a_ && b_);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit tight = saved;
  tight.rlim_cur = open_fds() + 100;  // 64 lanes take more
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto path = a_->connect(b_->address(), now());
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_FALSE(path.has_value());
  EXPECT_EQ(path.error().code(), StatusCode::kResourceExhausted) << path.error().to_string();
  EXPECT_NE(path.error().message().find("file descriptors left"), std::string::npos) << path.error().message();
  // With its limit back, the same connect goes through.
  auto again = a_->connect(b_->address(), now());
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_TRUE(wait_until([&] { return a_->path_state(*again) == PathState::kReady; }));
}

// At a shutdown a path's queued frames are written before its connection
// closes (a notification of a batch that ended must reach the peer: over
// TCP it was dropped with the connection), but a peer that reads none of
// them is given up on a second after the close: it held
// shutdown_complete() false for good, the loop polling all the while.
TEST_F(UcxSecurityTest, AtShutdownAPeerThatReadsNoneOfItsLastFramesIsNotWaitedForLong) {
  a_ = make(config());
  b_ = make(config());
  ASSERT_TRUE(a_ && b_);
  const PathId path = connect(*a_, *b_);
  ASSERT_EQ(a_->path_state(path), PathState::kReady);
  // b_ is not polled from here: it reads nothing. 32 MB of notifications
  // outgrow both sockets' buffers.
  const std::string note(4000, 'n');
  for (int i = 0; i < 8000; ++i) ASSERT_TRUE(a_->notify(path, note).is_ok()) << i;
  std::vector<Completion> ignored;
  a_->poll(now(), ignored);
  a_->shutdown();
  const TimeNs start = now();
  while (!a_->shutdown_complete() && now() - start < 10'000'000'000) a_->poll(now(), ignored);
  EXPECT_TRUE(a_->shutdown_complete()) << "still waiting on a peer that reads nothing";
  EXPECT_GE(now() - start, 900'000'000) << "gave up at once, before trying to write the frames";
}

// One host holding every handshake slot, reopening each at its deadline,
// locked every peer out without the secret (a legitimate connect failed 5
// of 5). Now it holds at most its share: a newcomer from another address
// takes the oldest of its slots, and one over its own bound is told why.
TEST_F(UcxSecurityTest, AHostHoldingEveryHandshakeSlotDoesNotLockOutAPeer) {
  UcxConfig c = config();
  c.max_unauthenticated = 4;
  c.max_unauthenticated_per_address = 4;
  b_ = make(c);
  ASSERT_TRUE(b_);
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(dial(b_->address(), "127.0.0.2"));
  for (int fd : silent) ASSERT_GE(fd, 0);
  (void)wait_until([] { return false; }, 200ms);  // turns for the listener to take the four
  EXPECT_EQ(b_->refused_connections(), 0u);
  // A fifth from the same host: refused, with a reason.
  const int over = dial(b_->address(), "127.0.0.2");
  ASSERT_GE(over, 0);
  std::vector<std::uint8_t> got;
  auto wait = [&](const std::function<bool()>& f) { return wait_until(f, 3s); };
  auto refusal = read_frame(over, got, wait);
  ASSERT_TRUE(refusal.has_value());
  EXPECT_EQ(refusal->kind, ucx::ControlKind::kRefusal);
  const std::string why(refusal->body.begin(), refusal->body.end());
  EXPECT_NE(why.find("handshakes from 127.0.0.2 are under way"), std::string::npos) << why;
  ::close(over);
  // A peer from 127.0.0.1 gets through while the four are held.
  a_ = make(config());
  ASSERT_TRUE(a_);
  expect_round_trip(1 << 16);
  EXPECT_GE(b_->refused_connections(), 2u);  // the fifth, and the slot given up for the peer
  for (int fd : silent) ::close(fd);
}

// A hello whose worker address is not one of this UCX's format aborted the
// listener inside ucp_ep_create (an assertion on the version byte); a
// loopback listener without a secret takes a proof anyone can make.
TEST_F(UcxSecurityTest, AHelloWithAForeignWorkerAddressIsRefusedNotAborted) {
  b_ = make(config(""));
  ASSERT_TRUE(b_);
  for (std::uint8_t first : {std::uint8_t{0x0b}, std::uint8_t{0x02}}) {
    const int fd = dial(b_->address());
    ASSERT_GE(fd, 0);
    std::vector<std::uint8_t> got;
    auto wait = [&](const std::function<bool()>& f) { return wait_until(f, 3s); };
    auto challenge = read_frame(fd, got, wait);
    ASSERT_TRUE(challenge.has_value());
    std::vector<std::uint8_t> address(64, 0);
    address[0] = first;
    send_all(fd, ucx::encode_frame(ucx::ControlKind::kHello, ucx::encode(proven_hello(*challenge, "", {address}))));
    EXPECT_FALSE(read_frame(fd, got, wait).has_value()) << "closed, no welcome";
    ::close(fd);
  }
  a_ = make(config(""));
  ASSERT_TRUE(a_);
  expect_round_trip(1 << 16);
}

// Baton's log captured at `level` while it lives, then as it was.
class LogCapture {
 public:
  explicit LogCapture(spdlog::level::level_enum level)
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)), level_(baton::logger().level()) {
    baton::logger().sinks().push_back(sink_);
    baton::logger().set_level(level);
  }
  ~LogCapture() {
    baton::logger().sinks().pop_back();
    baton::logger().set_level(level_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

// A peer of the test's own that proves the secret but names, for the
// listener's answers, `answers` (a worker it may never progress), and sends
// hand-made messages on one lane from `lanes`. The test drives `step`.
struct RawPeer {
  RawWorker lanes, answers;
  int fd = -1;
  ucp_ep_h ep = nullptr;
  std::uint64_t token = 0;
  std::vector<std::uint8_t> got;
  std::function<void()> step;
  ~RawPeer() {
    if (fd >= 0) ::close(fd);
    if (ep == nullptr) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    if (void* r = ucp_ep_close_nbx(ep, &p); UCS_PTR_IS_PTR(r)) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(lanes.worker);
      ucp_request_free(r);
    }
  }
  bool wait(const std::function<bool()>& f) {
    const auto deadline = std::chrono::steady_clock::now() + 3s;
    while (!f()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      step();
      ucp_worker_progress(lanes.worker);
    }
    return true;
  }
  std::optional<ucx::Frame> frame() {
    return read_frame(fd, got, [this](const std::function<bool()>& f) { return wait(f); });
  }
  // Hello, welcome, and an endpoint to the listener's worker: testing::AssertionSuccess when all came.
  ::testing::AssertionResult join(const std::string& address) {
    if (lanes.address.empty() || answers.address.empty()) return ::testing::AssertionFailure() << "no UCP worker";
    fd = dial(address);
    auto challenge = frame();
    if (!challenge) return ::testing::AssertionFailure() << "no challenge";
    send_all(fd, ucx::encode_frame(ucx::ControlKind::kHello,
                                   ucx::encode(proven_hello(*challenge, kSecret, {answers.address}))));
    auto welcomed = frame();
    if (!welcomed || welcomed->kind != ucx::ControlKind::kWelcome) return ::testing::AssertionFailure() << "no welcome";
    auto welcome = ucx::decode_welcome(welcomed->body);
    if (!welcome) return ::testing::AssertionFailure() << welcome.error().to_string();
    token = welcome->session;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.address = reinterpret_cast<const ucp_address_t*>(welcome->worker_addresses.at(0).data());
    if (ucp_ep_create(lanes.worker, &params, &ep) != UCS_OK) return ::testing::AssertionFailure() << "ucp_ep_create";
    return ::testing::AssertionSuccess();
  }
  // Binds the lane with the session's token: true once the listener says ready.
  bool bind() {
    std::vector<std::uint8_t> payload(sizeof token);
    std::memcpy(payload.data(), &token, payload.size());
    if (!send(ucx::MessageKind::kQuery, payload)) return false;
    std::optional<ucx::Frame> f;
    do {
      f = frame();
    } while (f.has_value() && f->kind != ucx::ControlKind::kReady);
    return f.has_value();
  }
  bool send(ucx::MessageKind kind, std::span<const std::uint8_t> payload) {
    const std::vector<std::uint8_t> header = ucx::encode_header({});
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;  // the listener knows a lane by the endpoint it answers on
    void* request = ucp_am_send_nbx(ep, static_cast<unsigned>(kind), header.data(), header.size(), payload.data(),
                                    payload.size(), &p);
    if (UCS_PTR_IS_ERR(request)) return false;
    if (request == nullptr) return true;
    const bool sent = wait([&] { return ucp_request_check_status(request) != UCS_INPROGRESS; });
    if (sent) ucp_request_free(request);  // else left to the worker's teardown
    return sent;
  }
  bool closed() const {
    std::uint8_t byte = 0;
    return ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
};

// A peer holding a session may not park a partial frame (16 MiB each, kept
// for good), nor hold the loop with a burst of small frames: erased one by
// one, 4 MiB of 13-byte acknowledgements took 7.4 s, quadratic in the burst
// (8 MiB here).
// Frames over a turn's share wait for the next turn, which comes without
// new bytes: the refresh after the burst is answered.
TEST_F(UcxSecurityTest, ASessionsFramesAreServedInTurnAndAHalfFrameIsNotKept) {
  UcxConfig c = config();
  c.handshake_timeout_ms = 1000;  // the lanes bind within it, on a loaded machine too
  b_ = make(c);
  ASSERT_TRUE(b_);
  RawPeer raw;
  raw.step = [&] { poll_all(); };
  ASSERT_TRUE(raw.join(b_->address()));
  ASSERT_TRUE(raw.bind());
  const int fd = raw.fd;
  std::vector<std::uint8_t>& got = raw.got;
  auto wait = [&](const std::function<bool()>& f) { return wait_until(f, 5s); };

  std::vector<std::uint8_t> burst;
  const auto ack = ucx::encode_frame(ucx::ControlKind::kRevokeAck, ucx::encode_seq(7));
  while (burst.size() < (8u << 20)) burst.insert(burst.end(), ack.begin(), ack.end());
  const auto refresh = ucx::encode_frame(ucx::ControlKind::kRefresh, ucx::encode_seq(42));
  burst.insert(burst.end(), refresh.begin(), refresh.end());
  std::thread sender([&] { send_all(fd, burst); });
  auto regions = read_frame(fd, got, [&](const std::function<bool()>& f) { return wait_until(f, 20s); });
  sender.join();
  ASSERT_TRUE(regions.has_value());
  EXPECT_EQ(regions->kind, ucx::ControlKind::kRegions);
  EXPECT_EQ(ucx::decode_regions_update(regions->body).value().seq, 42u);

  // Half a frame, then nothing: closed after handshake_timeout_ms.
  const auto half = ucx::encode_frame(ucx::ControlKind::kNotify, ucx::encode_text(std::string(1000, 'n')));
  send_all(fd, std::span(half).first(500));
  EXPECT_FALSE(read_frame(fd, got, wait).has_value());
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 1) << "closed (EOF readable)";
}

// A peer that asks for its regions again and again without reading had
// every answer queued for it (64 MiB a session; 8 sessions took 630 MB):
// past a bounded backlog its session is closed, and other peers are served.
TEST_F(UcxSecurityTest, APeerThatAsksWithoutReadingIsClosedNotQueuedFor) {
  b_ = make(config());
  ASSERT_TRUE(b_);
  {
    LogCapture log(spdlog::level::info);
    RawPeer raw;
    raw.step = [&] { poll_all(); };
    ASSERT_TRUE(raw.join(b_->address()));
    ASSERT_TRUE(raw.bind());
    int small = 1 << 12;  // our receive buffer: the answers back up at the listener sooner
    ASSERT_EQ(::setsockopt(raw.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
    std::vector<std::uint8_t> burst;
    const auto refresh = ucx::encode_frame(ucx::ControlKind::kRefresh, ucx::encode_seq(1));
    while (burst.size() < (8u << 20)) burst.insert(burst.end(), refresh.begin(), refresh.end());
    std::thread sender([&] { send_all(raw.fd, burst); });  // never reads an answer
    EXPECT_TRUE(wait_until(
        [&] { return log.text().find("asks for its regions without reading the answers") != std::string::npos; },
        30s));
    ::shutdown(raw.fd, SHUT_RDWR);
    sender.join();
    EXPECT_NE(log.text().find("bytes queued for it"), std::string::npos) << log.text().substr(0, 2000);
  }
  a_ = make(config());
  ASSERT_TRUE(a_);
  expect_round_trip(1 << 16);
}

// A peer that proves the secret and never binds its lanes held one of
// max_sessions for good (256 such took every slot): the handshake ends
// with the lanes bound, within handshake_timeout_ms of connecting.
TEST_F(UcxSecurityTest, ASessionThatNeverBindsItsLanesIsClosedAtTheHandshakeDeadline) {
  UcxConfig c = config();
  c.handshake_timeout_ms = 1000;
  c.max_sessions = 1;
  b_ = make(c);
  ASSERT_TRUE(b_);
  {
    RawPeer raw;
    raw.step = [&] { poll_all(); };
    ASSERT_TRUE(raw.join(b_->address()));  // welcomed, never bound
    // A sleeping loop wakes for its deadline.
    const auto next = b_->next_event_ns();
    ASSERT_TRUE(next.has_value());
    EXPECT_LE(*next, now() + 1'000'000'000);
    EXPECT_TRUE(wait_until([&] { return raw.closed(); }, 5s));
  }
  a_ = make(config());
  ASSERT_TRUE(a_);
  expect_round_trip(1 << 16);  // its one session slot is free again
}

// Peers that proved the secret are bounded too (each holds sockets and
// buffers): one past max_sessions is refused, told why, as unavailable.
TEST_F(UcxSecurityTest, PeersPastMaxSessionsAreRefusedSayingWhy) {
  UcxConfig c = config();
  c.max_sessions = 1;
  b_ = make(c);
  a_ = make(config());
  c_ = make(config());
  ASSERT_TRUE(a_ && b_ && c_);
  EXPECT_EQ(a_->path_state(connect(*a_, *b_)), PathState::kReady);
  const PathId refused = connect(*c_, *b_);
  EXPECT_EQ(c_->path_state(refused), PathState::kFailed);
  const Status st = c_->path_status(refused);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.to_string();
  EXPECT_NE(st.message().find("maximum of 1 peers"), std::string::npos) << st.message();
  UcxConfig zero = config();
  zero.max_sessions = 0;
  EXPECT_EQ(UcxTransport::create(zero).error().message(), "UcxTransport::create: max_sessions is 0 (expected >= 1)");
  zero = config();
  zero.max_unauthenticated_per_address = -1;
  EXPECT_EQ(UcxTransport::create(zero).error().message(),
            "UcxTransport::create: max_unauthenticated_per_address is -1 (expected >= 1)");
}


// A bundle of kMaxBundleEntries reads of a region that does not exist.
std::vector<std::uint8_t> bundle_of_bad_reads() {
  std::vector<std::uint8_t> bundle = ucx::begin_bundle();
  for (std::uint64_t seq = 0; seq < ucx::kMaxBundleEntries; ++seq) {
    ucx::add_to_bundle(bundle, ucx::MessageKind::kReadAsk, seq, {12345, ucx::WireCodec::kRaw, 0, 4096, 64}, {});
  }
  return bundle;
}

// A peer with the secret that names, for its answers, a worker it never
// progresses, and asks for reads the listener refuses: refusals were
// queued for the wire without bound (an audit: 947 MB held after 30 000
// bundles). Its session is closed once the answers queued for it pass the
// bound, and another peer is served after it.
TEST_F(UcxSecurityTest, APeerWhoseAnswersNeverDrainIsClosedNotQueuedForWithoutBound) {
  b_ = make(config());
  ASSERT_TRUE(b_);
  {
    RawPeer raw;
    raw.step = [&] { poll_all(); };
    ASSERT_TRUE(raw.join(b_->address()));
    ASSERT_TRUE(raw.bind());
    // Each bundle's refusals hold one reply buffer (64 KiB) until sent, which
    // is never: the bound (288 MiB) is reached after about 4 600 of them.
    const std::vector<std::uint8_t> bundle = bundle_of_bad_reads();
    int sent = 0;
    for (; sent < 12'000 && !raw.closed(); ++sent) {
      if (!raw.send(ucx::MessageKind::kSliceBundle, bundle)) break;
      poll_all();
    }
    (void)raw.wait([&] { return raw.closed(); });
    EXPECT_TRUE(raw.closed()) << "after " << sent << " bundles";
    EXPECT_GT(sent, 2'000) << "not closed before its answers reached the bound";
  }
  a_ = make(config());
  ASSERT_TRUE(a_);
  expect_round_trip(1 << 16);
}

// Every message from an endpoint no session bound was a warning line:
// whoever reaches UCX's ports could fill a disk. At most 20 a second now,
// and a line says how many were left out.
TEST_F(UcxSecurityTest, WarningsAboutPeersMessagesAreBoundedPerSecond) {
  b_ = make(config());
  ASSERT_TRUE(b_);
  LogCapture log(spdlog::level::warn);
  const auto start = std::chrono::steady_clock::now();
  {
    RawPeer raw;
    raw.step = [&] { poll_all(); };
    ASSERT_TRUE(raw.join(b_->address()));  // not bound: every bundle is dropped with a warning
    const std::vector<std::uint8_t> bundle = bundle_of_bad_reads();
    for (int i = 0; i < 3'000; ++i) {
      ASSERT_TRUE(raw.send(ucx::MessageKind::kSliceBundle, bundle));
      poll_all();
    }
    (void)wait_until([] { return false; }, 1100ms);  // the next second's first line
    ASSERT_TRUE(raw.send(ucx::MessageKind::kSliceBundle, bundle));
    (void)wait_until([] { return false; }, 100ms);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string text = log.text();
  std::size_t dropped = 0, left_out = 0;
  for (std::size_t at = 0; (at = text.find("no authenticated peer bound", at)) != std::string::npos; ++at) ++dropped;
  for (std::size_t at = 0; (at = text.find("left out (at most 20 a second)", at)) != std::string::npos; ++at) {
    ++left_out;
  }
  EXPECT_GE(dropped, 20u) << text.substr(0, 2000);
  EXPECT_LE(static_cast<double>(dropped), 20 * (seconds + 1)) << "in " << seconds << " s";
  EXPECT_GE(left_out, 1u) << "the next second says how many were left out";
}

}  // namespace
}  // namespace baton::transport
