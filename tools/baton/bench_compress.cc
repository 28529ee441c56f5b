// `baton bench compress`: the same bytes written to a `baton serve` plain and
// with Baton deciding whether compression pays, per kind of data, every byte
// read back and checked. Over a link shaped to 1 Gbit/s between network
// namespaces: scripts/bench-compress sets it up, runs this, tears it down.
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/common/units.h"
#include "commands.h"
#include "json_output.h"
#include "serve_child.h"
#include "ucx_options.h"
#include "workloads/compress.h"

namespace baton::cli {
namespace {

struct CompressOptions {
  workloads::CompressConfig config;
  std::vector<std::string> data{"fp16", "padded", "text"};
  std::string size = "64MiB";
  std::string block_size = "1MiB";
  std::string json_path;
  std::string target;
  bool spawn = false;
  std::string netns;
  std::string listen;
  transport::UcxConfig ucx;
};

int fail(const Status& s) { return fail_command("bench compress", s); }

int run(CompressOptions o) {
  workloads::CompressConfig& c = o.config;
  c.kinds.clear();
  for (const std::string& name : o.data) {
    auto kind = workloads::parse_payload_kind(name);
    if (!kind) return fail(Status::invalid_argument("--data: {}", kind.error().message()));
    c.kinds.push_back(*kind);
  }
  for (auto [text, field, name] : {std::tuple{&o.size, &c.bytes, "--size"},
                                   std::tuple{&o.block_size, &c.block_bytes, "--block-size"}}) {
    auto bytes = parse_size(*text);
    if (!bytes) return fail(Status::invalid_argument("{}: {}", name, bytes.error().message()));
    *field = *bytes;
  }
  if (Status s = c.validate(); !s.is_ok()) return fail(s);
  if (o.spawn == !o.target.empty()) return fail(Status::invalid_argument("name one of --target and --spawn"));
  if (!o.spawn && (!o.netns.empty() || !o.listen.empty())) {
    return fail(Status::invalid_argument("--netns and --listen are for the spawned peer (--spawn)"));
  }
  std::optional<ServeChild> child;
  std::optional<SpawnSecret> secret;
  std::string target = o.target;
  transport::UcxConfig ucx = o.ucx;
  // Compression is for a network path; a peer of this host (or another
  // namespace of it, standing for another host) would be copied directly.
  ucx.same_host_copy = false;
  if (o.spawn) {
    // A peer beyond loopback needs a secret: one for this run, unless given.
    if (ucx.secret.empty() && ucx.secret_file.empty() && std::getenv("BATON_TOKEN_FILE") == nullptr) {
      auto made = SpawnSecret::create(ucx);
      if (!made) return fail(made.error());
      secret.emplace(std::move(*made));
    }
    std::vector<std::string> args = serve_args(c.peer_bytes(), ucx);
    if (!o.listen.empty()) args.insert(args.end(), {"--listen", o.listen});
    auto started = ServeChild::start(args, "/proc/self/exe", o.netns);
    if (!started) return fail(started.error());
    child.emplace(std::move(*started));
    target = child->address();
  }
  auto rows = workloads::run_compress(c, target, ucx);
  if (!rows) return fail(rows.error());
  nlohmann::ordered_json j{{"peer", target},
                           {"netns", o.netns},
                           {"codec", c.codec},
                           {"bytes", c.bytes},
                           {"block_bytes", c.block_bytes},
                           {"slack", c.slack},
                           {"theta_compress", c.theta_compress},
                           {"rows", nlohmann::ordered_json::array()}};
  for (const workloads::CompressRow& r : *rows) {
    j["rows"].push_back({{"data", workloads::to_string(r.data)},
                         {"ratio", r.ratio},
                         {"compress_gbps", r.compress_gbps},
                         {"plain_gbps", r.plain_gbps},
                         {"auto_gbps", r.auto_gbps},
                         {"auto_wire_bytes", r.auto_wire_bytes},
                         {"verified", r.verified}});
    if (o.json_path != "-") {
      fmt::print("{:<7} ratio {:>5.2f}  plain {:>6.3f} GB/s  auto {:>6.3f} GB/s ({:.2f}x, {} on the wire)  {}\n",
                 workloads::to_string(r.data), r.ratio, r.plain_gbps, r.auto_gbps, r.auto_gbps / r.plain_gbps,
                 format_size(r.auto_wire_bytes), r.verified ? "verified" : "MISMATCH");
    }
  }
  if (child) {
    if (Status s = child->stop(); !s.is_ok()) return fail(s);
  }
  return emit_json("bench compress", j.dump(2), o.json_path);
}

}  // namespace

Command add_bench_compress(CLI::App& bench) {
  auto o = std::make_shared<CompressOptions>();
  CLI::App* app = bench.add_subcommand("compress", "Plain vs compressed-when-it-pays writes to a peer, per kind of data");
  app->add_option("--data", o->data, "Kinds of data: fp16 (KV values), padded (KV blocks with zero pages), text")
      ->delimiter(',');
  app->add_option("--size", o->size, "Bytes per kind and run (size)");
  app->add_option("--block-size", o->block_size, "Bytes per request (size)");
  app->add_option("--codec", o->config.codec, "lz4, zstd or zstd:LEVEL");
  app->add_option("--slack", o->config.slack, "The compressing run's deadline, in plain-run durations");
  app->add_option("--theta-compress", o->config.theta_compress,
                  "The compressing run's admission.theta_compress (0: every request may compress when it pays)");
  app->add_option("--seed", o->config.seed, "Seed of the data")->check(kUnsigned64);
  app->add_option("--target", o->target, "A running `baton serve` (host:port)")->check(kHostPort);
  app->add_flag("--spawn", o->spawn, "Start a `baton serve` child and use it");
  app->add_option("--netns", o->netns, "--spawn: start it inside this network namespace (scripts/netns-link)");
  app->add_option("--listen", o->listen, "--spawn: its handshake address (host:port)")->check(kHostPort);
  app->add_option("--json", o->json_path, "Write the results as JSON to PATH ('-': stdout only)");
  add_ucx_options(*app, o->ucx);
  return {app, [o] { return run(*o); }};
}

}  // namespace baton::cli
