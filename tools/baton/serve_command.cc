// `baton serve`: an engine that registers one pattern-filled buffer and
// serves it to peers until SIGINT or SIGTERM. Prints "address HOST:PORT" as
// its first line (what `bench throughput --spawn` and the demo read).
#include <csignal>
#include <cstdio>
#include <vector>

#include <fmt/core.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include "baton/common/units.h"
#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "commands.h"
#include "serve_child.h"

namespace baton::cli {
namespace {

struct ServeOptions {
  std::string buffer_size = "256MiB";
  std::string listen = "127.0.0.1:0";
  std::string ucx_tls;
  int lanes = 2;
  bool peer_failure_detection = true;
  std::string metrics_address;
};

int run_serve(const ServeOptions& o) {
  auto bytes = parse_size(o.buffer_size);
  if (!bytes || *bytes == 0) {
    fmt::print(stderr, "baton serve: --buffer-size: {}\n", bytes ? "must be > 0" : bytes.error().message());
    return 2;
  }
  // Block the stop signals before any thread starts, so every thread
  // inherits the mask and sigwait below is the one place they arrive.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  engine::EngineConfig config;
  config.clock = engine::ClockKind::kWall;
  config.transport = engine::TransportKind::kUcx;
  config.ucx.listen_address = o.listen;
  config.ucx.tls = o.ucx_tls;
  config.ucx.lanes_per_peer = o.lanes;
  config.ucx.peer_failure_detection = o.peer_failure_detection;
  config.metrics_address = o.metrics_address;
  auto engine = engine::Engine::create(config);
  if (!engine) {
    fmt::print(stderr, "baton serve: {}\n", engine.error().to_string());
    return 1;
  }
  // Allocated by the engine, so a peer on this host reaches it through
  // shared memory without waking us.
  auto region = (*engine)->allocate_memory(*bytes);
  if (!region) {
    fmt::print(stderr, "baton serve: {}\n", region.error().to_string());
    return 1;
  }
  engine::fill_pattern(std::span(reinterpret_cast<std::byte*>(region->base), region->length), kServeSalt);
  fmt::print("address {}\n", (*engine)->address());
  fmt::print("region {} bytes {}\n", region->handle, region->length);
  if (!(*engine)->metrics_address().empty()) fmt::print("metrics http://{}/metrics\n", (*engine)->metrics_address());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop, &signal);
  spdlog::info("baton serve: {} received, shutting down", signal == SIGINT ? "SIGINT" : "SIGTERM");
  (*engine)->shutdown();
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& parent) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* app = parent.add_subcommand("serve", "Register a pattern-filled buffer and serve it to peers until SIGINT/SIGTERM");
  app->add_option("--buffer-size", o->buffer_size, "Bytes to register (size: 256MiB, 1GB …)");
  app->add_option("--listen", o->listen, "Handshake address host:port (port 0: any free port)");
  app->add_option("--ucx-tls", o->ucx_tls, "UCX_TLS for this engine (e.g. tcp); empty: UCX's default");
  app->add_option("--lanes", o->lanes, "UCP endpoints per peer")->check(CLI::PositiveNumber);
  app->add_flag("--peer-failure-detection,!--no-peer-failure-detection", o->peer_failure_detection,
                "Report a dead peer as unavailable (default on; off lets UCX pick shared memory)");
  app->add_option("--metrics-address", o->metrics_address, "Serve GET /metrics on host:port (port 0: any free port)");
  return {app, [o] { return run_serve(*o); }};
}

}  // namespace baton::cli
