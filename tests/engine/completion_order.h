// Test helper: the order in which requests of a Harness reached their end.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "baton/engine/harness.h"

namespace baton::testing {

inline std::vector<sched::RequestId> completion_order(engine::Harness& e, const std::vector<sched::RequestId>& ids) {
  std::vector<std::pair<TimeNs, sched::RequestId>> done;
  for (sched::RequestId id : ids) done.emplace_back(e.status(id).value().completed_ns, id);
  std::ranges::sort(done);
  std::vector<sched::RequestId> out;
  for (auto [t, id] : done) out.push_back(id);
  return out;
}

}  // namespace baton::testing
