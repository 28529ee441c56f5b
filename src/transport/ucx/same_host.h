// Same-host copies without UCX: a peer on this host moves bytes with the
// initiator's own CPU. Regions the holder allocated (allocate_memory) live in
// a memfd that the initiator maps through /proc/<pid>/fd and copies with
// memcpy; other regions are reached with CMA (process_vm_readv/writev). No
// copy needs the holder's CPU, so a stopped holder still serves, and a dead
// one cannot leave a copy in flight: CMA fails at once (ESRCH) and a mapping
// stays valid until unmapped here. Private to transport/ucx.
//
// The OS decides who may do this (same user, ptrace access): a peer is taken
// for same-host only after reading a random cookie out of its memory.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "baton/common/status.h"
#include "baton/transport/transport.h"
#include "transport/ucx/control_channel.h"

namespace baton::transport::ucx {

// True when process `pid`, read at `address`, holds `cookie`: the peer is
// this host's process `pid` and the OS lets us reach its memory.
[[nodiscard]] bool cookie_matches(pid_t pid, std::uint64_t address, const Cookie& cookie);
// The same in this process, read directly (no process_vm_readv, which a
// seccomp profile may refuse): whether the peer is this very process.
[[nodiscard]] bool own_cookie_matches(std::uint64_t address, const Cookie& cookie);

// A shared mapping of a memfd; unmapped when destroyed. A large one is
// unmapped on a background thread: when its holder has died, our mapping is
// the memfd's last reference, and munmap then frees every page (about
// 0.1 ms per MiB here), which would stall the engine loop that drops it.
class Mapping {
 public:
  // mmap of the first `length` bytes of `fd`, read-write and shared.
  // unavailable saying why not.
  [[nodiscard]] static Result<Mapping> of(int fd, std::size_t length);
  Mapping() = default;
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  [[nodiscard]] std::byte* address() const { return static_cast<std::byte*>(address_); }

 private:
  void* address_ = nullptr;
  std::size_t length_ = 0;
};

// Anonymous shared memory for a region: a memfd, mapped here. Peers on this
// host map the same pages (map_peer_memfd).
struct SharedAllocation {
  // Its pages preferably on NUMA node `numa_node` (-1: the default policy).
  // unavailable when the kernel refuses (memfd_create, ftruncate, mmap,
  // mbind); invalid_argument for a node this machine does not have.
  [[nodiscard]] static Result<SharedAllocation> create(std::size_t length, int numa_node = -1);

  UniqueFd fd;
  std::uint64_t inode = 0;
  // Shared: a copy on another thread keeps it mapped (copy_direct).
  std::shared_ptr<const Mapping> mapping;
};

// Whether every page of [addr, +length) is mapped in this process, readable
// and writable (/proc/self/maps): ok, or invalid_argument saying which part
// is not. A peer writes into a region and reads land in one, so a read-only
// page would fault the engine's thread that copies, not fail a request.
[[nodiscard]] Status check_mapped_writable(const void* addr, std::size_t length);

// A peer's memfd mapped here: opens /proc/<pid>/fd/<fd>, checks it is the
// memfd named (inode) and holds `length` bytes, and maps it. unavailable
// saying why not (the caller then copies with CMA).
[[nodiscard]] Result<Mapping> map_peer_memfd(pid_t pid, int fd, std::uint64_t inode, std::size_t length);

// `bytes` between our `local` and the peer's `remote_addr` with CMA, looping
// over partial transfers. unavailable when the peer is gone (ESRCH) or the
// range is not mapped there (EFAULT), saying which.
[[nodiscard]] Status cma_copy(pid_t pid, Op op, void* local, std::uint64_t remote_addr, std::size_t bytes);

// True when process `pid` is gone, a zombie, or exiting (PF_EXITING in
// /proc/<pid>/stat). A SIGKILLed process shows it within a millisecond; its
// sockets close only once the kernel has torn down its memory, which takes
// ~0.1 ms per MiB it held.
[[nodiscard]] bool process_exiting(pid_t pid);
// True when process `pid` is gone or a zombie: none of its threads can run
// again (an exiting one's other threads may still be inside a copy).
[[nodiscard]] bool process_gone(pid_t pid);

// CMA copies on a thread of their own, in order. A copy from a holder that
// is dying blocks on its memory map until the kernel has torn it down
// (milliseconds per hundred MiB); on the engine loop it stalled every peer.
// fd() turns readable when copies have completed; take() collects them.
class CmaCopier {
 public:
  struct Job {
    pid_t pid = 0;
    Op op = Op::kRead;
    void* local = nullptr;
    std::uint64_t remote_addr = 0;
    std::size_t bytes = 0;
    std::uint64_t tag = 0;  // the caller's name for it (a slice id)
  };
  struct Done {
    std::uint64_t tag = 0;
    Status status;
    bool holder_exiting = false;  // it failed, and the holder is exiting (process_exiting)
  };
  // unavailable when the kernel refuses an eventfd.
  [[nodiscard]] static Result<std::unique_ptr<CmaCopier>> create();
  ~CmaCopier();  // finishes the queued copies, then stops
  CmaCopier(const CmaCopier&) = delete;
  CmaCopier& operator=(const CmaCopier&) = delete;

  [[nodiscard]] int fd() const { return event_.get(); }
  void submit(const Job& job);
  // The copies completed since the last call, in submit order; resets fd().
  [[nodiscard]] std::vector<Done> take();

 private:
  explicit CmaCopier(UniqueFd event);
  void run();
  UniqueFd event_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> todo_;
  std::vector<Done> done_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace baton::transport::ucx
