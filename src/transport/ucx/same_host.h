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

#include <cstddef>
#include <cstdint>

#include "baton/common/status.h"
#include "baton/transport/transport.h"
#include "transport/ucx/control_channel.h"

namespace baton::transport::ucx {

// True when process `pid`, read at `address`, holds `cookie`: the peer is
// this host's process `pid` and the OS lets us reach its memory.
[[nodiscard]] bool cookie_matches(pid_t pid, std::uint64_t address, const Cookie& cookie);

// Anonymous shared memory for a region: a memfd, mapped here. Peers on this
// host map the same pages (map_peer_memfd).
class SharedAllocation {
 public:
  // unavailable when the kernel refuses (memfd_create, ftruncate, mmap).
  [[nodiscard]] static Result<SharedAllocation> create(std::size_t length);
  SharedAllocation() = default;
  SharedAllocation(SharedAllocation&& o) noexcept;
  SharedAllocation& operator=(SharedAllocation&& o) noexcept;
  SharedAllocation(const SharedAllocation&) = delete;
  SharedAllocation& operator=(const SharedAllocation&) = delete;
  ~SharedAllocation();

  [[nodiscard]] void* address() const { return address_; }
  [[nodiscard]] int fd() const { return fd_.get(); }
  [[nodiscard]] std::uint64_t inode() const { return inode_; }

 private:
  UniqueFd fd_;
  void* address_ = nullptr;
  std::size_t length_ = 0;
  std::uint64_t inode_ = 0;
};

// A peer's memfd mapped here; unmapped when destroyed.
class PeerMapping {
 public:
  // Opens /proc/<pid>/fd/<fd>, checks it is the memfd named (inode) and
  // holds `length` bytes, and maps it. unavailable saying why not (the
  // caller then copies with CMA).
  [[nodiscard]] static Result<PeerMapping> map(pid_t pid, int fd, std::uint64_t inode, std::size_t length);
  PeerMapping() = default;
  PeerMapping(PeerMapping&& o) noexcept;
  PeerMapping& operator=(PeerMapping&& o) noexcept;
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  ~PeerMapping();

  [[nodiscard]] std::byte* address() const { return static_cast<std::byte*>(address_); }

 private:
  void* address_ = nullptr;
  std::size_t length_ = 0;
};

// `bytes` between our `local` and the peer's `remote_addr` with CMA, looping
// over partial transfers. unavailable when the peer is gone (ESRCH) or the
// range is not mapped there (EFAULT), saying which.
[[nodiscard]] Status cma_copy(pid_t pid, Op op, void* local, std::uint64_t remote_addr, std::size_t bytes);

}  // namespace baton::transport::ucx
