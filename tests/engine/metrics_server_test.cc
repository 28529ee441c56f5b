// The /metrics endpoint: a Prometheus scrape gets exactly the callback's text
// with the exposition content type, each scrape renders afresh, and bad
// addresses or a taken port are reported as a Status.
#include "engine/metrics_server.h"

#include <atomic>
#include <string>

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
