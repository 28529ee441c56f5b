// The UCX settings of every command that moves real bytes (serve, bench
// throughput / mixed --transport ucx / idle, demo), and the arguments that
// give a spawned `baton serve` the same ones.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "baton/common/status.h"
#include "baton/transport/ucx_transport.h"
#include "serve_child.h"

namespace baton::cli {

// --ucx-tls, --lanes, --nics, --peer-failure-detection /
// --no-peer-failure-detection, --same-host-copy, --direct-copy-max,
// --copy-threads, --stall-timeout, --token-file, --allow-unauthenticated:
// the options added.
std::vector<const CLI::Option*> add_ucx_options(CLI::App& app, transport::UcxConfig& ucx);

// `baton serve` arguments for a buffer of `buffer_bytes` with `ucx`'s settings.
[[nodiscard]] std::vector<std::string> serve_args(std::uint64_t buffer_bytes, const transport::UcxConfig& ucx);

// A random deployment secret in a private (0600) temporary file, for a
// command that spawns its own peer where it must listen beyond loopback:
// both sides read it (ucx.secret_file points at it). It lives in memory
// (a memfd the child inherits) and goes with the object: no file is left
// behind, even by a run that is killed.
class SpawnSecret {
 public:
  [[nodiscard]] static Result<SpawnSecret> create(transport::UcxConfig& ucx);
  SpawnSecret(SpawnSecret&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  SpawnSecret& operator=(SpawnSecret&&) = delete;
  ~SpawnSecret();

 private:
  explicit SpawnSecret(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Where a scheduling bench sends its requests: the simulator, or a real peer
// over UCX (a running `baton serve`, or one it spawns).
struct PeerOptions {
  std::string transport = "sim";
  std::string target;
  bool spawn = false;
  transport::UcxConfig ucx;
  std::vector<const CLI::Option*> ucx_options;  // owned by the command's CLI::App
  // A command's own options that only one side reads (check_peer refuses
  // them on the other): the simulated link's nodes, a real link's load.
  std::vector<const CLI::Option*> sim_only;
  std::vector<const CLI::Option*> ucx_only;
  [[nodiscard]] bool real() const { return transport == "ucx"; }
  // "ucx to HOST:PORT (tls …)", for the JSON's description of the link.
  [[nodiscard]] std::string link() const;
};

// --transport, --target, --spawn and the UCX options.
void add_peer_options(CLI::App& app, PeerOptions& peer);

// Checks the flags together (invalid_argument naming them): --transport is
// sim or ucx; ucx needs one of --target and --spawn and takes no sim_only
// option; sim takes neither, nor a UCX or ucx_only option (each side would
// ignore the other's).
[[nodiscard]] Status check_peer(const PeerOptions& peer);

// check_peer(); then with --spawn starts a `baton serve` with
// `buffer_bytes` and points `target` at it.
[[nodiscard]] Result<std::optional<ServeChild>> resolve_peer(PeerOptions& peer, std::uint64_t buffer_bytes);

}  // namespace baton::cli
