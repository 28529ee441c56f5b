// `baton bench idle`: what an engine with a connected peer costs when
// nothing moves. Spawns a `baton serve`, connects an engine to it, moves one
// request, then measures both processes' CPU time over a quiet window.
#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "baton/common/units.h"
#include "baton/engine/engine.h"
#include "commands.h"
#include "json_output.h"
#include "serve_child.h"
#include "ucx_options.h"

namespace baton::cli {
namespace {

struct IdleOptions {
  std::string duration = "5s";
  transport::UcxConfig ucx;
  std::string json;
};

// User + system CPU seconds of a process so far (/proc/PID/stat).
Result<double> cpu_seconds(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return std::unexpected(Status::unavailable("cannot read /proc/{}/stat", pid));
  std::istringstream fields(text.substr(close + 2));
  std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
  if (f.size() < 13) return std::unexpected(Status::unavailable("short /proc/{}/stat", pid));
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return (std::stod(f[11]) + std::stod(f[12])) / ticks;  // utime, stime (fields 14, 15)
}

int run_idle(const IdleOptions& o) {
  auto duration = parse_flag_duration(o.duration);
  if (!duration || *duration <= 0) {
    fmt::print(stderr, "baton bench idle: --duration: {}\n", duration ? "must be > 0" : duration.error().message());
    return 2;
  }
  auto child = ServeChild::start(serve_args(1 << 20, o.ucx));
  if (!child) {
    fmt::print(stderr, "baton bench idle: {}\n", child.error().message());
    return 1;
  }
  auto e = engine::Engine::create(engine::EngineConfig{.ucx = o.ucx});
  std::vector<std::byte> buffer(1 << 20);
  auto local = e ? (*e)->register_memory(buffer.data(), buffer.size()) : Result<engine::Region>(std::unexpected(e.error()));
  auto peer = local ? (*e)->connect(child->address()) : Result<engine::Peer>(std::unexpected(local.error()));
  if (!peer) {
    fmt::print(stderr, "baton bench idle: {}\n", peer.error().to_string());
    return 1;
  }
  engine::Request r;
  r.local_region = local->handle;
  r.peer = peer->address;
  r.remote_region = (*e)->remote_regions(*peer)->front().key;
  r.length = buffer.size();
  auto h = (*e)->submit(engine::Batch{{r}, {}});
  if (!h || !(*e)->wait(*h, 30'000'000'000).is_ok()) {
    fmt::print(stderr, "baton bench idle: the warm-up read did not finish\n");
    return 1;
  }
  const std::uint64_t turns_before = (*e)->loop_turns();
  const auto self0 = cpu_seconds(::getpid());
  const auto peer0 = cpu_seconds(child->pid());
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::nanoseconds(*duration));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto self1 = cpu_seconds(::getpid());
  const auto peer1 = cpu_seconds(child->pid());
  const std::uint64_t turns = (*e)->loop_turns() - turns_before;
  if (!self0 || !self1 || !peer0 || !peer1) {
    fmt::print(stderr, "baton bench idle: cannot read CPU times\n");
    return 1;
  }
  (*e)->shutdown();
  if (Status s = child->stop(); !s.is_ok()) {
    fmt::print(stderr, "baton bench idle: {}\n", s.message());
    return 1;
  }
  const double self_pct = 100.0 * (*self1 - *self0) / wall;
  const double peer_pct = 100.0 * (*peer1 - *peer0) / wall;
  fmt::print("idle {:.1f} s with a connected peer: initiator {:.2f}% of a core ({} loop turns), serve {:.2f}%\n", wall,
             self_pct, turns, peer_pct);
  nlohmann::json j{{"duration_s", wall},
                   {"initiator_cpu_percent", self_pct},
                   {"serve_cpu_percent", peer_pct},
                   {"initiator_loop_turns", turns}};
  return emit_json("bench idle", j.dump(2), o.json);
}

}  // namespace

Command add_bench_idle(CLI::App& bench) {
  auto o = std::make_shared<IdleOptions>();
  CLI::App* app = bench.add_subcommand("idle", "CPU an engine and its connected `baton serve` peer use while idle");
  app->add_option("--duration", o->duration, "The quiet window (duration)")->check(kPositiveDuration);
  add_ucx_options(*app, o->ucx);
  app->add_option("--json", o->json, "Write the figures as JSON to PATH (- for stdout)");
  return {app, [o] { return run_idle(*o); }};
}

}  // namespace baton::cli
