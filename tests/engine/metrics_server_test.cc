// The /metrics endpoint: a Prometheus scrape gets exactly the callback's text
// with the exposition content type, each scrape renders afresh, bad
// addresses or a taken port are reported as a Status, and clients that
// stall, trickle, send a body or a flood of headers hold neither other
// scrapes nor the shutdown.
#include "engine/metrics_server.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "baton/common/socket_address.h"

#include <gtest/gtest.h>
#include <httplib.h>

namespace baton::engine {
namespace {

std::unique_ptr<MetricsServer> start_local(std::function<std::string()> text) {
  auto server = MetricsServer::start("127.0.0.1:0", std::move(text));
  EXPECT_TRUE(server.has_value()) << server.error().to_string();
  return server ? std::move(*server) : nullptr;
}

// Bounded so that a server that never answers fails the test instead of hanging it.
httplib::Client client_for(const MetricsServer& server) {
  httplib::Client client("http://" + server.address());
  client.set_connection_timeout(2);
  client.set_read_timeout(2);
  return client;
}

// The server still answers a scrape with the callback's text.
void expect_scrapes(const MetricsServer& server, const std::string& text) {
  auto client = client_for(server);
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, text);
}

TEST(MetricsServer, ServesTheCallbackTextAsPrometheusExposition) {
  const std::string text = "# TYPE baton_requests_total counter\nbaton_requests_total 7\n";
  auto server = start_local([&] { return text; });
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->address().starts_with("127.0.0.1:"));
  EXPECT_NE(server->address(), "127.0.0.1:0");

  auto client = client_for(*server);
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, text);
  EXPECT_EQ(response->get_header_value("Content-Type"), "text/plain; version=0.0.4");
}

TEST(MetricsServer, AnswersOtherPathsWith404) {
  auto server = start_local([] { return std::string("x 1\n"); });
  ASSERT_NE(server, nullptr);
  auto client = client_for(*server);
  auto response = client.Get("/other");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 404);
}

TEST(MetricsServer, CallsTheCallbackOncePerScrape) {
  std::atomic<int> calls{0};
  auto server = start_local([&] { return "scrape " + std::to_string(++calls) + "\n"; });
  ASSERT_NE(server, nullptr);
  auto client = client_for(*server);
  auto first = client.Get("/metrics");
  auto second = client.Get("/metrics");
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->body, "scrape 1\n");
  EXPECT_EQ(second->body, "scrape 2\n");
  EXPECT_EQ(calls.load(), 2);
}

TEST(MetricsServer, RejectsMalformedAddresses) {
  for (const char* address : {"nohost", "127.0.0.1:99999", ":80", "[]:80", "127.0.0.1:", "127.0.0.1:80x", "127.0.0.1:-1",
                              "no-such-host.invalid:0"}) {
    auto server = MetricsServer::start(address, [] { return std::string(); });
    ASSERT_FALSE(server.has_value()) << address;
    EXPECT_EQ(server.error().code(), StatusCode::kInvalidArgument) << address << ": " << server.error().to_string();
  }
}

TEST(MetricsServer, ReportsAPortInUseAsUnavailable) {
  auto first = start_local([] { return std::string("first\n"); });
  ASSERT_NE(first, nullptr);
  auto second = MetricsServer::start(first->address(), [] { return std::string("second\n"); });
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error().code(), StatusCode::kUnavailable) << second.error().to_string();
  // Why, in the kernel's words: the message said only "cannot listen".
  EXPECT_NE(second.error().message().find("Address already in use"), std::string::npos) << second.error().message();
}

// A raw client, for what an HTTP library will not send. Reads time out
// after 2 s, so a server that never answers fails the test, not hangs it.
class RawClient {
 public:
  explicit RawClient(const MetricsServer& server) {
    auto at = parse_socket_address(server.address());
    EXPECT_TRUE(at.has_value());
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval two_seconds{2, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &two_seconds, sizeof two_seconds);
    connected_ = at && ::connect(fd_, at->get(), at->length) == 0;
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  [[nodiscard]] bool connected() const { return connected_; }
  // False once the server closed (EPIPE or a reset): MSG_NOSIGNAL, no SIGPIPE.
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  // Everything until the server closes, or `until` appears `count` times, or 2 s pass quietly.
  std::string read(std::string_view until = {}, int count = 1) {
    std::string got;
    char buffer[4096];
    while (until.empty() || occurrences(got, until) < count) {
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      got.append(buffer, static_cast<std::size_t>(n));
    }
    return got;
  }
  static int occurrences(std::string_view text, std::string_view what) {
    int n = 0;
    for (auto at = text.find(what); at != std::string_view::npos; at = text.find(what, at + what.size())) ++n;
    return n;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

constexpr std::string_view kScrape = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

// Clients that stop halfway through a request used to hold both of the
// server's workers: every scrape after them waited or timed out.
TEST(MetricsServer, StalledClientsDoNotHoldOtherScrapes) {
  auto server = start_local([] { return std::string("up 1\n"); });
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<RawClient>> stalled;
  for (int i = 0; i < 4; ++i) {
    stalled.push_back(std::make_unique<RawClient>(*server));
    ASSERT_TRUE(stalled.back()->connected());
    ASSERT_TRUE(stalled.back()->send("GET /metrics HTTP/1.1\r\nHo"));
  }
  for (int i = 0; i < 3; ++i) expect_scrapes(*server, "up 1\n");
}

// A client that sends a byte at a time kept the server, and so the engine's
// shutdown, waiting for as long as it kept sending. Now the server closes
// it: the client sees its connection end long before it ran out of bytes.
TEST(MetricsServer, StopsWithoutWaitingForATricklingClient) {
  auto server = start_local([] { return std::string("up 1\n"); });
  ASSERT_NE(server, nullptr);
  RawClient trickler(*server);
  ASSERT_TRUE(trickler.connected());
  ASSERT_TRUE(trickler.send("GET /metrics HTTP/1.1\r\nX-Slow: "));
  constexpr int kBytes = 400;  // at 25 ms each: 10 s of trickling
  std::atomic<int> sent{0};
  std::atomic<bool> closed{false};
  std::thread trickle([&] {
    for (int i = 0; i < kBytes; ++i) {
      if (!trickler.send("b")) {
        closed = true;
        return;
      }
      ++sent;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  });
  while (sent < 8) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server.reset();  // returns while the client still trickles: it would have waited for all of it
  const int sent_at_stop = sent;
  trickle.join();
  EXPECT_TRUE(closed);
  EXPECT_LT(sent_at_stop, kBytes);
  EXPECT_LE(sent.load(), sent_at_stop + 3);  // the next sends fail: the connection is gone
}

// A body is never read: a POST of 400 MiB used to be buffered whole (RSS
// +400 MB) before its 404.
TEST(MetricsServer, AnswersOtherMethodsBeforeReadingTheirBody) {
  auto server = start_local([] { return std::string("up 1\n"); });
  ASSERT_NE(server, nullptr);
  RawClient poster(*server);
  ASSERT_TRUE(poster.connected());
  poster.send("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 419430400\r\n\r\n" + std::string(64 << 10, 'z'));
  const std::string answer = poster.read("\r\n\r\n");
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 405")) << answer.substr(0, 80);
  EXPECT_NE(answer.find("Allow: GET, HEAD"), std::string::npos) << answer;
  RawClient getter(*server);  // a GET with a body: refused before it is read
  ASSERT_TRUE(getter.connected());
  getter.send("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 419430400\r\n\r\n" + std::string(64 << 10, 'z'));
  EXPECT_TRUE(getter.read("\r\n\r\n").starts_with("HTTP/1.1 413"));
  auto client = client_for(*server);
  auto head = client.Head("/metrics");
  ASSERT_TRUE(head) << httplib::to_string(head.error());
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
  auto put = client.Put("/metrics", "x", "text/plain");
  ASSERT_TRUE(put) << httplib::to_string(put.error());
  EXPECT_EQ(put->status, 405);
}

// 1.5 million headers grew the holder by 370 MB, kept after the answer,
// and got a 200. A request's line and headers now fit in 16 KiB or are
// refused.
TEST(MetricsServer, RefusesAFloodOfHeaders) {
  auto server = start_local([] { return std::string("up 1\n"); });
  ASSERT_NE(server, nullptr);
  RawClient flooder(*server);
  ASSERT_TRUE(flooder.connected());
  std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 4000; ++i) request += "X-Pad-" + std::to_string(i) + ": " + std::string(40, 'p') + "\r\n";
  request += "\r\n";
  (void)flooder.send(request);  // may fail part way: the server closes once it has refused
  const std::string answer = flooder.read("\r\n\r\n");
  EXPECT_FALSE(answer.starts_with("HTTP/1.1 200")) << answer.substr(0, 80);
  expect_scrapes(*server, "up 1\n");
}

// Requests sent back to back on one connection each get their answer
// (all but the first were dropped).
TEST(MetricsServer, AnswersPipelinedRequests) {
  std::atomic<int> calls{0};
  auto server = start_local([&] { return "scrape " + std::to_string(++calls) + "\n"; });
  ASSERT_NE(server, nullptr);
  RawClient client(*server);
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.send(std::string(kScrape) + std::string(kScrape) + std::string(kScrape)));
  const std::string answers = client.read("scrape 3\n");
  EXPECT_EQ(RawClient::occurrences(answers, "HTTP/1.1 200"), 3) << answers;
  EXPECT_EQ(calls.load(), 3);
}

// The destructor can run before the server thread has begun to listen.
TEST(MetricsServer, StopsWhenDestroyedRightAfterStart) {
  for (int i = 0; i < 50; ++i) {
    auto server = start_local([] { return std::string(); });
    ASSERT_NE(server, nullptr);
  }
}

}  // namespace
}  // namespace baton::engine
