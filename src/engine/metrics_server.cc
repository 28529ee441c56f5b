#include "engine/metrics_server.h"

#include <atomic>
#include <thread>
#include <utility>

#include <httplib.h>

#include "baton/common/host_port.h"
#include "baton/common/socket_address.h"

namespace baton::engine {

namespace {

constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4";

}  // namespace

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(std::string_view address,
                                                            std::function<std::string()> text) {
  // Resolved here too: a host that does not resolve is the caller's error,
  // as for the engine's listen address, not a bind that failed.
  if (auto resolved = parse_socket_address(address); !resolved) {
    return std::unexpected(Status::invalid_argument("MetricsServer::start: {}", resolved.error().message()));
  }
  const auto parsed = split_host_port(address);  // cannot fail now: the host, for httplib
  const std::string bind_host(parsed->host);  // brackets dropped: getaddrinfo wants a bare IPv6 address

  auto impl = std::make_unique<Impl>();
  httplib::Server& server = impl->server;
  // httplib's default sets SO_REUSEPORT, which lets a second server bind a port
  // already in use and silently split the scrapes; SO_REUSEADDR alone still
  // allows a restart while old connections sit in TIME_WAIT.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // The default pool is at least 8 threads; a scrape endpoint has one or two
  // scrapers, each holding a worker for the life of its keep-alive connection.
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  server.Get("/metrics", [text = std::move(text)](const httplib::Request&, httplib::Response& response) {
    response.set_content(text(), kPrometheusContentType);
  });

  // Bind here, not on the thread, so the port is listening (and a bind error is
  // reported) before start() returns.
  int port = static_cast<int>(parsed->port);
  if (port == 0) {
    port = server.bind_to_any_port(bind_host);
  } else if (!server.bind_to_port(bind_host, port)) {
    port = -1;
  }
  if (port < 0) {
    return std::unexpected(Status::unavailable("MetricsServer::start: cannot listen on '{}'", address));
  }

  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    raw->server.listen_after_bind();
    raw->listen_returned = true;
  });
  return std::unique_ptr<MetricsServer>(
      // The host as the caller wrote it (brackets kept), with the port bound.
      new MetricsServer(std::move(impl), fmt::format("{}:{}", address.substr(0, address.rfind(':')), port)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

MetricsServer::~MetricsServer() {
  // Server::stop() does nothing until the thread is inside listen_after_bind()
  // (it checks is_running()), and a destructor right after start() can get here
  // first: wait for the loop to begin, or to have ended on its own.
  while (!impl_->server.is_running() && !impl_->listen_returned) {
    std::this_thread::yield();
  }
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace baton::engine
