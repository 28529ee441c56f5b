// The simulated transport: each path is N bandwidth-limited FIFO lanes with
// a fixed latency and seeded jitter, built from the topology's cost model,
// with a fault model (paths going down and up at given times, random slice
// errors). Deterministic for a given seed. Lives on the engine loop.
#pragma once

#include <functional>
#include <memory>

#include "baton/topology/graph.h"
#include "baton/transport/transport.h"

namespace baton::transport {

struct SimFault {
  PathId path = 0;
  TimeNs down_at_ns = 0;
  TimeNs up_at_ns = 0;  // 0: stays down
};

struct SimConfig {
  std::uint64_t seed = 1;
  // Each slice's time on the wire is stretched by a uniform factor in
  // [1, 1 + jitter]: lanes never run faster than the cost model says.
  double jitter = 0.0;
  double error_probability = 0.0;  // per slice, reported as unavailable
  std::vector<SimFault> faults;
  // Keep a record of every slice delivered (deliveries()), so a test can check
  // that each byte of a transfer landed exactly once. Off by default: a long
  // run would grow it without bound.
  bool record_deliveries = false;
};

// One slice that landed: `bytes` at `remote_addr` on the destination of `path`.
struct SimDelivery {
  PathId path = 0;
  std::uint64_t remote_addr = 0;
  std::uint64_t bytes = 0;
  TimeNs at_ns = 0;
};

class SimTransport final : public Transport {
 public:
  // invalid_argument for a path with no lanes or bandwidth, jitter or error
  // probability outside [0, 1], or a fault on an unknown path.
  [[nodiscard]] static Result<std::unique_ptr<SimTransport>> create(std::vector<PathInfo> paths,
                                                                    SimConfig config = {});
  // Both directions of every link of `graph`, with `lanes_for(path type)` lanes.
  [[nodiscard]] static Result<std::unique_ptr<SimTransport>> from_topology(
      const topology::TopologyGraph& graph, const std::function<int(topology::PathType)>& lanes_for,
      SimConfig config = {});

  ~SimTransport() override;

  [[nodiscard]] const std::vector<PathInfo>& paths() const override;
  [[nodiscard]] Status submit(const SliceSubmit& slice, TimeNs now_ns) override;
  CancelResult cancel(SliceId id, TimeNs now_ns) override;
  void poll(TimeNs now_ns, std::vector<Completion>& out) override;
  [[nodiscard]] std::optional<TimeNs> next_event_ns() const override;
  [[nodiscard]] bool path_healthy(PathId path, TimeNs now_ns) const override;
  // A compressed slice is modelled as its wire bytes plus codec time.
  [[nodiscard]] bool carries_compressed_slices() const override { return true; }
  [[nodiscard]] Status set_codec(std::shared_ptr<const Codec> codec) override {
    return codec != nullptr ? Status::ok() : Status::invalid_argument("set_codec: no codec (null)");
  }

  // Marks a path down (in-flight and queued slices fail at `now_ns`) or up;
  // for tests and the fault benchmark, in addition to scheduled faults.
  Status set_path_down(PathId path, bool down, TimeNs now_ns);

  // Totals, for tests that check that bytes are neither lost nor invented.
  // Payload bytes of slices that completed ok, and the bytes that carried
  // them over the wire (fewer when slices were compressed).
  [[nodiscard]] std::uint64_t bytes_delivered() const;
  [[nodiscard]] std::uint64_t wire_bytes_delivered() const;
  [[nodiscard]] std::uint64_t bytes_wasted() const;
  // In completion order; empty unless SimConfig::record_deliveries.
  [[nodiscard]] const std::vector<SimDelivery>& deliveries() const;

 private:
  struct State;
  explicit SimTransport(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace baton::transport
