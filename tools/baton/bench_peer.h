// What the real-transfer benches (throughput, latency) stand on: a
// `baton serve` (given, or spawned on loopback) and a workload rig connected
// to it (workloads/ucx_rig.h: an engine, its buffer registered, the peer's
// largest region).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "baton/common/status.h"
#include "baton/engine/engine.h"
#include "serve_child.h"
#include "workloads/ucx_rig.h"

namespace baton::cli {

struct BenchPeerOptions {
  std::string target;  // a running `baton serve`, or
  bool spawn = false;  // one started here with a buffer of the bench's size
  transport::UcxConfig ucx;
  std::string policy_file;
  // What the bench allocates on this machine besides the buffer (throughput's
  // memcpy reference: a second buffer as large), counted when checking that
  // the workload fits.
  std::uint64_t scratch_bytes = 0;
};

class BenchPeer {
 public:
  // A buffer of `buffer_bytes`, registered; the peer's largest region must
  // hold as many. invalid_argument unless exactly one of target and spawn is
  // given, or for a bad policy file.
  [[nodiscard]] static Result<BenchPeer> open(const BenchPeerOptions& o, std::uint64_t buffer_bytes);

  [[nodiscard]] std::span<std::byte> buffer() { return rig_->buffer; }
  [[nodiscard]] engine::Engine& engine() { return *rig_->engine; }
  [[nodiscard]] const engine::Peer& peer() const { return rig_->peer; }
  // One request of `length` bytes at the same offset on both sides.
  [[nodiscard]] engine::Request request(engine::Op op, std::uint64_t offset, std::uint64_t length) const {
    return rig_->request(op, length, offset, offset);
  }
  // Submits `batch`, waits for it, releases it: its final status.
  [[nodiscard]] Status run(const engine::Batch& batch);
  // Shuts the engine down and stops a spawned serve (its exit checked).
  [[nodiscard]] Status close();

 private:
  BenchPeer() = default;
  std::optional<ServeChild> child_;          // declared first: it outlives the engine
  std::unique_ptr<workloads::UcxRig> rig_;
};

}  // namespace baton::cli
