#include "bench_peer.h"

#include <cstdint>

#include "baton/common/memory_budget.h"
#include "baton/sched/policy.h"
#include "ucx_options.h"

namespace baton::cli {

Result<BenchPeer> BenchPeer::open(const BenchPeerOptions& o, std::uint64_t buffer_bytes) {
  if (o.spawn == !o.target.empty()) {
    return std::unexpected(Status::invalid_argument("give exactly one of --target HOST:PORT and --spawn"));
  }
  sched::SchedPolicy policy = sched::SchedPolicy::defaults();
  if (!o.policy_file.empty()) {
    auto loaded = sched::load_policy(o.policy_file);
    if (!loaded) return std::unexpected(loaded.error());
    policy = std::move(*loaded);
  }
  // What this machine must hold: this side's buffer, the bench's scratch
  // and, with --spawn, the peer's buffer. A workload it cannot hold is
  // refused (bad input) before anything is made, not after filling memory
  // it does not have.
  const auto plus = [](std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; };
  const std::uint64_t here = plus(plus(buffer_bytes, o.scratch_bytes), o.spawn ? buffer_bytes : 0);
  const Status fits = check_shared_allocation(
      o.spawn ? "the peer's buffer and this side's (--spawn)" : "this side's buffers", here);
  if (fits.code() == StatusCode::kResourceExhausted) return std::unexpected(Status::out_of_range("{}", fits.message()));
  BenchPeer b;
  std::string target = o.target;
  if (o.spawn) {
    auto started = ServeChild::start(serve_args(buffer_bytes, o.ucx));
    if (!started) return std::unexpected(started.error());
    b.child_.emplace(std::move(*started));
    target = b.child_->address();
  }
  auto rig = workloads::connect_rig(policy, target, o.ucx, buffer_bytes);
  if (!rig) return std::unexpected(rig.error());
  b.rig_ = std::move(*rig);
  return b;
}

Status BenchPeer::run(const engine::Batch& batch) {
  auto took = workloads::run_batch(engine(), batch, 60'000'000'000);
  return took ? Status::ok() : took.error();
}

Status BenchPeer::close() {
  engine().shutdown();
  if (child_) return child_->stop();
  return Status::ok();
}

}  // namespace baton::cli
