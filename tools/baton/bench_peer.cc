#include "bench_peer.h"

#include <algorithm>

#include "ucx_options.h"

namespace baton::cli {
namespace {

constexpr TimeNs kBatchTimeoutNs = 60'000'000'000;

}  // namespace

Result<BenchPeer> BenchPeer::open(const BenchPeerOptions& o, std::span<std::byte> buffer) {
  if (o.spawn == !o.target.empty()) {
    return std::unexpected(Status::invalid_argument("give exactly one of --target HOST:PORT and --spawn"));
  }
  BenchPeer b;
  std::string target = o.target;
  if (o.spawn) {
    auto started = ServeChild::start(serve_args(buffer.size(), o.ucx));
    if (!started) return std::unexpected(started.error());
    b.child_.emplace(std::move(*started));
    target = b.child_->address();
  }
  engine::EngineConfig config{.ucx = o.ucx};
  config.policy_file = o.policy_file;  // create() loads it and reports its errors
  auto created = engine::Engine::create(config);
  if (!created) return std::unexpected(created.error());
  b.engine_ = std::move(*created);
  auto local = b.engine_->register_memory(buffer.data(), buffer.size());
  if (!local) return std::unexpected(local.error());
  b.local_ = *local;
  auto peer = b.engine_->connect(target);
  if (!peer) return std::unexpected(peer.error());
  b.peer_ = *peer;
  auto regions = b.engine_->remote_regions(b.peer_);
  if (!regions) return std::unexpected(regions.error());
  if (regions->empty()) return std::unexpected(Status::not_found("peer {} registered no memory", b.peer_.address));
  b.remote_ = *std::ranges::max_element(*regions, {}, &transport::RemoteRegion::length);
  if (b.remote_.length < buffer.size()) {
    return std::unexpected(Status::out_of_range("the peer's region has {} bytes; the bench needs {}",
                                                b.remote_.length, buffer.size()));
  }
  return b;
}

engine::Request BenchPeer::request(engine::Op op, std::uint64_t offset, std::uint64_t length) const {
  engine::Request r;
  r.op = op;
  r.local_region = local_.handle;
  r.local_offset = offset;
  r.peer = peer_.address;
  r.remote_region = remote_.key;
  r.remote_offset = offset;
  r.length = length;
  return r;
}

Status BenchPeer::run(const engine::Batch& batch) {
  auto h = engine_->submit(batch);
  if (!h) return h.error();
  if (Status s = engine_->wait(*h, kBatchTimeoutNs); !s.is_ok()) return s;
  auto st = engine_->poll(*h);
  (void)engine_->release(*h);
  return st ? st->status : st.error();
}

Status BenchPeer::close() {
  engine_->shutdown();
  if (child_) return child_->stop();
  return Status::ok();
}

}  // namespace baton::cli
