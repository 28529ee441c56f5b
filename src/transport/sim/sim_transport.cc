// Discrete-event model of lanes. A lane serves its FIFO one slice at a time:
// the head is "on the wire" from start to service end (bytes / lane
// bandwidth, stretched by jitter); its completion arrives one latency later,
// while the lane already serves the next slice (latency is pipelined, as on
// a real link). Only the head of each lane has times, so cancelling a slice
// shifts nothing but the lane it was on.
#include "baton/transport/sim_transport.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <set>
#include <unordered_map>

namespace baton::transport {
namespace {

struct SliceRecord {
  SliceSubmit submit;
  TimeNs start_ns = -1;  // -1 while queued behind the lane's head
  TimeNs service_ns = 0;
  bool injected_error = false;
};

struct Lane {
  std::deque<SliceId> fifo;  // front is on the wire (or done with its bytes)
};

struct SimPath {
  PathInfo info;
  std::vector<Lane> lanes;
  double lane_bytes_per_ns = 0;  // 1 GB/s is 1 byte/ns
  TimeNs latency_ns = 0;
  bool down = false;
};

struct FaultEvent {
  TimeNs at_ns;
  PathId path;
  bool down;
};

using TimedSlice = std::pair<TimeNs, SliceId>;

}  // namespace

struct SimTransport::State {
  std::vector<PathInfo> infos;
  std::vector<SimPath> paths;
  SimConfig config;
  std::mt19937_64 rng;
  std::unordered_map<SliceId, SliceRecord> slices;
  std::set<TimedSlice> service_ends;  // lane heads on the wire
  std::set<TimedSlice> arrivals;      // all bytes sent; completion due at .first
  std::vector<FaultEvent> faults;     // sorted by time
  std::size_t next_fault = 0;
  std::vector<Completion> failed;     // failures not yet handed out by poll
  std::uint64_t delivered = 0;
  std::uint64_t wire_delivered = 0;
  std::uint64_t wasted = 0;
  std::vector<SimDelivery> deliveries;  // when config.record_deliveries

  void start_head(SimPath& path, Lane& lane, TimeNs at_ns) {
    if (lane.fifo.empty()) return;
    SliceRecord& s = slices.at(lane.fifo.front());
    const double stretch =
        config.jitter > 0 ? 1.0 + config.jitter * std::uniform_real_distribution<double>(0, 1)(rng) : 1.0;
    s.start_ns = at_ns;
    s.service_ns = std::max<TimeNs>(
        1, static_cast<TimeNs>(std::ceil(static_cast<double>(s.submit.on_wire()) / path.lane_bytes_per_ns * stretch)));
    s.injected_error = config.error_probability > 0 &&
                       std::bernoulli_distribution(config.error_probability)(rng);
    service_ends.insert({s.start_ns + s.service_ns, s.submit.id});
  }

  void fail_path(PathId id, TimeNs at_ns) {
    SimPath& path = paths[id];
    std::vector<SliceId> victims;
    for (Lane& lane : path.lanes) {
      victims.insert(victims.end(), lane.fifo.begin(), lane.fifo.end());
      lane.fifo.clear();
    }
    // Slices whose bytes were all sent may not have landed either: a dead
    // endpoint does not acknowledge.
    for (auto it = arrivals.begin(); it != arrivals.end();) {
      if (slices.at(it->second).submit.path == id) {
        victims.push_back(it->second);
        it = arrivals.erase(it);
      } else {
        ++it;
      }
    }
    for (SliceId v : victims) {
      SliceRecord& s = slices.at(v);
      if (s.start_ns >= 0) service_ends.erase({s.start_ns + s.service_ns, v});
      failed.push_back({v, id, s.submit.lane, s.submit.bytes, at_ns,
                        Status::unavailable("sim: path {} went down", path.info.name())});
      slices.erase(v);
    }
  }

  std::optional<TimeNs> next_event() const {
    std::optional<TimeNs> t;
    auto take = [&](TimeNs v) { t = t ? std::min(*t, v) : v; };
    if (!service_ends.empty()) take(service_ends.begin()->first);
    if (!arrivals.empty()) take(arrivals.begin()->first);
    if (next_fault < faults.size()) take(faults[next_fault].at_ns);
    if (!failed.empty()) take(failed.front().at_ns);
    return t;
  }
};

SimTransport::SimTransport(std::unique_ptr<State> state) : state_(std::move(state)) {}
SimTransport::~SimTransport() = default;

Result<std::unique_ptr<SimTransport>> SimTransport::create(std::vector<PathInfo> paths, SimConfig config) {
  if (!(config.jitter >= 0 && config.jitter <= 1)) {
    return std::unexpected(Status::invalid_argument("SimTransport: jitter {} is outside [0, 1]", config.jitter));
  }
  if (!(config.error_probability >= 0 && config.error_probability <= 1)) {
    return std::unexpected(Status::invalid_argument("SimTransport: error probability {} is outside [0, 1]",
                                                    config.error_probability));
  }
  auto state = std::make_unique<State>();
  for (const PathInfo& p : paths) {
    if (p.lanes < 1 || !(p.bandwidth_gbps > 0) || !(p.latency_us >= 0)) {
      return std::unexpected(Status::invalid_argument(
          "SimTransport: path {} needs lanes >= 1, bandwidth > 0 and latency >= 0 (got {}, {} GB/s, {} us)",
          p.name(), p.lanes, p.bandwidth_gbps, p.latency_us));
    }
    SimPath sp;
    sp.info = p;
    sp.lanes.resize(p.lanes);
    sp.lane_bytes_per_ns = p.bandwidth_gbps / p.lanes;
    sp.latency_ns = static_cast<TimeNs>(std::llround(p.latency_us * 1000.0));
    state->paths.push_back(std::move(sp));
  }
  for (const SimFault& f : config.faults) {
    if (f.path >= paths.size()) {
      return std::unexpected(Status::invalid_argument("SimTransport: fault on path {} but there are {} paths",
                                                      f.path, paths.size()));
    }
    if (f.up_at_ns != 0 && f.up_at_ns <= f.down_at_ns) {
      return std::unexpected(Status::invalid_argument(
          "SimTransport: fault on path {} comes up at {} ns, not after it goes down at {} ns", f.path, f.up_at_ns,
          f.down_at_ns));
    }
    state->faults.push_back({f.down_at_ns, f.path, true});
    if (f.up_at_ns != 0) state->faults.push_back({f.up_at_ns, f.path, false});
  }
  std::ranges::stable_sort(state->faults, {}, &FaultEvent::at_ns);
  state->infos = std::move(paths);
  state->rng.seed(config.seed);
  state->config = std::move(config);
  return std::unique_ptr<SimTransport>(new SimTransport(std::move(state)));
}

Result<std::unique_ptr<SimTransport>> SimTransport::from_topology(
    const topology::TopologyGraph& graph, const std::function<int(topology::PathType)>& lanes_for, SimConfig config) {
  std::vector<PathInfo> paths;
  for (const topology::Link& l : graph.links()) {
    for (auto [from, to] : {std::pair{l.from, l.to}, std::pair{l.to, l.from}}) {
      paths.push_back({from, to, l.path, lanes_for(l.path), l.cost.bandwidth_gbps, l.cost.latency_us});
    }
  }
  return create(std::move(paths), std::move(config));
}

const std::vector<PathInfo>& SimTransport::paths() const { return state_->infos; }

Status SimTransport::submit(const SliceSubmit& slice, TimeNs now_ns) {
  State& st = *state_;
  if (slice.path >= st.paths.size()) {
    return Status::invalid_argument("sim submit: slice {} names path {} but there are {}", slice.id, slice.path,
                                    st.paths.size());
  }
  SimPath& path = st.paths[slice.path];
  if (slice.lane < 0 || slice.lane >= static_cast<int>(path.lanes.size())) {
    return Status::invalid_argument("sim submit: slice {} names lane {} of {} which has {}", slice.id, slice.lane,
                                    path.info.name(), path.lanes.size());
  }
  if (slice.bytes == 0) return Status::invalid_argument("sim submit: slice {} has 0 bytes", slice.id);
  if (st.slices.contains(slice.id)) return Status::already_exists("sim submit: slice {} is already posted", slice.id);
  if (path.down) return Status::unavailable("sim submit: path {} is down", path.info.name());
  st.slices[slice.id] = {slice};
  Lane& lane = path.lanes[slice.lane];
  lane.fifo.push_back(slice.id);
  if (lane.fifo.size() == 1) st.start_head(path, lane, now_ns);
  return Status::ok();
}

CancelResult SimTransport::cancel(SliceId id, TimeNs now_ns) {
  State& st = *state_;
  const auto it = st.slices.find(id);
  if (it == st.slices.end()) return {};
  SliceRecord& s = it->second;
  SimPath& path = st.paths[s.submit.path];
  Lane& lane = path.lanes[s.submit.lane];
  const bool is_head = !lane.fifo.empty() && lane.fifo.front() == id;
  if (!is_head) {
    if (std::erase(lane.fifo, id) == 0) return {};  // bytes all sent: completion on its way
    st.slices.erase(it);
    return {true, 0};
  }
  if (now_ns >= s.start_ns + s.service_ns) return {};  // finished sending, not yet polled
  const TimeNs elapsed = std::max<TimeNs>(0, now_ns - s.start_ns);
  const auto wasted = static_cast<std::uint64_t>(static_cast<double>(s.submit.on_wire()) *
                                                 static_cast<double>(elapsed) / static_cast<double>(s.service_ns));
  st.service_ends.erase({s.start_ns + s.service_ns, id});
  lane.fifo.pop_front();
  st.slices.erase(it);
  st.wasted += wasted;
  st.start_head(path, lane, now_ns);
  return {true, wasted};
}

void SimTransport::poll(TimeNs now_ns, std::vector<Completion>& out) {
  State& st = *state_;
  while (true) {
    const auto next = st.next_event();
    if (!next || *next > now_ns) break;
    const TimeNs t = *next;
    if (!st.failed.empty() && st.failed.front().at_ns == t) {
      out.insert(out.end(), st.failed.begin(), st.failed.end());
      st.failed.clear();
      continue;
    }
    if (st.next_fault < st.faults.size() && st.faults[st.next_fault].at_ns == t) {
      const FaultEvent f = st.faults[st.next_fault++];
      st.paths[f.path].down = f.down;
      if (f.down) st.fail_path(f.path, t);
      continue;
    }
    if (!st.service_ends.empty() && st.service_ends.begin()->first == t) {
      const SliceId id = st.service_ends.begin()->second;
      st.service_ends.erase(st.service_ends.begin());
      SliceRecord& s = st.slices.at(id);
      SimPath& path = st.paths[s.submit.path];
      Lane& lane = path.lanes[s.submit.lane];
      lane.fifo.pop_front();
      st.arrivals.insert({t + path.latency_ns, id});
      st.start_head(path, lane, t);
      continue;
    }
    const SliceId id = st.arrivals.begin()->second;
    st.arrivals.erase(st.arrivals.begin());
    const SliceRecord s = st.slices.at(id);
    st.slices.erase(id);
    Status status;
    if (s.injected_error) {
      status = Status::unavailable("sim: injected error on {}", st.paths[s.submit.path].info.name());
    } else {
      st.delivered += s.submit.bytes;
      st.wire_delivered += s.submit.on_wire();
      if (st.config.record_deliveries) {
        st.deliveries.push_back({s.submit.path, s.submit.memory.remote_addr, s.submit.bytes, t});
      }
    }
    out.push_back({id, s.submit.path, s.submit.lane, s.submit.bytes, t, std::move(status), s.submit.on_wire()});
  }
}

std::optional<TimeNs> SimTransport::next_event_ns() const { return state_->next_event(); }

bool SimTransport::path_healthy(PathId path, TimeNs now_ns) const {
  const State& st = *state_;
  if (path >= st.paths.size()) return false;
  bool down = st.paths[path].down;
  // Scheduled faults not yet polled still count, so routing never picks a
  // path that is already dead at `now_ns`.
  for (std::size_t i = st.next_fault; i < st.faults.size() && st.faults[i].at_ns <= now_ns; ++i) {
    if (st.faults[i].path == path) down = st.faults[i].down;
  }
  return !down;
}

Status SimTransport::set_path_down(PathId path, bool down, TimeNs now_ns) {
  State& st = *state_;
  if (path >= st.paths.size()) {
    return Status::invalid_argument("sim: no path {} (there are {})", path, st.paths.size());
  }
  st.paths[path].down = down;
  if (down) st.fail_path(path, now_ns);
  return Status::ok();
}

std::uint64_t SimTransport::bytes_delivered() const { return state_->delivered; }
std::uint64_t SimTransport::wire_bytes_delivered() const { return state_->wire_delivered; }
std::uint64_t SimTransport::bytes_wasted() const { return state_->wasted; }
const std::vector<SimDelivery>& SimTransport::deliveries() const { return state_->deliveries; }

}  // namespace baton::transport
