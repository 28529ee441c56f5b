#include "transport/ucx/readers.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>

namespace baton::transport::ucx {

struct Readers::Slot {
  alignas(64) std::atomic<std::uint64_t> count{0};  // odd: inside a section; written by its owner only
  std::uint32_t depth = 0;                           // the owner's nesting
  std::atomic<bool> owned{false};
  Slot* next = nullptr;  // set before the slot is listed, then fixed
};

namespace {

std::atomic<Readers::Slot*> g_slots{nullptr};  // every slot ever made; none is freed
std::atomic<std::size_t> g_slot_count{0};

// Whether the writer's membarrier stands in for the readers' fences.
// Decided once, before the first section or snapshot. BATON_NO_MEMBARRIER
// (set, not "0") turns it off: membarrier interrupts every CPU that runs
// this process, which a deployment with isolated cores may not want; and
// the readers' own fences get tested that way.
bool asymmetric() {
  static const bool registered = [] {
    const char* off = std::getenv("BATON_NO_MEMBARRIER");
    if (off != nullptr && *off != '\0' && std::string_view(off) != "0") return false;
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }();
  return registered;
}

thread_local Readers::Slot* t_slot = nullptr;  // this thread's, once claimed

// In a child of fork() only the forking thread lives on: a slot another
// thread held inside a section would stay odd for good, and every table the
// child's engines retire would wait on it (their revocations never ended).
void after_fork_in_child() {
  for (Readers::Slot* s = g_slots.load(std::memory_order_relaxed); s != nullptr; s = s->next) {
    if (s == t_slot) continue;
    const std::uint64_t count = s->count.load(std::memory_order_relaxed);
    s->count.store(count + count % 2, std::memory_order_relaxed);
    s->depth = 0;
    s->owned.store(false, std::memory_order_relaxed);
  }
}

Readers::Slot* claim() {
  static std::once_flag at_fork;
  std::call_once(at_fork, [] { (void)::pthread_atfork(nullptr, nullptr, after_fork_in_child); });
  for (Readers::Slot* s = g_slots.load(std::memory_order_seq_cst); s != nullptr; s = s->next) {
    bool free = false;
    if (!s->owned.load(std::memory_order_relaxed) && s->owned.compare_exchange_strong(free, true)) return s;
  }
  auto* s = new Readers::Slot;  // lives as long as the process, reused by later threads
  s->owned.store(true, std::memory_order_relaxed);
  // Sequentially consistent with snapshot()'s walk: a slot listed after
  // the walk belongs to a reader that reads the new table.
  Readers::Slot* head = g_slots.load(std::memory_order_seq_cst);
  do {
    s->next = head;
  } while (!g_slots.compare_exchange_weak(head, s, std::memory_order_seq_cst));
  g_slot_count.fetch_add(1, std::memory_order_relaxed);
  return s;
}

// A thread's slot, handed back when the thread exits.
struct Owner {
  Readers::Slot* slot = claim();
  Owner() {
    t_slot = slot;
    (void)asymmetric();
  }
  ~Owner() {
    t_slot = nullptr;
    slot->owned.store(false, std::memory_order_release);
  }
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;
};

}  // namespace

Readers::Section::Section() {
  thread_local Owner owner;
  slot_ = owner.slot;
  if (slot_->depth++ != 0) return;
  const std::uint64_t entered = slot_->count.load(std::memory_order_relaxed) + 1;
  // The table is read only after this store: the compiler keeps the order
  // (the signal fence); the CPU is made to by the writer's membarrier, or
  // else by a sequentially consistent store (against the writer's
  // sequentially consistent store of the table and load of the slot).
  if (asymmetric()) {
    slot_->count.store(entered, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    slot_->count.store(entered, std::memory_order_seq_cst);
  }
}

Readers::Section::~Section() {
  if (--slot_->depth != 0) return;
  // Release: what this section read happens before the table is freed.
  slot_->count.store(slot_->count.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

Readers::Snapshot Readers::snapshot() {
  if (asymmetric()) (void)::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  Snapshot out;
  for (const Slot* s = g_slots.load(std::memory_order_seq_cst); s != nullptr; s = s->next) {
    const std::uint64_t count = s->count.load(std::memory_order_seq_cst);
    if (count % 2 == 1) out.inside_.emplace_back(s, count);
  }
  return out;
}

bool Readers::Snapshot::left() {
  std::erase_if(inside_, [](const auto& reader) {
    return reader.first->count.load(std::memory_order_acquire) != reader.second;
  });
  return inside_.empty();
}

std::size_t Readers::slots() { return g_slot_count.load(std::memory_order_relaxed); }

bool Readers::membarrier() { return asymmetric(); }

}  // namespace baton::transport::ucx
