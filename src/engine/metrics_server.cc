#include "engine/metrics_server.h"

#include <atomic>
#include <charconv>
#include <thread>
#include <utility>

#include <httplib.h>

namespace baton::engine {

namespace {

constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4";

struct HostPort {
  std::string host;  // as written, brackets included
  int port;
};

Result<HostPort> parse_address(std::string_view address) {
  const auto colon = address.rfind(':');
  if (colon == std::string_view::npos) {
    return std::unexpected(Status::invalid_argument(
        "MetricsServer::start: address '{}' has no port (expected host:port)", address));
  }
  const std::string_view host = address.substr(0, colon);
  const std::string_view port_text = address.substr(colon + 1);
  if (host.empty() || host == "[]") {
    return std::unexpected(Status::invalid_argument(
        "MetricsServer::start: address '{}' has no host (expected host:port)", address));
  }
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc{} || end != port_text.data() + port_text.size() || port > 65535) {
    return std::unexpected(Status::invalid_argument(
        "MetricsServer::start: port '{}' in '{}' is not a number in 0..65535", port_text, address));
  }
  return HostPort{std::string(host), static_cast<int>(port)};
}

}  // namespace

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(std::string_view address,
                                                            std::function<std::string()> text) {
  auto parsed = parse_address(address);
  if (!parsed) return std::unexpected(parsed.error());
  std::string bind_host = parsed->host;
  if (bind_host.size() >= 2 && bind_host.front() == '[' && bind_host.back() == ']') {
    bind_host = bind_host.substr(1, bind_host.size() - 2);  // getaddrinfo wants a bare IPv6 address
  }

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
  int port = parsed->port;
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
      new MetricsServer(std::move(impl), fmt::format("{}:{}", parsed->host, port)));
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
