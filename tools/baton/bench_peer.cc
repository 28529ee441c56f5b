#include "bench_peer.h"

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
