// `baton serve`: an engine that registers one pattern-filled buffer and
// serves it to peers until SIGINT, SIGTERM or SIGHUP. Prints "address HOST:PORT" as
// its first line (what `bench throughput --spawn` and the demo read).
#include <csignal>
#include <cstdio>
#include <vector>

#include <fmt/core.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include "baton/common/log.h"
#include "baton/common/units.h"
#include "baton/engine/engine.h"
#include "baton/engine/pattern.h"
#include "commands.h"
#include "serve_child.h"
#include "ucx_options.h"

namespace baton::cli {
namespace {

struct ServeOptions {
  std::string buffer_size = "256MiB";
  transport::UcxConfig ucx;  // listen_address: --listen
  std::string metrics_address;
  std::vector<std::string> export_to;  // empty: every authenticated peer
  std::string memory = "engine";
};

int run_serve(const ServeOptions& o) {
  if (o.memory != "engine" && o.memory != "caller") {
    fmt::print(stderr, "baton serve: --memory \"{}\": expected engine or caller\n", o.memory);
    return 2;
  }
  auto bytes = parse_size(o.buffer_size);
  if (!bytes || *bytes == 0) {
    fmt::print(stderr, "baton serve: --buffer-size: {}\n", bytes ? "must be > 0" : bytes.error().message());
    return 2;
  }
  // Before any thread starts: sigwait below is the one place they arrive.
  const sigset_t stop = block_stop_signals();

  engine::EngineConfig config = engine::EngineConfig{.ucx = o.ucx};
  config.metrics_address = o.metrics_address;
  auto engine = engine::Engine::create(config);
  if (!engine) return fail_command("serve", engine.error());
  // engine: allocated by the engine, so a peer on this host maps it and
  // copies without waking us. caller: our own buffer, registered, as a
  // framework registers its KV tensors; a peer on this host reaches it with
  // CMA, which fails the moment we die (a mapping outlives us).
  std::vector<std::byte> own;
  Result<engine::Region> region = std::unexpected(Status::internal("unset"));
  if (o.memory == "engine") {
    region = (*engine)->allocate_memory(*bytes);
  } else {
    own.resize(*bytes);
    region = (*engine)->register_memory(own.data(), own.size());
  }
  if (!region) return fail_command("serve", region.error());
  // In slices, looking for a stop signal between them: gigabytes take
  // seconds to fill, and a Ctrl-C (or a parent gone) must not wait for them.
  const std::span buffer(reinterpret_cast<std::byte*>(region->base), region->length);
  constexpr std::size_t kSlice = std::size_t{64} << 20;
  for (std::size_t at = 0; at < buffer.size(); at += kSlice) {
    const timespec no_wait{};
    if (const int early = sigtimedwait(&stop, nullptr, &no_wait); early > 0) {
      baton::logger().info("baton serve: {} received while filling the buffer", stop_signal_name(early));
      (*engine)->shutdown();  // before `own` goes
      return 0;
    }
    engine::fill_pattern(buffer.subspan(at, std::min(kSlice, buffer.size() - at)), kServeSalt, at);
  }
  if (Status s = (*engine)->export_region(region->handle, o.export_to); !s.is_ok()) return fail_command("serve", s);
  fmt::print("address {}\n", (*engine)->address());
  fmt::print("region {} bytes {}\n", region->handle, region->length);
  if (!(*engine)->metrics_address().empty()) fmt::print("metrics http://{}/metrics\n", (*engine)->metrics_address());
  std::fflush(stdout);

  // Peers' batch notifications are taken as they come (and logged at debug):
  // left untaken they would wait in the engine until the oldest drop.
  int signal = 0;
  constexpr timespec kTakeEvery{.tv_sec = 0, .tv_nsec = 100'000'000};
  while ((signal = sigtimedwait(&stop, nullptr, &kTakeEvery)) <= 0) {
    for (const transport::Notification& n : (*engine)->take_notifications()) {
      baton::logger().debug("baton serve: a notification of {} bytes from {}", n.message.size(), n.from);
    }
  }
  baton::logger().info("baton serve: {} received, shutting down", stop_signal_name(signal));
  (*engine)->shutdown();  // before `own` goes
  return 0;
}

}  // namespace

Command add_serve_command(CLI::App& parent) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* app = parent.add_subcommand("serve", "Register a pattern-filled buffer and serve it to peers until SIGINT, SIGTERM or SIGHUP");
  app->add_option("--buffer-size", o->buffer_size, "Bytes to register (size: 256MiB, 1GB …)");
  app->add_option("--listen", o->ucx.listen_address, "Handshake address host:port (port 0: any free port)")->check(kHostPort);
  add_ucx_options(*app, o->ucx);
  app->add_option("--export-to", o->export_to,
                  "Export the buffer only to these peers (their listen addresses, repeatable); default: every peer "
                  "that proves the secret");
  app->add_option("--metrics-address", o->metrics_address, "Serve GET /metrics on host:port (port 0: any free port)")->check(kHostPort);
  app->add_option("--memory", o->memory,
                  "engine: allocated by the engine (same-host peers map it); caller: a buffer of ours, registered "
                  "(same-host peers use CMA), as a framework's KV tensors are");
  return {app, [o] { return run_serve(*o); }};
}

}  // namespace baton::cli
