#include "sched/indexed_heap.h"

#include <gtest/gtest.h>


#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace baton::sched {
namespace {

// An owner that the heap tells where its entry sits, as a scheduler Request.
struct Owner {
  std::uint32_t pos = 0;
  bool in = false;
};
struct Entry {
  int key = 0;
  std::uint64_t seq = 0;
  Owner* owner = nullptr;
};
struct Smaller {
  bool operator()(const Entry& a, const Entry& b) const { return a.key != b.key ? a.key < b.key : a.seq < b.seq; }
};
struct At {
  std::uint32_t& operator()(const Entry& e) const { return e.owner->pos; }
};
using Heap = IndexedHeap<Entry, Smaller, At>;

// Every owner's position names its own entry, and no parent comes after a
// child (each of the 4).
void expect_consistent(const Heap& heap, const std::vector<std::unique_ptr<Owner>>& owners) {
  std::size_t in = 0;
  for (const auto& o : owners) {
    if (!o->in) continue;
    ++in;
    ASSERT_LT(o->pos, heap.size());
    ASSERT_EQ(heap.at(o->pos).owner, o.get());
  }
  ASSERT_EQ(in, heap.size());
  for (std::uint32_t i = 1; i < heap.size(); ++i) {
    ASSERT_FALSE(Smaller{}(heap.at(i), heap.at((i - 1) / 4))) << "entry " << i << " before its parent";
  }
}

TEST(IndexedHeap, PushEraseAndReplaceKeepTheOrderOfASortedSetAndEveryPosition) {
  Heap heap;
  std::vector<std::unique_ptr<Owner>> owners;
  std::set<std::pair<int, std::uint64_t>> reference;  // (key, seq)
  std::vector<Entry> current;                         // each owner's entry, by owner index
  std::mt19937_64 rng(11);
  std::uint64_t seq = 0;
  for (int step = 0; step < 40'000; ++step) {
    const auto op = rng() % 10;
    if (op < 4 || reference.empty()) {  // push
      owners.push_back(std::make_unique<Owner>());
      Entry e{static_cast<int>(rng() % 50), seq++, owners.back().get()};
      owners.back()->in = true;
      current.push_back(e);
      reference.insert({e.key, e.seq});
      heap.push(e);
    } else if (op < 6) {  // the top: what a dispatch takes
      const Entry top = heap.top();
      ASSERT_EQ(std::make_pair(top.key, top.seq), *reference.begin());
      reference.erase(reference.begin());
      heap.erase(top.owner->pos);
      top.owner->in = false;
    } else {
      // An owner still in the heap, picked at random.
      std::size_t k = rng() % owners.size();
      while (!owners[k]->in) k = (k + 1) % owners.size();
      Owner& o = *owners[k];
      Entry& e = current[k];
      ASSERT_EQ(heap.at(o.pos).owner, &o);
      reference.erase({e.key, e.seq});
      if (op < 8) {  // anywhere
        heap.erase(o.pos);
        o.in = false;
      } else {  // a new key, up or down
        e.key = static_cast<int>(rng() % 50);
        reference.insert({e.key, e.seq});
        heap.replace(o.pos, e);
      }
    }
    if (step % 997 == 0) expect_consistent(heap, owners);
    if (!reference.empty()) {
      ASSERT_EQ(std::make_pair(heap.top().key, heap.top().seq), *reference.begin()) << "step " << step;
    }
    ASSERT_EQ(heap.size(), reference.size());
  }
  expect_consistent(heap, owners);
  // Drained in order.
  std::vector<std::pair<int, std::uint64_t>> drained;
  while (!heap.empty()) {
    drained.emplace_back(heap.top().key, heap.top().seq);
    heap.top().owner->in = false;
    heap.erase(0);
  }
  const std::vector<std::pair<int, std::uint64_t>> want(reference.begin(), reference.end());
  EXPECT_EQ(drained, want);
}

}  // namespace
}  // namespace baton::sched
