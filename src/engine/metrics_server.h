// The /metrics endpoint: serves GET /metrics (Prometheus text, content type
// "text/plain; version=0.0.4") on its own thread; every other path answers
// 404. The HTTP library stays inside metrics_server.cc. Private to engine/.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "baton/common/status.h"

namespace baton::engine {

class MetricsServer {
 public:
  // `address` is "host:port" ("[v6addr]:port" for IPv6); port 0 picks a free
  // port. invalid_argument for a malformed address (no colon, bad port, empty
  // host); unavailable when it cannot bind. The port is listening when this
  // returns. `text` is called on the server thread for each scrape.
  [[nodiscard]] static Result<std::unique_ptr<MetricsServer>> start(std::string_view address,
                                                                    std::function<std::string()> text);

  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:PORT" with the real port, e.g. "127.0.0.1:39141".
  [[nodiscard]] const std::string& address() const { return address_; }

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl, std::string address);

  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace baton::engine
