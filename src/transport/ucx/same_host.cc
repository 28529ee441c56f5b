#include "transport/ucx/same_host.h"

#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "baton/topology/probe.h"

namespace baton::transport::ucx {
namespace {

// Below this, munmap inline: freeing 16 MiB of pages costs ~5 ms at worst.
constexpr std::size_t kUnmapInlineMaxBytes = 16 << 20;

// One thread, started on first use, that unmaps what it is handed in order.
// Never destroyed: a mapping may be dropped by a static's destructor at exit.
class Unmapper {
 public:
  static Unmapper& get() {
    static Unmapper* u = new Unmapper;
    return *u;
  }
  void unmap(void* address, std::size_t length) {
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(address, length);
    }
    wake_.notify_one();
  }

 private:
  Unmapper() { std::thread([this] { run(); }).detach(); }
  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return !queue_.empty(); });
      auto [address, length] = queue_.front();
      queue_.pop_front();
      lock.unlock();
      munmap(address, length);
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<void*, std::size_t>> queue_;
};

void unmap(void* address, std::size_t length) {
  if (address == nullptr) return;
  if (length <= kUnmapInlineMaxBytes) {
    munmap(address, length);
  } else {
    Unmapper::get().unmap(address, length);
  }
}

}  // namespace

bool cookie_matches(pid_t pid, std::uint64_t address, const Cookie& cookie) {
  if (pid <= 0 || address == 0) return false;
  Cookie seen{};
  iovec local{seen.data(), seen.size()};
  iovec remote{reinterpret_cast<void*>(address), seen.size()};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(seen.size()) && seen == cookie;
}

bool own_cookie_matches(std::uint64_t address, const Cookie& cookie) {
  if (address == 0) return false;
  const auto* at = reinterpret_cast<const void*>(address);
  // The address comes from the peer: read only what this process maps.
  return check_mapped_writable(at, cookie.size()).is_ok() && std::memcmp(at, cookie.data(), cookie.size()) == 0;
}

Result<Mapping> Mapping::of(int fd, std::size_t length) {
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return std::unexpected(Status::unavailable("mmap of {} shared bytes: {}", length, std::strerror(errno)));
  Mapping m;
  m.address_ = p;
  m.length_ = length;
  return m;
}

Mapping::Mapping(Mapping&& o) noexcept
    : address_(std::exchange(o.address_, nullptr)), length_(std::exchange(o.length_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    unmap(address_, length_);
    address_ = std::exchange(o.address_, nullptr);
    length_ = std::exchange(o.length_, 0);
  }
  return *this;
}

Mapping::~Mapping() { unmap(address_, length_); }

namespace {

// Pages of [address, +length) come from `node` where it has memory. Set
// before the first touch: shared memory pages are allocated on fault, by
// the mapping's policy.
Status prefer_numa_node(void* address, std::size_t length, int node) {
  constexpr int kMaxNodes = 1024;
  constexpr int kBits = 8 * sizeof(unsigned long);
  if (node >= kMaxNodes || !topology::has_numa_node(node)) {
    return Status::invalid_argument("NUMA node {} is not a node of this machine", node);
  }
  unsigned long mask[kMaxNodes / kBits] = {};
  mask[node / kBits] |= 1UL << (node % kBits);
  if (syscall(SYS_mbind, address, length, MPOL_PREFERRED, mask, kMaxNodes + 1, 0) != 0) {
    return Status::unavailable("mbind to NUMA node {}: {}", node, std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace

Result<SharedAllocation> SharedAllocation::create(std::size_t length, int numa_node) {
  SharedAllocation a;
  a.fd = UniqueFd(memfd_create("baton-region", MFD_CLOEXEC));
  if (a.fd.get() < 0) return std::unexpected(Status::unavailable("memfd_create: {}", std::strerror(errno)));
  if (ftruncate(a.fd.get(), static_cast<off_t>(length)) != 0) {
    return std::unexpected(Status::unavailable("ftruncate of a memfd to {} bytes: {}", length, std::strerror(errno)));
  }
  struct stat st{};
  if (fstat(a.fd.get(), &st) != 0) return std::unexpected(Status::unavailable("fstat: {}", std::strerror(errno)));
  a.inode = st.st_ino;
  auto mapped = Mapping::of(a.fd.get(), length);
  if (!mapped) return std::unexpected(mapped.error());
  if (numa_node >= 0) {
    if (Status s = prefer_numa_node(mapped->address(), length, numa_node); !s.is_ok()) return std::unexpected(s);
  }
  a.mapping = std::make_shared<const Mapping>(std::move(*mapped));
  return a;
}

Status check_mapped_writable(const void* addr, std::size_t length) {
  const auto begin = reinterpret_cast<std::uintptr_t>(addr);
  const std::uintptr_t end = begin + length;
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return Status::unavailable("cannot read /proc/self/maps: {}", std::strerror(errno));
  // The mappings come in address order: walk them from `begin` until the
  // range is covered, refusing a gap or a mapping without rw.
  std::uintptr_t covered = begin;
  Status verdict = Status::invalid_argument("[{:#x}, +{}) is not all mapped memory of this process", begin, length);
  char line[512];
  while (covered < end && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long from = 0, to = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &from, &to, perms) != 3) continue;
    // A line longer than the buffer (a long path) continues on the next
    // read; its rest does not parse as a mapping and is skipped above.
    if (to <= covered) continue;
    if (from > covered) break;  // a gap: `verdict` says not mapped
    if (perms[0] != 'r' || perms[1] != 'w') {
      verdict = Status::invalid_argument("[{:#x}, +{}) includes memory mapped {} at {:#x} (a region must be readable "
                                         "and writable)",
                                         begin, length, perms, from);
      break;
    }
    covered = to;
  }
  std::fclose(maps);
  return covered >= end ? Status::ok() : verdict;
}

Result<Mapping> map_peer_memfd(pid_t pid, int fd, std::uint64_t inode, std::size_t length) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  UniqueFd opened(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (opened.get() < 0) return std::unexpected(Status::unavailable("open {}: {}", path, std::strerror(errno)));
  struct stat st{};
  if (fstat(opened.get(), &st) != 0) return std::unexpected(Status::unavailable("fstat {}: {}", path, std::strerror(errno)));
  if (st.st_ino != inode || static_cast<std::uint64_t>(st.st_size) < length) {
    return std::unexpected(Status::unavailable("{} is inode {} of {} bytes (expected inode {}, at least {} bytes)",
                                               path, st.st_ino, st.st_size, inode, length));
  }
  auto mapped = Mapping::of(opened.get(), length);
  if (!mapped) return std::unexpected(Status::unavailable("{}: {}", path, mapped.error().message()));
  return mapped;
}

namespace {

struct ProcStat {
  bool gone = false;  // no such process, or nothing to read
  char state = 0;     // 0 when unparsed
  unsigned long flags = 0;
};

ProcStat proc_stat(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return {errno == ENOENT || errno == ESRCH};
  char buf[512];
  const ssize_t n = read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return {true};
  buf[n] = '\0';
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags …"; comm may hold
  // spaces and parentheses, so parse from the last ')'.
  const char* at = std::strrchr(buf, ')');
  ProcStat s;
  if (at == nullptr || std::sscanf(at + 1, " %c %*d %*d %*d %*d %*d %lu", &s.state, &s.flags) != 2) return {};
  return s;
}

}  // namespace

bool process_exiting(pid_t pid) {
  const ProcStat s = proc_stat(pid);
  constexpr unsigned long kPfExiting = 0x4;  // include/linux/sched.h
  return s.gone || s.state == 'Z' || s.state == 'X' || (s.flags & kPfExiting) != 0;
}

bool process_gone(pid_t pid) {
  const ProcStat s = proc_stat(pid);
  return s.gone || s.state == 'Z' || s.state == 'X';
}

Status cma_copy(pid_t pid, Op op, void* local, std::uint64_t remote_addr, std::size_t bytes) {
  auto* here = static_cast<std::uint8_t*>(local);
  std::size_t done = 0;
  while (done < bytes) {
    iovec l{here + done, bytes - done};
    iovec r{reinterpret_cast<void*>(remote_addr + done), bytes - done};
    const ssize_t n = op == Op::kRead ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EFAULT;
      // EFAULT is either side's range: both are named.
      return Status::unavailable("{} of {} bytes between ours at {} and process {}'s at {:#x}: {}{}",
                                 op == Op::kRead ? "process_vm_readv" : "process_vm_writev", bytes, local, pid,
                                 remote_addr, std::strerror(e), e == ESRCH ? " (the peer is gone)" : "");
    }
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

Result<std::unique_ptr<CmaCopier>> CmaCopier::create() {
  auto event = make_eventfd();
  if (!event) return std::unexpected(event.error());
  return std::unique_ptr<CmaCopier>(new CmaCopier(std::move(*event)));
}

CmaCopier::CmaCopier(UniqueFd event) : event_(std::move(event)), thread_([this] { run(); }) {}

CmaCopier::~CmaCopier() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void CmaCopier::submit(const Job& job) {
  {
    std::lock_guard lock(mutex_);
    todo_.push_back(job);
  }
  wake_.notify_one();
}

std::vector<CmaCopier::Done> CmaCopier::take() {
  reset_eventfd(event_.get());
  std::lock_guard lock(mutex_);
  return std::exchange(done_, {});
}

void CmaCopier::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stop_ || !todo_.empty(); });
    if (todo_.empty()) return;  // stopping, and every queued copy is done
    const Job job = todo_.front();
    todo_.pop_front();
    lock.unlock();
    Done done{job.tag, cma_copy(job.pid, job.op, job.local, job.remote_addr, job.bytes), false};
    done.holder_exiting = !done.status.is_ok() && process_exiting(job.pid);
    lock.lock();
    done_.push_back(std::move(done));
    notify_eventfd(event_.get());
  }
}

}  // namespace baton::transport::ucx
