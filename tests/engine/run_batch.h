// Test helper: submits a batch to a real engine, waits for it (bounded),
// releases it, and answers its final status.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "baton/engine/engine.h"

namespace baton::testing {

inline Status run_batch(engine::Engine& e, const engine::Batch& batch, TimeNs timeout_ns = 30'000'000'000) {
  auto h = e.submit(batch);
  if (!h) return h.error();
  if (Status s = e.wait(*h, timeout_ns); !s.is_ok()) return s;
  auto st = e.poll(*h);
  if (!st) return st.error();
  EXPECT_TRUE(st->done);
  EXPECT_TRUE(e.release(*h).is_ok());
  return st->status;
}

// Releases an ended batch once the slices a cancel could not recall have
// landed (release refuses until then): tries for up to 2 s.
inline Status release_when_landed(engine::Engine& e, engine::BatchHandle h) {
  Status released;
  for (int i = 0; i < 2000; ++i) {
    released = e.release(h);
    if (released.is_ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return released;
}

}  // namespace baton::testing
