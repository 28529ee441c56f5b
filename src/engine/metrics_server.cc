#include "engine/metrics_server.h"

#include <unistd.h>

#include <cstring>
#include <utility>

#include <microhttpd.h>

#include "baton/common/host_port.h"
#include "baton/common/socket_address.h"

namespace baton::engine {

namespace {

constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4";

// libmicrohttpd serves every connection from one polling thread, so a client
// that stalls or trickles a request holds a connection slot, not a worker:
// other scrapes go on, and stopping closes every connection at once (the
// thread-pool server before kept a slow client's worker, and shutdown,
// waiting for as long as it sent a byte every few seconds).
constexpr unsigned kMaxConnections = 64;
constexpr unsigned kMaxConnectionsPerAddress = 16;  // one host cannot take every slot
constexpr unsigned kIdleTimeoutSeconds = 10;
// A request's line and headers fit in this, or it is refused (431) and its
// connection closed: a flood of headers cannot grow the holder's memory.
constexpr std::size_t kConnectionMemoryBytes = 16 << 10;

MHD_Result answer(MHD_Connection* connection, unsigned status, const std::string& body, const char* content_type) {
  MHD_Response* response =
      MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

struct MetricsServer::Impl {
  std::function<std::string()> text;
  MHD_Daemon* daemon = nullptr;

  // GET/HEAD /metrics: the callback's text; another path 404; another
  // method, or a body, 405/413 at once, before any of the body is read (a
  // response queued before the request is complete makes libmicrohttpd drop
  // the rest and close). A complete request is answered on the second call,
  // as the library wants for the connection to stay open.
  static MHD_Result handle(void* self, MHD_Connection* connection, const char* url, const char* method,
                           const char* /*version*/, const char* /*upload_data*/, std::size_t* upload_size,
                           void** request_state) {
    const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 || std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    if (!get) return answer(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n", "text/plain");
    if (*request_state == nullptr) {
      const char* length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      if ((length != nullptr && std::strcmp(length, "0") != 0) ||
          MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != nullptr) {
        return answer(connection, MHD_HTTP_CONTENT_TOO_LARGE, "a scrape has no body\n", "text/plain");
      }
      *request_state = self;  // headers seen; the request is complete on the next call
      return MHD_YES;
    }
    *upload_size = 0;
    if (std::strcmp(url, "/metrics") != 0) return answer(connection, MHD_HTTP_NOT_FOUND, "not found\n", "text/plain");
    return answer(connection, MHD_HTTP_OK, static_cast<Impl*>(self)->text(), kPrometheusContentType);
  }
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(std::string_view address,
                                                            std::function<std::string()> text) {
  // Resolved here: a host that does not resolve is the caller's error, as
  // for the engine's listen address, not a bind that failed.
  auto resolved = parse_socket_address(address);
  if (!resolved) {
    return std::unexpected(Status::invalid_argument("MetricsServer::start: {}", resolved.error().message()));
  }
  // Bound here, not by the library, so that a bind error says why and the
  // port is listening before start() returns.
  auto fd = listen_tcp(*resolved, 64);
  if (!fd) return std::unexpected(Status::unavailable("MetricsServer::start: {}", fd.error().message()));
  auto bound = bound_address(*fd);
  if (!bound) {
    ::close(*fd);
    return std::unexpected(Status::unavailable("MetricsServer::start: {}", bound.error().message()));
  }

  auto impl = std::make_unique<Impl>();
  impl->text = std::move(text);
  impl->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, 0, nullptr, nullptr, &Impl::handle, impl.get(),
      MHD_OPTION_LISTEN_SOCKET, *fd, MHD_OPTION_CONNECTION_LIMIT, kMaxConnections,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxConnectionsPerAddress, MHD_OPTION_CONNECTION_TIMEOUT,
      kIdleTimeoutSeconds, MHD_OPTION_CONNECTION_MEMORY_LIMIT, kConnectionMemoryBytes, MHD_OPTION_END);
  if (impl->daemon == nullptr) {
    ::close(*fd);
    return std::unexpected(Status::unavailable("MetricsServer::start: the HTTP server did not start on '{}'",
                                               shown(address)));
  }
  return std::unique_ptr<MetricsServer>(
      // The host as the caller wrote it (brackets kept), with the port bound.
      new MetricsServer(std::move(impl),
                        fmt::format("{}:{}", address.substr(0, address.rfind(':')), port_of(bound->get()))));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

// Closes the listening socket and every connection, whatever its client is
// doing, and joins the polling thread.
MetricsServer::~MetricsServer() { MHD_stop_daemon(impl_->daemon); }

}  // namespace baton::engine
