// A transport for tests of the layers above it whose paths appear and
// change while it runs, as UcxTransport's do when peers connect.
#pragma once

#include <set>
#include <vector>

#include "baton/transport/transport.h"

namespace baton::sched {

// A transport whose paths appear while it runs (as UCX peers connect), and
// whose slices land the instant they are posted: enough to test routing on
// paths the topology does not know.
class GrowingTransport final : public transport::Transport {
 public:
  void add(transport::PathInfo info) { paths_.push_back(std::move(info)); }
  // The path's id goes to a new path (UcxTransport: a failed path's slot
  // taken by a connect to another peer).
  void reincarnate(transport::PathId id, transport::PathInfo info) {
    info.incarnation = paths_[id].incarnation + 1;
    paths_[id] = std::move(info);
    ++version_;
  }
  void set_healthy(transport::PathId id, bool healthy) {
    if (healthy) {
      down_.erase(id);
    } else {
      down_.insert(id);
    }
  }
  const std::vector<transport::PathInfo>& paths() const override { return paths_; }
  std::uint64_t paths_version() const override { return version_; }

  Status submit(const transport::SliceSubmit& s, TimeNs now_ns) override {
    (holding_ ? held_ : landed_).push_back({s.id, s.path, s.lane, s.bytes, now_ns, Status::ok()});
    return Status::ok();
  }
  // While holding, slices stay in flight until fail_held() ends them.
  void hold(bool holding) { holding_ = holding; }
  [[nodiscard]] std::size_t held() const { return held_.size(); }
  void fail_held() {
    for (transport::Completion& c : held_) c.status = Status::unavailable("the path failed");
    landed_.insert(landed_.end(), held_.begin(), held_.end());
    held_.clear();
  }
  transport::CancelResult cancel(transport::SliceId, TimeNs) override { return {}; }
  void poll(TimeNs, std::vector<transport::Completion>& out) override {
    out.insert(out.end(), landed_.begin(), landed_.end());
    landed_.clear();
  }
  std::optional<TimeNs> next_event_ns() const override { return std::nullopt; }
  bool path_healthy(transport::PathId path, TimeNs) const override {
    return path < paths_.size() && !down_.contains(path);
  }

 private:
  std::vector<transport::PathInfo> paths_;
  std::vector<transport::Completion> landed_;
  std::set<transport::PathId> down_;
  std::vector<transport::Completion> held_;
  bool holding_ = false;
  std::uint64_t version_ = 0;
};

}  // namespace baton::sched
