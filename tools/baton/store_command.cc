// `baton store`: the block holder as a process (docs/store.md). Holds KV
// blocks of each --namespace in engine memory and serves the store's RPCs
// on loopback until SIGINT, SIGTERM or SIGHUP. Prints "address HOST:PORT" (the
// RPCs), "engine HOST:PORT" (where clients connect() their engine to read
// and write blocks) and, with --metrics-address, where /metrics is. With
// --directory it registers in etcd under a lease and leaves on exit.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <charconv>
#include <limits>
#include <regex>

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include "baton/common/host_port.h"
#include "baton/common/log.h"
#include "baton/common/units.h"
#include "baton/engine/engine.h"
#include "baton/store/block_store.h"
#include "baton/store/directory.h"
#include "baton/store/service.h"
#include "commands.h"
#include "ucx_options.h"

namespace baton::cli {
namespace {

struct StoreOptions {
  std::string listen = "127.0.0.1:0";
  std::string engine_listen = "127.0.0.1:0";
  transport::UcxConfig ucx;  // the engine's, but for listen_address: --engine-listen
  std::vector<std::string> namespaces;
  std::string lock_timeout = "120s";
  std::string unsealed_timeout = "60s";
  std::string metrics_address;
  std::string directory;  // etcd host:port; empty: none
  std::string name;       // the store's name in the directory
  std::string lease = "10s";
  bool entry_flags_given = false;  // --name or --lease, even at its default value
};

// "NAME:SLOTSxSEGMENTSxBYTES:BLOCKS[:NUMA,NUMA…]", e.g. llama:288x2x16384:1000:0,1
// (NUMA node 0 when none is named).
Result<store::NamespaceConfig> parse_namespace(const std::string& text) {
  static const std::regex form(R"(([A-Za-z0-9_.-]+):(\d+)x(\d+)x(\d+):(\d+)(?::(\d+(?:,\d+)*))?)");
  // std::regex recurses once per character: a long argument would overflow
  // the stack before it could be refused.
  constexpr std::size_t kLongest = 1024;
  std::smatch m;
  if (text.size() > kLongest || !std::regex_match(text, m, form)) {
    return std::unexpected(Status::invalid_argument(
        "--namespace \"{}\": expected NAME:SLOTSxSEGMENTSxBYTES:BLOCKS[:NUMA,…] (llama:288x2x16384:1000:0,1)",
        text.size() > 80 ? text.substr(0, 80) + "…" : text));
  }
  // Each number whole, or an error naming it: a cast of stoul's result made
  // 4294967297 slots into 1.
  auto number = [&](int group, const char* what, std::uint64_t most) -> Result<std::uint32_t> {
    std::uint64_t v = 0;
    const std::string digits = m[group];
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (error != std::errc{} || end != digits.data() + digits.size() || v > most) {
      return std::unexpected(Status::invalid_argument("--namespace \"{}\": {} {} (at most {})", text, what, digits, most));
    }
    return static_cast<std::uint32_t>(v);
  };
  constexpr std::uint64_t kU32 = std::numeric_limits<std::uint32_t>::max();
  store::NamespaceConfig c;
  c.name = m[1];
  auto slots = number(2, "slots", kU32);
  auto segments = number(3, "segments", kU32);
  auto bytes = number(4, "bytes", kU32);
  auto blocks = number(5, "blocks", store::BlockStore::kMaxBlocksPerPool);
  for (const auto* r : {&slots, &segments, &bytes, &blocks}) {
    if (!*r) return std::unexpected(r->error());
  }
  c.layout = {*slots, *segments, *bytes};
  c.blocks_per_numa = *blocks;
  if (m[6].matched) {
    c.numa_nodes.clear();
    const std::string list = m[6];
    for (std::size_t at = 0; at <= list.size();) {
      const std::size_t comma = std::min(list.find(',', at), list.size());
      int node = -1;
      const auto [end, error] = std::from_chars(list.data() + at, list.data() + comma, node);
      if (error != std::errc{} || end != list.data() + comma) {
        return std::unexpected(Status::invalid_argument("--namespace \"{}\": NUMA node \"{}\"", text,
                                                        list.substr(at, comma - at)));
      }
      c.numa_nodes.push_back(node);
      at = comma + 1;
    }
  }
  if (auto s = c.layout.validate(); !s.is_ok()) return std::unexpected(Status::invalid_argument("--namespace \"{}\": {}", text, s.message()));
  if (c.blocks_per_numa == 0) return std::unexpected(Status::invalid_argument("--namespace \"{}\": 0 blocks", text));
  // A pool is one allocation: bound it so a typo cannot take the machine's
  // memory (in 128 bits: three 32-bit factors and a block count overflow 64).
  const unsigned __int128 pool = static_cast<unsigned __int128>(c.layout.block_bytes()) * c.blocks_per_numa;
  if (pool > (std::uint64_t{64} << 30)) {
    return std::unexpected(Status::invalid_argument("--namespace \"{}\": a pool of {:.0f} bytes (above 64 GiB)", text,
                                                    static_cast<double>(pool)));
  }
  return c;
}

int run_store(const StoreOptions& o) {
  auto fail = [](int code, const std::string& why) {
    fmt::print(stderr, "baton store: {}\n", why);
    return code;
  };
  if (o.namespaces.empty()) return fail(2, "at least one --namespace is needed");
  if (o.directory.empty() && o.entry_flags_given) {
    return fail(2, "--name and --lease need --directory (they are the store's entry there)");
  }
  if (!o.directory.empty()) {
    if (auto at = split_host_port(o.directory); !at) return fail(2, fmt::format("--directory: {}", at.error().message()));
  }
  std::vector<store::NamespaceConfig> namespaces;
  unsigned __int128 total = 0;  // every pool on every NUMA node
  for (const auto& text : o.namespaces) {
    auto c = parse_namespace(text);
    if (!c) return fail(2, c.error().message());
    total += static_cast<unsigned __int128>(c->layout.block_bytes()) * c->blocks_per_numa * c->numa_nodes.size();
    namespaces.push_back(*c);
  }
  // Pools are allocated up front but filled as blocks come: more than the
  // machine holds starts, then dies when the store fills (each pool was
  // checked alone; two of 14 GiB started on a 23 GiB machine).
  const auto physical = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  if (physical > 0 && total > physical) {
    return fail(2, fmt::format("the namespaces' pools hold {:.1f} GiB in all, more than this machine's {:.1f} GiB of "
                               "memory",
                               static_cast<double>(total) / (1 << 30), static_cast<double>(physical) / (1 << 30)));
  }
  auto lock_timeout = parse_duration(o.lock_timeout);
  auto unsealed_timeout = parse_duration(o.unsealed_timeout);
  if (!lock_timeout || *lock_timeout <= 0) return fail(2, fmt::format("--lock-timeout \"{}\": expected a positive duration", o.lock_timeout));
  if (!unsealed_timeout || *unsealed_timeout <= 0) {
    return fail(2, fmt::format("--unsealed-timeout \"{}\": expected a positive duration", o.unsealed_timeout));
  }
  // The stop signals reach sigwait below only (every thread inherits the mask).
  const sigset_t stop = block_stop_signals();

  engine::EngineConfig config;
  config.ucx = o.ucx;
  config.ucx.listen_address = o.engine_listen;
  config.metrics_address = o.metrics_address;
  auto engine = engine::Engine::create(config);
  if (!engine) return fail(exit_code(engine.error()), engine.error().to_string());
  auto blocks = store::BlockStore::create(**engine, {.lock_timeout_ns = *lock_timeout,
                                                     .unsealed_timeout_ns = *unsealed_timeout,
                                                     .metrics = &(*engine)->metrics()});
  if (!blocks) return fail(2, blocks.error().to_string());
  for (const auto& ns : namespaces) {
    if (auto s = (*blocks)->add_namespace(ns); !s.is_ok()) {
      return fail(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kAlreadyExists ? 2 : 1,
                  s.to_string());
    }
  }
  auto server = store::StoreServer::start(**blocks, **engine, {.listen = o.listen});
  if (!server) return fail(exit_code(server.error()), server.error().to_string());
  // In the directory under a lease: if this process dies, it leaves when
  // the lease expires.
  std::unique_ptr<store::Directory> directory;
  if (!o.directory.empty()) {
    auto lease = parse_duration(o.lease);
    if (!lease || *lease < 1'000'000'000) return fail(2, fmt::format("--lease \"{}\": expected at least 1s", o.lease));
    auto d = store::Directory::connect(o.directory);
    if (!d) return fail(2, d.error().to_string());
    // Capacity: every pool's bytes, summed above (at most the machine's memory).
    store::StoreRecord record{o.name.empty() ? (*server)->address() : o.name, (*server)->address(),
                              (*engine)->address(), static_cast<std::uint64_t>(total), {}};
    for (const auto& ns : namespaces) {
      for (int n : ns.numa_nodes) {
        if (std::ranges::find(record.numa_nodes, n) == record.numa_nodes.end()) record.numa_nodes.push_back(n);
      }
    }
    if (auto s = (*d)->register_store(record, *lease); !s.is_ok()) return fail(exit_code(s), s.to_string());
    directory = std::move(*d);
  }
  fmt::print("address {}\n", (*server)->address());
  fmt::print("engine {}\n", (*engine)->address());
  if (!(*engine)->metrics_address().empty()) fmt::print("metrics http://{}/metrics\n", (*engine)->metrics_address());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop, &signal);
  baton::logger().info("baton store: {} received, shutting down", stop_signal_name(signal));
  // Leave at once, not at expiry. Unreachable etcd: the record stays until
  // its lease expires, and routers place blocks on this store until then —
  // said, and the exit is 1.
  Status left = directory ? directory->deregister() : Status::ok();
  server->reset();
  blocks->reset();
  (*engine)->shutdown();
  if (!left.is_ok()) {
    return fail(1, fmt::format("could not leave the directory ({}): the record stays until its lease expires (--lease {})",
                               left.to_string(), o.lease));
  }
  return 0;
}

}  // namespace

Command add_store_command(CLI::App& parent) {
  auto o = std::make_shared<StoreOptions>();
  CLI::App* app = parent.add_subcommand("store", "Hold KV blocks and serve the store's RPCs until SIGINT, SIGTERM or SIGHUP");
  app->add_option("--listen", o->listen, "RPC address (loopback; port 0: any free port)")->check(kHostPort);
  app->add_option("--engine-listen", o->engine_listen, "The engine's handshake address (port 0: any free port)");
  add_ucx_options(*app, o->ucx);
  app->add_option("--namespace", o->namespaces,
                  "NAME:SLOTSxSEGMENTSxBYTES:BLOCKS[:NUMA,…] (repeatable), e.g. llama:288x2x16384:1000:0,1");
  app->add_option("--lock-timeout", o->lock_timeout, "How long a query's lock lasts unless released (duration)")
      ->check(kPositiveDuration);
  app->add_option("--unsealed-timeout", o->unsealed_timeout, "How long allocated pages wait for their seal (duration)")
      ->check(kPositiveDuration);
  app->add_option("--metrics-address", o->metrics_address, "Serve GET /metrics on host:port (port 0: any free port)")->check(kHostPort);
  app->add_option("--directory", o->directory, "Register in this etcd (host:port) under a lease")->check(kHostPort);
  app->add_option("--name", o->name, "The store's name in the directory (default: its RPC address)");
  app->add_option("--lease", o->lease, "The directory lease's TTL (duration, at least 1s)")->check(kPositiveDuration);
  return {app, [app, o] {
            o->entry_flags_given = app->count("--name") + app->count("--lease") > 0;
            return run_store(*o);
          }};
}

}  // namespace baton::cli
