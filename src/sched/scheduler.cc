// The scheduler. Per path, queued requests wait in indexed heaps whose keys
// never change while a request waits (docs/scheduler.md has the proof).
// Under deadline_aware, urgency at t is
//   w_d·max(0, H − laxity(t)) + w_p·prio + w_a·min(t − enqueued, S)      (times in µs)
// with laxity(t) = deadline − remaining − t, H the deadline horizon and S
// the starvation bound:
//   pressing (laxity < H):  (w_d + w_a)·t + K,  K = w_p·prio − w_d·(deadline − remaining − H) − w_a·enqueued
//   calm (no deadline, or laxity ≥ H): w_a·t + K,  K = w_p·prio − w_a·enqueued
// and, once t − enqueued ≥ S (`aged`), the same without the w_a·t and with
// w_a·S for −w_a·enqueued. Within each of the four sets every urgency grows
// at the same rate, so each heap's order holds for all time and the most
// urgent request is one of four heap tops. A calm request with a deadline
// also waits in `dormant`, ordered by the time its laxity reaches H; top()
// moves those due to `pressing` (once per key), and a young heap's top that
// has aged to its aged heap (once per request).
// by_age orders by enqueue time: the starvation bound, and FIFO. The
// baselines (strict_priority, edf) keep one static key in `calm`.
// O(log n) per dispatch, no re-scoring.
#include "baton/sched/scheduler.h"

#include "baton/common/ordered_sums.h"

#include "sched/indexed_heap.h"

#include <algorithm>
#include <deque>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

namespace baton::sched {
namespace {

using transport::PathId;
using transport::SliceId;

constexpr PathId kNoPath = std::numeric_limits<PathId>::max();
// A request whose slices keep failing on healthy paths ends instead of looping.
constexpr int kMaxSliceFailures = 16;

struct Range {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// The paths between a pair of endpoints, best first, and how many open
// requests route on them (an emptied peer chain goes only once none does).
struct Chain {
  std::vector<PathId> paths;
  std::size_t requests = 0;
};

struct Request {
  RequestId id = 0;
  TransferRequest spec;
  std::uint64_t seq = 0;
  Chain* chain = nullptr;  // shared by every request of the pair
  RequestStatus status;
  std::uint64_t next_offset = 0;  // bytes before it have been sliced
  std::vector<Range> retry;       // sliced, failed or preempted: send again
  // Completed ok, for progress(): [0, delivered_prefix) plus the ranges that
  // landed beyond it (merged, ascending). Slices mostly land in order, so the
  // prefix grows and the vector stays empty: no allocation per request.
  std::uint64_t delivered_prefix = 0;
  std::vector<Range> delivered_beyond;
  std::uint64_t unsent = 0;       // bytes not currently posted nor delivered
  int inflight = 0;               // slices posted and not yet completed
  int failures = 0;
  double wire_ratio = 1.0;        // wire bytes per payload byte (compression)
  PathId home = kNoPath;  // the path whose queue holds it (when queued)
  bool queued = false;
  mutable bool due_stale = false;  // its entry in the home path's `due` waits for the next query
  bool pressing = false;  // in the pressing heap (else calm)
  bool aged = false;      // waited the starvation bound: in the aged heap of its set
  bool dormant = false;   // calm with a deadline: also in the dormant heap
  double key = 0;
  std::uint32_t urgency_pos = 0;  // where the heaps keep it
  std::uint32_t age_pos = 0;
  std::uint32_t dormant_pos = 0;

  // Where a stopped request goes once its last posted slice is settled.
  RequestState ending_as = RequestState::kCancelled;
  Status ending_status;

  [[nodiscard]] bool ended() const {
    return status.state != RequestState::kQueued && status.state != RequestState::kRunning &&
           status.state != RequestState::kCancelling;
  }
  [[nodiscard]] bool live() const {
    return status.state == RequestState::kQueued || status.state == RequestState::kRunning;
  }
};

struct UrgencyEntry {
  double key;
  std::uint64_t seq;
  Request* request;
};
struct AgeEntry {
  TimeNs enqueued_ns;
  std::uint64_t seq;
  Request* request;
};
// Most urgent first; equal keys in arrival order.
struct MoreUrgent {
  bool operator()(const UrgencyEntry& a, const UrgencyEntry& b) const {
    return a.key != b.key ? a.key > b.key : a.seq < b.seq;
  }
};
struct Older {
  bool operator()(const AgeEntry& a, const AgeEntry& b) const {
    return a.enqueued_ns != b.enqueued_ns ? a.enqueued_ns < b.enqueued_ns : a.seq < b.seq;
  }
};
struct UrgencyPosition {
  std::uint32_t& operator()(const UrgencyEntry& e) const { return e.request->urgency_pos; }
};
struct AgePosition {
  std::uint32_t& operator()(const AgeEntry& e) const { return e.request->age_pos; }
};
struct DormantPosition {
  std::uint32_t& operator()(const AgeEntry& e) const { return e.request->dormant_pos; }
};
using UrgencyHeap = IndexedHeap<UrgencyEntry, MoreUrgent, UrgencyPosition>;
using AgeHeap = IndexedHeap<AgeEntry, Older, AgePosition>;
// Keyed by the instant a calm request's laxity reaches the horizon.
using DormantHeap = IndexedHeap<AgeEntry, Older, DormantPosition>;

struct PostedSlice {
  SliceId id = 0;  // 0: a free slot
  Request* request = nullptr;
  Range range;
  std::uint64_t wire_bytes = 0;
  PathId path = 0;
  int lane = 0;
};

// Posted slices in reusable slots; a slice id carries its slot in the low
// bits and a generation above them, so a stale id never finds a new slice.
class SliceTable {
 public:
  SliceId add(PostedSlice s) {
    std::uint32_t slot;
    if (free_.empty()) {
      slot = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    } else {
      slot = free_.back();
      free_.pop_back();
    }
    s.id = (++generation_ << kSlotBits) | slot;
    slots_[slot] = s;
    return s.id;
  }
  [[nodiscard]] PostedSlice* find(SliceId id) { return const_cast<PostedSlice*>(find_const(id)); }
  [[nodiscard]] const PostedSlice* find_const(SliceId id) const {
    const std::uint64_t slot = id & ((1ULL << kSlotBits) - 1);
    return slot < slots_.size() && slots_[slot].id == id && id != 0 ? &slots_[slot] : nullptr;
  }
  void remove(SliceId id) {
    const auto slot = static_cast<std::uint32_t>(id & ((1ULL << kSlotBits) - 1));
    slots_[slot].id = 0;
    free_.push_back(slot);
  }
  [[nodiscard]] std::vector<SliceId> of(const Request* r) const {
    std::vector<SliceId> out;
    for (const PostedSlice& s : slots_) {
      if (s.id != 0 && s.request == r) out.push_back(s.id);
    }
    return out;
  }

 private:
  static constexpr int kSlotBits = 24;  // in-flight slices are bounded by credits
  std::vector<PostedSlice> slots_;
  std::vector<std::uint32_t> free_;
  std::uint64_t generation_ = 0;
};

struct PathQueue {
  UrgencyHeap pressing;
  UrgencyHeap calm;
  UrgencyHeap pressing_aged;  // aging stopped at the starvation bound
  UrgencyHeap calm_aged;
  DormantHeap dormant;
  AgeHeap by_age;
};

struct PathRuntime {
  transport::PathInfo info;
  PathCredits credits;
  std::uint64_t slice_bytes = 0;
  double bytes_per_ns = 0;
  TimeNs latency_ns = 0;
  PathLoad load;
  std::vector<int> lane_load;
  PathQueue queue;
  std::vector<SliceId> posted;  // in post order: preemption looks at the newest first
  // Unsent bytes of the queued requests with a deadline, by (deadline, seq):
  // admission's "bytes due before this one" in O(log n). Brought up to date
  // when asked (unsent_due_before), not at every post: a tree update per
  // slice doubled the dispatch cost at 100k queued, and most posts are
  // never asked about.
  mutable OrderedSums<std::pair<TimeNs, std::uint64_t>> due;
  mutable std::vector<RequestId> due_stale;  // requests whose entry may be out of date
  bool promoted_last = false;    // the last slice posted here was a starvation promotion
};

double us(TimeNs ns) { return static_cast<double>(ns) / 1000.0; }

// Adds `r` to sorted, disjoint, merged `ranges`.
void add_range(std::vector<Range>& ranges, Range r) {
  auto it = std::ranges::upper_bound(ranges, r.offset, {}, &Range::offset);
  if (it != ranges.begin() && std::prev(it)->offset + std::prev(it)->length >= r.offset) {
    --it;
    const std::uint64_t end = std::max(it->offset + it->length, r.offset + r.length);
    it->length = end - it->offset;
  } else {
    it = ranges.insert(it, r);
  }
  auto next = std::next(it);
  while (next != ranges.end() && next->offset <= it->offset + it->length) {
    it->length = std::max(it->offset + it->length, next->offset + next->length) - it->offset;
    next = ranges.erase(next);
  }
}

// Records a delivered range as a prefix plus the ranges beyond it.
void record_delivered(std::uint64_t& prefix, std::vector<Range>& beyond, Range r) {
  if (r.offset > prefix) {
    add_range(beyond, r);
    return;
  }
  prefix = std::max(prefix, r.offset + r.length);
  while (!beyond.empty() && beyond.front().offset <= prefix) {
    prefix = std::max(prefix, beyond.front().offset + beyond.front().length);
    beyond.erase(beyond.begin());
  }
}

}  // namespace

std::string_view to_string(RequestState state) {
  switch (state) {
    case RequestState::kQueued: return "queued";
    case RequestState::kRunning: return "running";
    case RequestState::kCompleted: return "completed";
    case RequestState::kFailed: return "failed";
    case RequestState::kCancelled: return "cancelled";
    case RequestState::kInfeasible: return "deadline_infeasible";
    case RequestState::kTimedOut: return "timeout";
    case RequestState::kCancelling: return "cancelling";
  }
  return "?";
}

struct Scheduler::State {
  State(const topology::TopologyGraph& g, const SchedPolicy& p, transport::Transport& t)
      : graph(g), policy(p), transport(t) {}

  const topology::TopologyGraph& graph;
  SchedPolicy policy;
  transport::Transport& transport;
  std::vector<PathRuntime> paths;
  std::map<std::tuple<std::string, std::string, topology::PathType>, PathId> path_index;
  std::unordered_map<std::string, Chain> chains;  // "from|to" → chain
  std::set<std::string> peer_chains;  // keys of chains made of transport paths alone
  // Peer chains emptied by reincarnate, oldest first: kept (a request to
  // the peer still fails unavailable, not not_found) until kMaxEmptied
  // newer ones were, and no open request routes on them.
  std::deque<std::string> emptied;
  static constexpr std::size_t kMaxEmptied = 1024;
  std::uint64_t paths_version = 0;     // the transport's, when paths were last read
  std::unordered_map<RequestId, Request> requests;
  SliceTable posted;
  std::set<PathId> busy_queues;  // paths whose queue is not empty
  // Whether anyone asked unsent_due_before: until then no `due` sums are kept
  // (a scheduler without admission pays nothing for them).
  mutable bool due_used = false;
  std::vector<PathId> busy_scratch;
  std::uint64_t next_seq = 0;
  std::size_t open = 0;
  bool top_is_overdue = false;  // set by top(): the head was promoted by the starvation bound
  SchedStats stats;
  std::function<void(RequestId)> finish_hook;

  // The transport paths from `from` to `to`, best first; computed once per
  // pair. Topology endpoints route on the topology's chain. Endpoints the
  // topology does not know (peers named host:port) route on the transport's
  // own paths between them, fastest first; those chains grow as the
  // transport connects more paths (sync_paths).
  Result<Chain*> chain_for(const std::string& from, const std::string& to, TimeNs now_ns) {
    sync_paths(now_ns);
    std::string key = from;
    key += '|';
    key += to;
    auto it = chains.find(key);
    if (it == chains.end()) {
      auto ranked = graph.rank(from, to);
      std::vector<PathId> chain;
      if (ranked) {
        for (const topology::Link& l : ranked->chain) {
          if (auto p = path_index.find({l.from, l.to, l.path}); p != path_index.end()) chain.push_back(p->second);
        }
      } else if (ranked.error().code() == StatusCode::kNotFound) {
        for (PathId id = 0; id < paths.size(); ++id) {
          if (paths[id].info.from == from && paths[id].info.to == to) chain.push_back(id);
        }
        if (chain.empty()) {
          return std::unexpected(Status::not_found(
              "submit: {} -> {}: not both topology nodes ({}), and the transport has no path between them", from,
              to, ranked.error().message()));
        }
        sort_by_bandwidth(chain);
        peer_chains.insert(key);
      } else {
        return std::unexpected(Status(ranked.error().code(), "submit: " + ranked.error().message()));
      }
      it = chains.emplace(std::move(key), Chain{std::move(chain), 0}).first;
    }
    if (it->second.paths.empty()) {
      return std::unexpected(Status::unavailable("submit: the transport has no path from {} to {}", from, to));
    }
    return &it->second;
  }

  void sort_by_bandwidth(std::vector<PathId>& chain) const {
    std::ranges::stable_sort(chain, [this](PathId a, PathId b) { return paths[a].bytes_per_ns > paths[b].bytes_per_ns; });
  }

  void add_path(PathId id, const transport::PathInfo& info) {
    PathRuntime p;
    configure(p, info);
    p.lane_load.assign(info.lanes, 0);
    paths.push_back(std::move(p));
    path_index[{info.from, info.to, info.type}] = id;
  }

  // A path's slicing, credits and cost from its PathInfo and the policy.
  void configure(PathRuntime& p, const transport::PathInfo& info) const {
    p.info = info;
    p.credits = policy.credits_for(info.type);
    p.credits.lanes = std::min(p.credits.lanes, info.lanes);  // cannot use lanes the path lacks
    p.slice_bytes = policy.slice_for(info.type);
    p.bytes_per_ns = info.bandwidth_gbps;
    p.latency_ns = static_cast<TimeNs>(info.latency_us * 1000.0);
    // A lane learns that a slice landed one latency after it left, so it needs
    // 1 + latency·bandwidth/slice slices queued to never sit idle. Deeper than
    // that only adds queueing in front of an urgent slice; shallower starves
    // the link (64 KiB slices on NVSwitch ran at 38% of the link).
    const double lane_bytes_per_ns = p.bytes_per_ns / info.lanes;
    // Capped as the policy's own figure is: a cost override of 1e5 GB/s at
    // a second's latency asked for a billion (lanes x slices wrapped int).
    const double bdp_slices = static_cast<double>(p.latency_ns) * lane_bytes_per_ns / static_cast<double>(p.slice_bytes);
    const double wanted = std::min(1 + std::ceil(bdp_slices), static_cast<double>(PathCredits::kMaxSlicesPerLane));
    p.credits.slices_per_lane = std::max(p.credits.slices_per_lane, static_cast<int>(wanted));
  }

  // A path whose PathInfo changed after it was taken on: a UCX path is TCP
  // until its handshake says shm or RDMA, and was sliced and credited as
  // TCP for good (a policy's shm slice size never applied). What is in
  // flight keeps its lanes; queued requests keep their keys until rekeyed.
  void retype(PathId id, const transport::PathInfo& info) {
    PathRuntime& p = paths[id];
    if (const auto it = path_index.find({p.info.from, p.info.to, p.info.type}); it != path_index.end() && it->second == id) {
      path_index.erase(it);
    }
    configure(p, info);
    if (p.lane_load.size() < static_cast<std::size_t>(info.lanes)) p.lane_load.resize(info.lanes, 0);
    path_index[{info.from, info.to, info.type}] = id;
    for (auto& [key, chain] : chains) {
      if (std::ranges::find(chain.paths, id) != chain.paths.end()) sort_by_bandwidth(chain.paths);
    }
  }

  // A transport may offer more paths as it runs (a UCX peer connects), or
  // give a failed path's id to a new one: take them on, and extend the peer
  // chains they belong to. Chains change in place, since queued requests
  // point at them.
  void sync_paths(TimeNs now_ns) {
    const auto& infos = transport.paths();
    std::vector<PathId> joining;  // paths to put on the peer chains
    if (const std::uint64_t version = transport.paths_version(); version != paths_version) {
      paths_version = version;
      for (PathId id = 0; id < paths.size(); ++id) {
        if (paths[id].info == infos[id]) continue;
        if (paths[id].info.incarnation != infos[id].incarnation) {
          reincarnate(id, infos[id], now_ns);
          joining.push_back(id);
        } else {
          retype(id, infos[id]);
        }
      }
    }
    for (auto id = static_cast<PathId>(paths.size()); id < infos.size(); ++id) {
      add_path(id, infos[id]);
      joining.push_back(id);
    }
    if (joining.empty()) return;
    for (const std::string& key : peer_chains) {
      std::vector<PathId>& chain = chains.at(key).paths;
      const auto bar = key.find('|');
      const std::string_view from = std::string_view(key).substr(0, bar);
      const std::string_view to = std::string_view(key).substr(bar + 1);
      for (PathId id : joining) {
        if (paths[id].info.from == from && paths[id].info.to == to) chain.push_back(id);
      }
      sort_by_bandwidth(chain);
    }
  }

  // The transport gave a failed path's id to a new path (another peer, or
  // the same one back): nothing of the old path is at the transport. It
  // leaves the chains it was on first, so that what was queued on it (a
  // request the old peer's failure has not reached yet) moves to the rest
  // of its chain or fails, and never goes to the new peer.
  void reincarnate(PathId id, const transport::PathInfo& info, TimeNs now_ns) {
    for (auto& [key, chain] : chains) {
      if (std::erase(chain.paths, id) != 0 && chain.paths.empty() && peer_chains.contains(key)) emptied.push_back(key);
    }
    rehome_queue(id, now_ns);  // the requests moved still point at their chains
    retype(id, info);
    forget_emptied();
  }

  // Without this every address ever connected kept its chain. An emptied
  // chain an open request still points at, or one that got paths again,
  // is passed over.
  void forget_emptied() {
    for (std::size_t look = emptied.size(); look > 0 && emptied.size() > kMaxEmptied; --look) {
      std::string key = std::move(emptied.front());
      emptied.pop_front();
      const auto it = chains.find(key);
      if (it == chains.end() || !it->second.paths.empty()) continue;
      if (it->second.requests != 0) {
        emptied.push_back(std::move(key));
        continue;
      }
      peer_chains.erase(key);
      chains.erase(it);
    }
  }

  // Baselines order by one static key; only deadline_aware weighs urgency.
  [[nodiscard]] bool weighs_urgency() const { return policy.kind == PolicyKind::kDeadlineAware; }

  [[nodiscard]] double remaining_ns(const Request& r) const {
    return static_cast<double>(r.unsent) / paths[r.home].bytes_per_ns;
  }

  // When r's laxity reaches the horizon (deadline − remaining − H), rounded
  // up so that a request due at `now` is placed pressing by place().
  [[nodiscard]] TimeNs activation_ns(const Request& r) const {
    const double at = static_cast<double>(r.spec.deadline_ns) - remaining_ns(r) -
                      static_cast<double>(policy.deadline_horizon_ns);
    constexpr double kLimit = 9e18;  // inside TimeNs either way
    return static_cast<TimeNs>(std::ceil(std::clamp(at, -kLimit, kLimit)));
  }

  // The time-invariant part of the urgency (see the file comment).
  [[nodiscard]] double key_of(const Request& r) const {
    switch (policy.kind) {
      case PolicyKind::kBaselineFifo: return 0;  // served from by_age
      case PolicyKind::kStrictPriority: return -static_cast<double>(r.spec.qos);  // equal: arrival order
      case PolicyKind::kEdf:
        return r.spec.deadline_ns != 0 ? -static_cast<double>(r.spec.deadline_ns)
                                       : std::numeric_limits<double>::lowest();
      case PolicyKind::kDeadlineAware: break;
    }
    const double class_term = policy.w_priority * policy.class_priority[static_cast<int>(r.spec.qos)];
    // Young: w_a·(t − enqueued), the t in the heap's rate. Aged: w_a·S.
    const double aging =
        r.aged ? -policy.w_aging * us(policy.starvation_bound_ns) : policy.w_aging * us(r.status.submitted_ns);
    if (!r.pressing) return class_term - aging;
    const double pressed_from_us =
        us(r.spec.deadline_ns) - remaining_ns(r) / 1000.0 - us(policy.deadline_horizon_ns);
    return class_term - policy.w_deadline * pressed_from_us - aging;
  }

  UrgencyHeap& urgency_heap(Request& r) {
    PathQueue& q = paths[r.home].queue;
    if (r.aged) return r.pressing ? q.pressing_aged : q.calm_aged;
    return r.pressing ? q.pressing : q.calm;
  }

  // Whether r's aging reached the starvation bound by `now`.
  [[nodiscard]] bool aged_by(const Request& r, TimeNs now_ns) const {
    return weighs_urgency() && time_until(r.status.submitted_ns, now_ns) >= policy.starvation_bound_ns;
  }

  // Puts a queued request in the urgency heap its laxity at `now` calls for.
  void place(Request& r, TimeNs now_ns) {
    r.pressing = false;
    r.dormant = false;
    r.aged = aged_by(r, now_ns);
    if (weighs_urgency() && r.spec.deadline_ns != 0) {
      const TimeNs at = activation_ns(r);
      if (at <= now_ns) {
        r.pressing = true;
      } else {
        r.dormant = true;
        paths[r.home].queue.dormant.push({at, r.seq, &r});
      }
    }
    r.key = key_of(r);
    urgency_heap(r).push({r.key, r.seq, &r});
  }

  void unplace(Request& r) {
    urgency_heap(r).erase(r.urgency_pos);
    if (r.dormant) paths[r.home].queue.dormant.erase(r.dormant_pos);
    r.dormant = false;
  }

  void enqueue(Request& r, PathId home, TimeNs now_ns) {
    r.home = home;
    r.queued = true;
    place(r, now_ns);
    paths[home].queue.by_age.push({r.status.submitted_ns, r.seq, &r});
    paths[home].load.queued_bytes += r.unsent;
    sync_due(r);
    busy_queues.insert(home);
  }

  // Marks the request's `due` entry out of date (call after every change of
  // `unsent` while it is queued with a deadline).
  void sync_due(const Request& r) {
    if (!due_used || !r.queued || r.spec.deadline_ns == 0 || r.due_stale) return;
    r.due_stale = true;
    PathRuntime& p = paths[r.home];
    p.due_stale.push_back(r.id);
    // Nobody asking (no deadline ever checked): the list must not grow
    // without bound, so it is folded in once it outgrows the tree.
    if (p.due_stale.size() > 1024 && p.due_stale.size() > 2 * p.due.size()) refresh_due(r.home);
  }

  // Brings a path's `due` sums up to date: O(log n) per request that changed.
  void refresh_due(PathId path) const {
    if (!due_used) {  // the first question: build every path's sums once
      due_used = true;
      for (const auto& [id, r] : requests) {
        if (r.queued && r.spec.deadline_ns != 0) paths[r.home].due.set({r.spec.deadline_ns, r.seq}, r.unsent);
      }
      return;
    }
    const PathRuntime& p = paths[path];
    for (RequestId id : p.due_stale) {
      const auto it = requests.find(id);
      if (it == requests.end()) continue;
      const Request& r = it->second;
      if (!r.due_stale || !r.queued || r.home != path) continue;  // left this queue since
      r.due_stale = false;
      p.due.set({r.spec.deadline_ns, r.seq}, r.unsent);
    }
    p.due_stale.clear();
  }

  void dequeue(Request& r) {
    if (!r.queued) return;
    unplace(r);
    AgeHeap& by_age = paths[r.home].queue.by_age;
    by_age.erase(r.age_pos);
    paths[r.home].load.queued_bytes -= r.unsent;
    if (due_used && r.spec.deadline_ns != 0) paths[r.home].due.erase({r.spec.deadline_ns, r.seq});
    r.due_stale = false;
    if (by_age.empty()) busy_queues.erase(r.home);
    r.queued = false;
  }

  // The remaining time changed: move the request to its new place (only a
  // deadline request's key depends on it).
  void rekey(Request& r, TimeNs now_ns) {
    if (!r.queued || !weighs_urgency() || r.spec.deadline_ns == 0) return;
    if (r.pressing && activation_ns(r) <= now_ns) {
      // Still pressing (the common case after a post): one re-key in place.
      r.key = key_of(r);
      urgency_heap(r).replace(r.urgency_pos, {r.key, r.seq, &r});
      return;
    }
    unplace(r);
    place(r, now_ns);
  }

  // Calm requests whose laxity reached the horizon by `now` start pressing.
  void wake_pressed(PathQueue& q, TimeNs now_ns) {
    while (!q.dormant.empty() && q.dormant.top().enqueued_ns <= now_ns) {
      Request& r = *q.dormant.top().request;
      unplace(r);
      place(r, now_ns);
    }
  }

  // Moves the tops of a young heap that aged by `now` to the aged heap. A
  // young heap's top that has not aged is its most urgent request: one
  // buried below it that aged scores less capped than uncapped, and
  // uncapped no more than the top.
  void age_tops(UrgencyHeap& young, UrgencyHeap& aged, TimeNs now_ns) {
    while (!young.empty() && aged_by(*young.top().request, now_ns)) {
      Request& r = *young.top().request;
      young.erase(r.urgency_pos);
      r.aged = true;
      r.key = key_of(r);
      aged.push({r.key, r.seq, &r});
    }
  }

  // The most urgent request of a path's queue at `now`.
  Request* top(PathId path, TimeNs now_ns) {
    PathQueue& q = paths[path].queue;
    top_is_overdue = false;
    if (q.by_age.empty()) return nullptr;
    Request* oldest = q.by_age.top().request;
    if (policy.kind == PolicyKind::kBaselineFifo) return oldest;
    if (!weighs_urgency()) return q.calm.top().request;
    // Overdue work takes every other slice, never the whole link: a backlog
    // of bulk that all went overdue would otherwise hold critical work back
    // until it drained.
    if (!paths[path].promoted_last && time_until(oldest->status.submitted_ns, now_ns) >= policy.starvation_bound_ns) {
      top_is_overdue = true;
      return oldest;
    }
    wake_pressed(q, now_ns);
    age_tops(q.pressing, q.pressing_aged, now_ns);
    age_tops(q.calm, q.calm_aged, now_ns);
    const double now_us = us(now_ns);
    Request* best = nullptr;
    double best_urgency = 0;
    auto consider = [&](const UrgencyHeap& heap, double rate) {
      if (heap.empty()) return;
      const double u = rate * now_us + heap.top().key;
      if (best == nullptr || u > best_urgency) {
        best = heap.top().request;
        best_urgency = u;
      }
    };
    consider(q.pressing, policy.w_deadline + policy.w_aging);
    consider(q.pressing_aged, policy.w_deadline);
    consider(q.calm, policy.w_aging);
    consider(q.calm_aged, 0);
    return best;
  }

  [[nodiscard]] PathId first_healthy(const Request& r, TimeNs now_ns) const {
    for (PathId p : r.chain->paths) {
      if (transport.path_healthy(p, now_ns)) return p;
    }
    return kNoPath;
  }

  [[nodiscard]] std::uint64_t next_length(const Request& r, PathId path) const {
    const std::uint64_t cap = paths[path].slice_bytes;
    if (!r.retry.empty()) return std::min(cap, r.retry.back().length);
    return std::min(cap, r.spec.bytes - r.next_offset);
  }

  [[nodiscard]] bool has_credit(PathId path, std::uint64_t bytes) const {
    const PathRuntime& p = paths[path];
    if (p.load.inflight_slices >= p.credits.lanes * p.credits.slices_per_lane) return false;
    return p.load.inflight_slices == 0 || p.load.inflight_bytes + bytes <= p.credits.inflight_bytes;
  }

  void finish(Request& r, RequestState state, Status status, TimeNs now_ns) {
    dequeue(r);
    r.status.state = state;
    r.status.status = std::move(status);
    r.status.completed_ns = now_ns;
    --open;
    --r.chain->requests;
    if (finish_hook) finish_hook(r.id);
  }

  // Cancels every posted slice of `r`; those stopped return their credits.
  void cancel_posted(Request& r, TimeNs now_ns) {
    if (r.inflight == 0) return;
    for (SliceId id : posted.of(&r)) {
      const auto result = transport.cancel(id, now_ns);
      if (result.stopped) {
        stats.bytes_wasted += result.bytes_wasted;
        release(id);
      }
    }
  }

  // Ends `r` as `state` once nothing it posted can still land: at once
  // when the transport stopped every posted slice, else it is kCancelling
  // until on_completion settles the last one.
  void stop(Request& r, RequestState state, Status status, TimeNs now_ns) {
    cancel_posted(r, now_ns);
    dequeue(r);
    if (r.inflight == 0) {
      finish(r, state, std::move(status), now_ns);
      return;
    }
    r.status.state = RequestState::kCancelling;
    r.ending_as = state;
    r.ending_status = std::move(status);
  }

  void fail(Request& r, Status status, TimeNs now_ns) { stop(r, RequestState::kFailed, std::move(status), now_ns); }

  // Queues `r` on its best healthy path, or fails it when none is left.
  void home_request(Request& r, TimeNs now_ns) {
    const PathId home = first_healthy(r, now_ns);
    if (home == kNoPath) {
      // What ended the paths, where the transport says (a peer gone, a
      // revocation it did not acknowledge): the pair alone said nothing.
      std::string why;
      for (PathId p : r.chain->paths) {
        if (Status s = transport.path_status(p); !s.is_ok()) {
          why = fmt::format(": {}", s.message());
          break;
        }
      }
      fail(r, Status::unavailable("sched: no healthy path from {} to {}{}", r.spec.from, r.spec.to, why), now_ns);
      return;
    }
    enqueue(r, home, now_ns);
  }

  // A path went down: everything queued on it moves to the next path of its chain.
  void rehome_queue(PathId path, TimeNs now_ns) {
    std::vector<Request*> moving;
    paths[path].queue.by_age.for_each([&](const AgeEntry& e) { moving.push_back(e.request); });
    for (Request* r : moving) {
      dequeue(*r);
      home_request(*r, now_ns);
    }
  }

  // Returns a slice's credits; the caller settles its bytes.
  PostedSlice release(SliceId id) {
    const PostedSlice s = *posted.find(id);
    posted.remove(id);
    PathRuntime& p = paths[s.path];
    p.load.inflight_slices -= 1;
    p.load.inflight_bytes -= s.wire_bytes;
    p.lane_load[s.lane] -= 1;
    std::erase(p.posted, id);
    s.request->inflight -= 1;
    return s;
  }

  // Takes the next range of `r` and posts it on `path`. False when the
  // transport refused (the path died under us); nothing is lost then.
  bool post(Request& r, PathId path, TimeNs now_ns) {
    PathRuntime& p = paths[path];
    const std::uint64_t length = next_length(r, path);
    Range range;
    if (!r.retry.empty()) {
      Range& back = r.retry.back();
      range = {back.offset, length};
      back.offset += length;
      back.length -= length;
      if (back.length == 0) r.retry.pop_back();
    } else {
      range = {r.next_offset, length};
      r.next_offset += length;
    }
    const int lane = static_cast<int>(std::ranges::min_element(p.lane_load) - p.lane_load.begin());
    const std::uint64_t wire = std::max<std::uint64_t>(
        1, static_cast<std::uint64_t>(std::llround(static_cast<double>(length) * r.wire_ratio)));
    const SliceId id = posted.add({0, &r, range, wire, path, lane});
    void* local = r.spec.local == nullptr ? nullptr : static_cast<std::byte*>(r.spec.local) + range.offset;
    const transport::SliceMemory memory{r.spec.op, local, r.spec.remote_addr + range.offset, r.spec.remote_key};
    if (Status s = transport.submit({id, path, lane, length, memory, wire == length ? 0 : wire}, now_ns); !s.is_ok()) {
      posted.remove(id);
      r.retry.push_back(range);
      if (s.code() != StatusCode::kUnavailable) {
        // The request itself is wrong for this transport (a remote region the
        // peer has since removed): retrying cannot help, so it ends here.
        fail(r, std::move(s), now_ns);
        return true;
      }
      return false;
    }
    p.posted.push_back(id);
    p.lane_load[lane] += 1;
    p.load.inflight_slices += 1;
    p.load.inflight_bytes += wire;
    p.load.max_inflight_slices = std::max(p.load.max_inflight_slices, p.load.inflight_slices);
    p.load.max_inflight_bytes = std::max(p.load.max_inflight_bytes, p.load.inflight_bytes);
    r.inflight += 1;
    r.unsent -= length;
    if (r.queued) paths[r.home].load.queued_bytes -= length;
    r.status.state = RequestState::kRunning;
    ++stats.slices_posted;
    if (r.unsent == 0) {
      dequeue(r);
    } else {
      sync_due(r);
      rekey(r, now_ns);
    }
    return true;
  }

  // Waiting on `path` would miss the deadline and a fallback with free
  // credits would not: send the next slice there.
  bool try_spill(Request& r, PathId path, TimeNs now_ns) {
    if (!weighs_urgency() || r.spec.deadline_ns == 0) return false;
    const PathRuntime& p = paths[path];
    const double now = static_cast<double>(now_ns);
    const double deadline = static_cast<double>(r.spec.deadline_ns);
    const double wait_ns = static_cast<double>(p.load.inflight_bytes + r.unsent) / p.bytes_per_ns;
    if (now + wait_ns + static_cast<double>(p.latency_ns) <= deadline) return false;
    for (PathId f : r.chain->paths) {
      if (f == path || !transport.path_healthy(f, now_ns)) continue;
      const PathRuntime& fp = paths[f];
      const double finish = now + static_cast<double>(r.unsent) / fp.bytes_per_ns + static_cast<double>(fp.latency_ns);
      if (finish > deadline || !has_credit(f, next_length(r, f))) continue;
      if (post(r, f, now_ns)) {
        ++r.status.slices_spilled;
        ++stats.slices_spilled;
        return true;
      }
    }
    return false;
  }

  // A critical request without credits cancels the newest posted slices of a
  // lower class on its path, as many as its slice needs to fit the path's
  // credits (slots and in-flight bytes: a 4 KiB victim does not make room
  // for a 1 MiB slice); the victims' bytes go back to their requests.
  // Class-based, so strict_priority preempts too (a skeptic's baseline
  // should not be weaker than it can be); FIFO and EDF know no classes.
  bool try_preempt(Request& r, PathId path, TimeNs now_ns) {
    const bool by_class = weighs_urgency() || policy.kind == PolicyKind::kStrictPriority;
    if (!by_class || !policy.preemption || r.spec.qos > policy.preempt_min_class) return false;
    PathRuntime& p = paths[path];
    // Newest first, by index: release() erases from p.posted, which leaves
    // the older entries where they were.
    for (std::size_t i = p.posted.size(); i-- > 0;) {
      const SliceId victim_id = p.posted[i];
      Request& victim = *posted.find(victim_id)->request;
      if (!victim.live() || !victim.spec.preemptible || victim.spec.qos <= r.spec.qos) continue;
      // An overdue request is being served by the starvation bound; taking
      // its slice back would starve it again, forever under sustained load.
      if (weighs_urgency() && time_until(victim.status.submitted_ns, now_ns) >= policy.starvation_bound_ns) continue;
      const auto result = transport.cancel(victim_id, now_ns);
      if (!result.stopped) continue;  // already delivered: nothing to win
      const PostedSlice s = release(victim_id);
      victim.retry.push_back(s.range);
      victim.unsent += s.range.length;
      if (victim.queued) paths[victim.home].load.queued_bytes += s.range.length;
      sync_due(victim);
      ++victim.status.slices_preempted;
      ++stats.slices_preempted;
      stats.bytes_wasted += result.bytes_wasted;
      if (!victim.queued) {
        home_request(victim, now_ns);
      } else {
        rekey(victim, now_ns);
      }
      if (has_credit(path, next_length(r, path))) return post(r, path, now_ns);
    }
    return false;
  }
};

Scheduler::Scheduler(std::unique_ptr<State> state) : state_(std::move(state)) {}
Scheduler::~Scheduler() = default;

Result<std::unique_ptr<Scheduler>> Scheduler::create(const topology::TopologyGraph& graph, const SchedPolicy& policy,
                                                     transport::Transport& transport) {
  if (Status s = policy.validate(); !s.is_ok()) return std::unexpected(s);
  auto st = std::make_unique<State>(graph, policy, transport);
  st->sync_paths(0);
  return std::unique_ptr<Scheduler>(new Scheduler(std::move(st)));
}

Status check_request(RequestId id, const TransferRequest& request) {
  if (request.bytes == 0 || request.bytes > TransferRequest::kMaxBytes) {
    return Status::invalid_argument("submit: request {} ({} -> {}) has {} bytes (expected 1 .. 2^48)", id,
                                    shown(request.from), shown(request.to), request.bytes);
  }
  if (static_cast<int>(request.qos) >= kQosClassCount) {
    return Status::invalid_argument("submit: request {} has qos class {} (expected 0 .. {})", id,
                                    static_cast<int>(request.qos), kQosClassCount - 1);
  }
  if (request.op != transport::Op::kWrite && request.op != transport::Op::kRead) {
    return Status::invalid_argument("submit: request {} has op {} (expected write or read)", id,
                                    static_cast<int>(request.op));
  }
  if (request.timeout_ns < 0) {
    return Status::invalid_argument("submit: request {} has timeout {} ns (expected >= 0; 0: the policy's)", id,
                                    request.timeout_ns);
  }
  return Status::ok();
}

Status Scheduler::submit(RequestId id, const TransferRequest& request, TimeNs now_ns) {
  State& st = *state_;
  if (Status s = check_request(id, request); !s.is_ok()) return s;
  if (st.requests.contains(id)) return Status::already_exists("submit: request {} exists already", id);
  auto chain = st.chain_for(request.from, request.to, now_ns);
  if (!chain) return chain.error();
  Request& r = st.requests[id];
  r.id = id;
  r.spec = request;
  r.seq = st.next_seq++;
  r.chain = *chain;
  ++r.chain->requests;
  r.unsent = request.bytes;
  r.status.qos = request.qos;
  r.status.bytes = request.bytes;
  r.status.deadline_ns = request.deadline_ns;
  r.status.submitted_ns = now_ns;
  ++st.open;
  st.home_request(r, now_ns);
  return Status::ok();
}

Status Scheduler::cancel(RequestId id, TimeNs now_ns) {
  State& st = *state_;
  const auto it = st.requests.find(id);
  if (it == st.requests.end()) return Status::not_found("cancel: no request {}", id);
  Request& r = it->second;
  if (!r.live()) {
    return Status::invalid_argument("cancel: request {} already {} ({})", id,
                                    r.ended() ? "ended" : "stopping", to_string(r.status.state));
  }
  st.stop(r, RequestState::kCancelled, Status::cancelled("request {} cancelled", id), now_ns);
  return Status::ok();
}

RequestId Scheduler::on_completion(const transport::Completion& c, TimeNs now_ns) {
  State& st = *state_;
  if (st.posted.find(c.id) == nullptr) return 0;  // stopped by a cancel that lost the race
  const PostedSlice s = st.release(c.id);
  Request& r = *s.request;
  // Recorded even after the request ended: a slice a cancel could not stop
  // still landed, and a caller re-sending the rest must know.
  if (c.status.is_ok()) record_delivered(r.delivered_prefix, r.delivered_beyond, s.range);
  if (r.ended()) return r.id;  // cancelled or failed: the bytes no longer matter
  if (r.status.state == RequestState::kCancelling) {
    if (r.inflight == 0) st.finish(r, r.ending_as, std::move(r.ending_status), now_ns);
    return r.id;
  }
  if (c.status.is_ok()) {
    r.status.bytes_done += s.range.length;
    st.paths[s.path].load.bytes_completed += s.range.length;
    ++st.stats.slices_completed;
    st.stats.bytes_completed += s.range.length;
    st.stats.wire_bytes_completed += c.wire_bytes != 0 ? c.wire_bytes : c.bytes;
    if (r.status.bytes_done == r.spec.bytes) st.finish(r, RequestState::kCompleted, Status::ok(), c.at_ns);
    return r.id;
  }
  ++st.stats.slices_retried;
  if (++r.failures > kMaxSliceFailures) {
    st.fail(r,
            Status::unavailable("request {}: {} slices failed, the last with: {}", r.id, r.failures,
                                c.status.message()),
            now_ns);
    return r.id;
  }
  r.retry.push_back(s.range);
  r.unsent += s.range.length;
  if (r.queued) st.paths[r.home].load.queued_bytes += s.range.length;
  st.sync_due(r);
  if (!r.queued) {
    st.home_request(r, now_ns);
  } else {
    st.rekey(r, now_ns);
  }
  return r.id;
}

Status Scheduler::abandon(RequestId id, Status reason, TimeNs now_ns) {
  State& st = *state_;
  const auto it = st.requests.find(id);
  if (it == st.requests.end()) return Status::not_found("abandon: no request {}", id);
  Request& r = it->second;
  if (!r.live()) {
    return Status::invalid_argument("abandon: request {} already {} ({})", id, r.ended() ? "ended" : "stopping",
                                    to_string(r.status.state));
  }
  if (reason.is_ok()) return Status::invalid_argument("abandon: request {}: an ok reason (expected why it ends)", id);
  RequestState state = RequestState::kFailed;
  if (reason.code() == StatusCode::kDeadlineInfeasible) state = RequestState::kInfeasible;
  if (reason.code() == StatusCode::kTimeout) state = RequestState::kTimedOut;
  st.stop(r, state, std::move(reason), now_ns);
  return Status::ok();
}

Status Scheduler::set_wire_ratio(RequestId id, double ratio) {
  const auto it = state_->requests.find(id);
  if (it == state_->requests.end()) return Status::not_found("set_wire_ratio: no request {}", id);
  if (!(ratio > 0 && ratio <= 1)) {
    return Status::invalid_argument("set_wire_ratio: ratio {} for request {} is outside (0, 1]", ratio, id);
  }
  if (ratio < 1 && !state_->transport.carries_compressed_slices()) {
    return Status::failed_precondition(
        "set_wire_ratio: request {}: this transport carries no compressed slices (its slices would arrive short)", id);
  }
  it->second.wire_ratio = ratio;
  return Status::ok();
}

Result<transport::PathId> Scheduler::route(const std::string& from, const std::string& to, TimeNs now_ns) {
  auto chain = state_->chain_for(from, to, now_ns);
  if (!chain) return std::unexpected(chain.error());
  for (PathId p : (*chain)->paths) {
    if (state_->transport.path_healthy(p, now_ns)) return p;
  }
  return std::unexpected(Status::unavailable("route: no healthy path from {} to {}", from, to));
}

void Scheduler::dispatch(TimeNs now_ns) {
  State& st = *state_;
  st.sync_paths(now_ns);
  // Pass 1: every path serves its own queue. Pass 2: what is still blocked
  // may spill to a fallback with credits left over, or preempt.
  for (int pass = 0; pass < 2; ++pass) {
    st.busy_scratch.assign(st.busy_queues.begin(), st.busy_queues.end());
    for (PathId path : st.busy_scratch) {
      if (!st.transport.path_healthy(path, now_ns)) {
        st.rehome_queue(path, now_ns);
        continue;
      }
      while (Request* r = st.top(path, now_ns)) {
        if (st.has_credit(path, st.next_length(*r, path))) {
          const bool promoted = st.top_is_overdue;
          if (!st.post(*r, path, now_ns)) {
            st.rehome_queue(path, now_ns);
            break;
          }
          st.stats.starvation_promotions += promoted;
          st.paths[path].promoted_last = promoted;
          continue;
        }
        if (pass == 0) break;
        if (!st.try_spill(*r, path, now_ns) && !st.try_preempt(*r, path, now_ns)) break;
      }
    }
  }
}

Result<RequestStatus> Scheduler::status(RequestId id) const {
  const auto it = state_->requests.find(id);
  if (it == state_->requests.end()) return std::unexpected(Status::not_found("status: no request {}", id));
  RequestStatus s = it->second.status;
  s.bytes_unsent = it->second.live() ? it->second.unsent : 0;
  return s;
}

bool Scheduler::has(RequestId id) const { return state_->requests.contains(id); }
std::size_t Scheduler::posted_slices(RequestId id) const {
  const auto it = state_->requests.find(id);
  return it == state_->requests.end() ? 0 : static_cast<std::size_t>(it->second.inflight);
}

Result<RequestProgress> Scheduler::progress(RequestId id) const {
  const auto it = state_->requests.find(id);
  if (it == state_->requests.end()) return std::unexpected(Status::not_found("progress: no request {}", id));
  const Request& r = it->second;
  RequestProgress p;
  if (r.delivered_prefix > 0) p.delivered.push_back({0, r.delivered_prefix});
  for (const Range& d : r.delivered_beyond) p.delivered.push_back({d.offset, d.length});
  if (r.inflight > 0) {
    std::vector<Range> posted;
    for (SliceId sid : state_->posted.of(&r)) posted.push_back(state_->posted.find_const(sid)->range);
    std::ranges::sort(posted, {}, &Range::offset);
    for (const Range& q : posted) p.posted.push_back({q.offset, q.length});
  }
  return p;
}

Status Scheduler::forget(RequestId id) {
  const auto it = state_->requests.find(id);
  if (it == state_->requests.end()) return Status::not_found("forget: no request {}", id);
  if (!it->second.ended() || it->second.inflight != 0) {
    return Status::invalid_argument("forget: request {} is still {}", id, to_string(it->second.status.state));
  }
  state_->requests.erase(it);
  return Status::ok();
}

void Scheduler::set_finish_hook(std::function<void(RequestId)> hook) { state_->finish_hook = std::move(hook); }

const SchedStats& Scheduler::stats() const { return state_->stats; }
const PathLoad& Scheduler::load(transport::PathId path) const {
  static const PathLoad kNone{};
  return path < state_->paths.size() ? state_->paths[path].load : kNone;
}

std::uint64_t Scheduler::unsent_due_before(transport::PathId path, TimeNs deadline_ns, RequestId self) const {
  if (path >= state_->paths.size()) return 0;
  std::uint64_t seq = std::numeric_limits<std::uint64_t>::max();  // not ours: equal deadlines go first
  if (const auto it = state_->requests.find(self); it != state_->requests.end()) seq = it->second.seq;
  state_->refresh_due(path);
  return state_->paths[path].due.sum_below({deadline_ns, seq});
}
std::size_t Scheduler::queued_requests() const { return state_->open; }
const SchedPolicy& Scheduler::policy() const { return state_->policy; }

}  // namespace baton::sched
