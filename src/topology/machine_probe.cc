// probe_machine: the sources tried in order, and how their facts are merged.
// GPU facts come from the richest source that answers (NVML, then CUDA, then
// the nvidia-smi command); the host (NUMA nodes, CPUs, NICs, PCIe tree) comes
// from hwloc. Every source that did not answer leaves a note.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "baton/common/log.h"
#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

// Where `program` is on PATH, or empty.
std::string on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  std::istringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::error_code ec;
    const auto candidate = std::filesystem::path(dir) / program;
    if (!dir.empty() && std::filesystem::is_regular_file(candidate, ec)) return candidate.string();
  }
  return {};
}

// The same bound as a file given with --nvidia-smi (load_nvidia_smi_topo).
constexpr std::size_t kNvidiaSmiMaxBytes = 16 << 20;

// Reaps `pid` without blocking past `patience`: a process killed while in a
// driver's ioctl (state D) dies only once the ioctl returns, so a thread of
// its own waits for it then.
// Whether it was reaped within `patience` (else the thread reaps it later).
bool reap(pid_t pid, int& status, std::chrono::milliseconds patience) {
  const auto until = std::chrono::steady_clock::now() + patience;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return true;
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::thread([pid] {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }).detach();
  return false;
}

// Runs `program args…` with stdout and stderr into one pipe, bounded: a
// wedged driver holds nvidia-smi in the kernel for minutes, and a broken one
// may print without end. Past `timeout` or `max_bytes` the child's process
// group is killed. posix_spawn, not fork: no copy of a large registered
// address space, no fork handlers of other libraries.
Result<std::string> run_bounded(const std::string& program, const std::vector<std::string>& args,
                                std::chrono::milliseconds timeout, std::size_t max_bytes) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::unexpected(Status::unavailable("{}: pipe: {}", program, strerror(errno)));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);  // a caller's blocked SIGTERM is not the command's
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: killed with its children
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (spawned != 0) {
    close(fds[0]);
    return std::unexpected(Status::unavailable("{}: could not start it: {}", program, strerror(spawned)));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left_ms = [&] {
    return static_cast<int>(std::max<std::int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
  };
  std::string out;
  std::string failure;
  std::array<char, 65536> buf{};
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, left_ms());
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      failure = fmt::format("no end within {} ms (a wedged driver?)", timeout.count());
      break;
    }
    const ssize_t n = read(fds[0], buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the end of its output
    out.append(buf.data(), static_cast<std::size_t>(n));
    if (out.size() > max_bytes) {
      failure = fmt::format("more than {} bytes of output", max_bytes);
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  const auto kill_group = [pid] {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
  };
  if (!failure.empty()) {
    kill_group();
    (void)reap(pid, status, std::chrono::seconds(1));
    return std::unexpected(Status::unavailable("{}: {}", program, failure));
  }
  // Its output ended; it still has until the deadline to exit.
  if (!reap(pid, status, std::chrono::milliseconds(left_ms()))) {
    kill_group();  // the waiter reap() left reaps it once it dies
    return std::unexpected(
        Status::unavailable("{}: no exit within {} ms (a wedged driver?)", program, timeout.count()));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return std::unexpected(Status::unavailable("{} {}: failed (status {}): {}", program, fmt::join(args, " "), status,
                                               shown(out.substr(0, out.find('\n')))));
  }
  return out;
}

// Overlays GPU facts from NVML or CUDA onto hwloc's view, matching GPUs by
// PCI bus id: hwloc knows where each GPU sits on PCIe, the driver knows its
// name and its NVLinks.
TopologyFacts merge_driver_into_host(const TopologyFacts& driver, TopologyFacts host) {
  using K = DeviceRef::Kind;
  std::vector<int> host_index(driver.gpus.size(), -1);
  for (std::size_t i = 0; i < driver.gpus.size(); ++i) {
    const GpuInfo& d = driver.gpus[i];
    for (std::size_t h = 0; h < host.gpus.size(); ++h) {
      if (!d.pci_bus_id.empty() && host.gpus[h].pci_bus_id == d.pci_bus_id) host_index[i] = static_cast<int>(h);
    }
    if (host_index[i] < 0) {
      host_index[i] = static_cast<int>(host.gpus.size());
      host.gpus.push_back(d);
      continue;
    }
    GpuInfo& g = host.gpus[host_index[i]];
    g.name = d.name.empty() ? g.name : d.name;
    g.uuid = d.uuid;
    g.nvlink_active = d.nvlink_active;
    g.nvlink_gbps_per_link = d.nvlink_gbps_per_link;
    g.gpu_numa_id = d.gpu_numa_id;
    if (g.numa == kUnknownNuma) g.numa = d.numa;
  }
  for (const Relation& r : driver.relations) {
    if (r.a.kind != K::kGpu || r.b.kind != K::kGpu) continue;
    const DeviceRef a{K::kGpu, host_index[r.a.index]};
    const DeviceRef b{K::kGpu, host_index[r.b.index]};
    Relation* existing = nullptr;
    for (Relation& h : host.relations) {
      if ((h.a == a && h.b == b) || (h.a == b && h.b == a)) existing = &h;
    }
    if (existing == nullptr) {
      host.relations.push_back({a, b, r.pci, r.nvlinks, r.via_nvswitch, r.peer_access});
    } else {
      existing->nvlinks = r.nvlinks;
      existing->via_nvswitch = r.via_nvswitch;
      existing->peer_access = existing->peer_access || r.peer_access;
    }
  }
  host.notes.insert(host.notes.end(), driver.notes.begin(), driver.notes.end());
  host.source = driver.source + "+hwloc";
  return host;
}

// The last resort: one NUMA node holding every CPU this process may use.
TopologyFacts single_node_host() {
  TopologyFacts f;
  f.source = "model:host";
  const int cpus = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  f.numa_nodes.push_back({0, fmt::format("0-{}", cpus - 1), cpus, 0});
  return f;
}

}  // namespace

Result<TopologyFacts> probe_nvidia_smi(std::chrono::milliseconds timeout) {
  const std::string program = on_path("nvidia-smi");
  if (program.empty()) return std::unexpected(Status::unavailable("nvidia-smi: not found on PATH"));
  auto out = run_bounded(program, {"topo", "-m"}, timeout, kNvidiaSmiMaxBytes);
  if (!out) return std::unexpected(out.error());
  return parse_nvidia_smi_topo(*out);
}

Result<TopologyFacts> probe_machine() {
  std::vector<std::string> notes;
  std::optional<TopologyFacts> gpus;
  for (auto probe : {+[] { return probe_nvml(); }, +[] { return probe_cuda(); }, +[] { return probe_nvidia_smi(); }}) {
    auto facts = probe();
    if (facts) {
      gpus = std::move(*facts);
      break;
    }
    notes.push_back(facts.error().message());
  }
  auto host = probe_hwloc();
  if (!host) {
    baton::logger().warn("topology: hwloc failed: {}", host.error().message());
    notes.push_back(host.error().message());
    host = single_node_host();
  }

  TopologyFacts merged;
  if (!gpus) {
    merged = std::move(*host);
  } else if (gpus->source.starts_with("nvidia-smi")) {
    // nvidia-smi already lists the NICs; hwloc adds the full NUMA picture.
    merged = std::move(*gpus);
    merged.numa_nodes = host->numa_nodes;
    merged.numa_nodes_complete = host->numa_nodes_complete;  // hwloc's list is the machine's
    merged.source += "+" + host->source;
  } else {
    merged = merge_driver_into_host(*gpus, std::move(*host));
  }
  merged.notes.insert(merged.notes.begin(), notes.begin(), notes.end());
  return merged;
}

bool has_numa_node(int node) {
  std::error_code ignored;
  return node >= 0 && std::filesystem::exists("/sys/devices/system/node/node" + std::to_string(node), ignored);
}

}  // namespace baton::topology
