#include "workloads/compress.h"

#include <cmath>
#include <cstring>

#include "baton/engine/engine.h"
#include "baton/transport/codec.h"
#include "workloads/ucx_rig.h"

namespace baton::workloads {
namespace {

// Writes [0, bytes) of the rig's buffer to the peer at `remote_offset`, as
// requests of `block` bytes, each due `deadline_ns` after submit (0: none).
// The elapsed time, submit to the last completion.
Result<TimeNs> write_all(UcxRig& rig, std::uint64_t bytes, std::uint64_t block, std::uint64_t remote_offset,
                         TimeNs deadline_ns) {
  engine::Batch batch;
  const TimeNs due = deadline_ns == 0 ? 0 : rig.engine->now_ns() + deadline_ns;
  for (std::uint64_t at = 0; at < bytes; at += block) {
    engine::Request r = rig.read(std::min(block, bytes - at), at, remote_offset + at);
    r.op = transport::Op::kWrite;
    r.qos = sched::QosClass::kPrefillBulk;
    r.deadline_ns = due;
    batch.requests.push_back(r);
  }
  return run_batch(*rig.engine, batch);
}

// Reads the peer's [remote_offset, +bytes) into the rig's buffer at
// `local_offset` and compares it with `expected`.
Result<bool> read_back_equal(UcxRig& rig, std::uint64_t remote_offset, std::uint64_t local_offset,
                             std::span<const std::byte> expected, std::uint64_t block) {
  engine::Batch batch;
  for (std::uint64_t at = 0; at < expected.size(); at += block) {
    batch.requests.push_back(rig.read(std::min<std::uint64_t>(block, expected.size() - at), local_offset + at,
                                      remote_offset + at));
  }
  if (auto took = run_batch(*rig.engine, batch); !took) return std::unexpected(took.error());
  return std::memcmp(rig.buffer.data() + local_offset, expected.data(), expected.size()) == 0;
}

double gbps(std::uint64_t bytes, TimeNs ns) { return static_cast<double>(bytes) / static_cast<double>(std::max<TimeNs>(ns, 1)); }

}  // namespace

Status CompressConfig::validate() const {
  if (kinds.empty()) return Status::invalid_argument("compress: no data kinds");
  if (bytes == 0 || block_bytes == 0) return Status::invalid_argument("compress: sizes must be > 0");
  // The codec frames blocks of at least a page; smaller ones measure the
  // per-request overhead, and 1-byte blocks take minutes.
  if (block_bytes < 4096) return Status::invalid_argument("compress: block size {} B is below 4 KiB", block_bytes);
  // Far above a million plain runs the deadline overflows the nanosecond clock.
  if (!(slack > 0) || !(slack <= 1e6)) {
    return Status::invalid_argument("compress: slack {} must be > 0 and at most 1e6", slack);
  }
  if (!(theta_compress >= 0) || !(theta_compress <= 1.5)) {
    return Status::invalid_argument("compress: theta_compress {} must be in [0, 1.5]", theta_compress);
  }
  if (auto c = transport::make_codec(codec); !c) return Status::invalid_argument("compress: {}", c.error().message());
  return Status::ok();
}

Result<std::vector<CompressRow>> run_compress(const CompressConfig& c, const std::string& peer,
                                              const transport::UcxConfig& ucx) {
  if (Status s = c.validate(); !s.is_ok()) return std::unexpected(s);
  // The plain engine writes the first half of the peer's region and reads
  // both halves back into the second half of its buffer.
  auto plain = connect_rig(sched::SchedPolicy::defaults(), peer, ucx, c.peer_bytes());
  if (!plain) return std::unexpected(Status(plain.error().code(), "compress: " + plain.error().message()));
  std::vector<CompressRow> rows;
  for (PayloadKind kind : c.kinds) {
    CompressRow row;
    row.data = kind;
    const std::span<std::byte> source = std::span((*plain)->buffer).first(c.bytes);
    fill_payload(kind, source, c.seed);
    std::shared_ptr<const transport::Codec> codec = std::move(*transport::make_codec(c.codec));
    auto profile = transport::measure(*codec, source.first(std::min<std::uint64_t>(c.bytes, 4ULL << 20)));
    if (!profile) return std::unexpected(profile.error());
    row.ratio = profile->ratio;
    row.compress_gbps = profile->compress_gbps;

    auto plain_ns = write_all(**plain, c.bytes, c.block_bytes, 0, 0);
    if (!plain_ns) return std::unexpected(plain_ns.error());
    row.plain_gbps = gbps(c.bytes, *plain_ns);

    Status refused;
    sched::SchedPolicy policy = sched::SchedPolicy::defaults();
    policy.admission.theta_compress = c.theta_compress;
    auto smart = connect_rig(policy, peer, ucx, c.bytes, [&](engine::Engine& e) {
      refused = e.admission().set_codec(codec, *profile);
    });
    if (!smart) return std::unexpected(Status(smart.error().code(), "compress: " + smart.error().message()));
    if (!refused.is_ok()) return std::unexpected(refused);
    std::memcpy((*smart)->buffer.data(), source.data(), c.bytes);
    const sched::SchedStats before = (*smart)->engine->stats();
    const auto deadline = static_cast<TimeNs>(c.slack * static_cast<double>(*plain_ns));
    auto auto_ns = write_all(**smart, c.bytes, c.block_bytes, c.bytes, deadline);
    if (!auto_ns) return std::unexpected(auto_ns.error());
    row.auto_gbps = gbps(c.bytes, *auto_ns);
    row.auto_wire_bytes = (*smart)->engine->stats().wire_bytes_completed - before.wire_bytes_completed;

    auto plain_ok = read_back_equal(**plain, 0, c.bytes, source, c.block_bytes);
    if (!plain_ok) return std::unexpected(plain_ok.error());
    auto auto_ok = read_back_equal(**plain, c.bytes, c.bytes, source, c.block_bytes);
    if (!auto_ok) return std::unexpected(auto_ok.error());
    row.verified = *plain_ok && *auto_ok;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace baton::workloads
