#include "workloads/ucx_rig.h"

#include <algorithm>

namespace baton::workloads {

engine::Request UcxRig::request(transport::Op op, std::uint64_t length, std::uint64_t local_offset,
                                std::uint64_t remote_offset) const {
  engine::Request r;
  r.op = op;
  r.local_region = local.handle;
  r.local_offset = local_offset;
  r.peer = peer.address;
  r.remote_region = remote.key;
  r.remote_offset = remote_offset;
  r.length = length;
  return r;
}

Result<std::unique_ptr<UcxRig>> connect_rig(const sched::SchedPolicy& policy, const std::string& peer_address,
                                            const transport::UcxConfig& ucx, std::uint64_t buffer_bytes,
                                            const std::function<void(engine::Engine&)>& prepare) {
  auto rig = std::make_unique<UcxRig>();
  engine::EngineConfig config{.ucx = ucx};
  config.policy = policy;
  auto engine = engine::Engine::create(config);
  if (!engine) return std::unexpected(engine.error());
  rig->engine = std::move(*engine);
  engine::Engine& e = *rig->engine;
  if (prepare) prepare(e);
  auto peer = e.connect(peer_address);
  if (!peer) return std::unexpected(peer.error());
  rig->peer = *peer;
  auto regions = e.remote_regions(*peer);
  if (!regions) return std::unexpected(regions.error());
  if (regions->empty()) return std::unexpected(Status::out_of_range("peer {} registered no memory", peer->address));
  rig->remote = *std::ranges::max_element(*regions, {}, &transport::RemoteRegion::length);
  // Checked before this side's buffer is allocated and touched: a workload
  // the peer cannot hold is refused at once, not after filling gigabytes.
  if (rig->remote.length < buffer_bytes) {
    return std::unexpected(Status::out_of_range("the peer's largest region has {} bytes; the workload needs {}",
                                                rig->remote.length, buffer_bytes));
  }
  rig->buffer.resize(buffer_bytes);
  auto local = e.register_memory(rig->buffer.data(), rig->buffer.size());
  if (!local) return std::unexpected(local.error());
  rig->local = *local;
  return rig;
}

Result<TimeNs> run_batch(engine::Engine& e, const engine::Batch& batch, TimeNs timeout_ns) {
  const TimeNs start = e.now_ns();
  auto h = e.submit(batch);
  if (!h) return std::unexpected(h.error());
  if (Status s = e.wait(*h, timeout_ns); !s.is_ok()) return std::unexpected(s);
  const TimeNs took = e.now_ns() - start;
  thread_local engine::BatchStatus st;  // reused, as a connector's poll loop would
  const Status polled = e.poll(*h, st);
  (void)e.release(*h);
  if (!polled.is_ok()) return std::unexpected(polled);
  if (!st.status.is_ok()) return std::unexpected(st.status);
  return took;
}

Result<double> measure_link(UcxRig& rig, std::uint64_t bytes) {
  engine::Batch batch;
  for (int i = 0; i < 16; ++i) batch.requests.push_back(rig.read(bytes));
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    auto took = run_batch(*rig.engine, batch, 60'000'000'000);
    if (!took) return std::unexpected(took.error());
    best = std::max(best, static_cast<double>(16 * bytes) / static_cast<double>(std::max<TimeNs>(*took, 1)));
  }
  return best;
}

}  // namespace baton::workloads
