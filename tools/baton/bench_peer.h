// What the real-transfer benches (throughput, latency) stand on: an engine
// with the bench's buffer registered, connected to a `baton serve` (given,
// or spawned on loopback), and the peer's largest region.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "baton/common/status.h"
#include "baton/engine/engine.h"
#include "serve_child.h"

namespace baton::cli {

struct BenchPeerOptions {
  std::string target;  // a running `baton serve`, or
  bool spawn = false;  // one started here with a buffer of the bench's span
  transport::UcxConfig ucx;
  std::string policy_file;
};

class BenchPeer {
 public:
  // `buffer` is registered; the peer's largest region must hold its size.
  // invalid_argument unless exactly one of target and spawn is given.
  [[nodiscard]] static Result<BenchPeer> open(const BenchPeerOptions& o, std::span<std::byte> buffer);

  [[nodiscard]] engine::Engine& engine() { return *engine_; }
  [[nodiscard]] const engine::Region& local() const { return local_; }
  [[nodiscard]] const engine::Peer& peer() const { return peer_; }
  [[nodiscard]] const transport::RemoteRegion& remote() const { return remote_; }

  // One request of `length` bytes at the same offset on both sides.
  [[nodiscard]] engine::Request request(engine::Op op, std::uint64_t offset, std::uint64_t length) const;
  // Submits `batch`, waits for it, releases it: its final status.
  [[nodiscard]] Status run(const engine::Batch& batch);
  // Shuts the engine down and stops a spawned serve (its exit checked).
  [[nodiscard]] Status close();

 private:
  BenchPeer() = default;
  std::optional<ServeChild> child_;
  std::unique_ptr<engine::Engine> engine_;
  engine::Region local_;
  engine::Peer peer_;
  transport::RemoteRegion remote_;
};

}  // namespace baton::cli
