// probe_machine: the sources tried in order, and how their facts are merged.
// GPU facts come from the richest source that answers (NVML, then CUDA, then
// the nvidia-smi command); the host (NUMA nodes, CPUs, NICs, PCIe tree) comes
// from hwloc. Every source that did not answer leaves a note.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
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

// Runs `program args…` with stdout and stderr into one pipe, bounded: a
// wedged driver holds nvidia-smi in the kernel for minutes, and a broken one
// may print without end. Past `timeout` or `max_bytes` the child's process
// group is killed and reaped; it also dies with the thread that started it
// (PR_SET_PDEATHSIG), so a killed caller leaves no nvidia-smi behind.
Result<std::string> run_bounded(const std::string& program, const std::vector<std::string>& args,
                                std::chrono::milliseconds timeout, std::size_t max_bytes) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return std::unexpected(Status::unavailable("{}: pipe: {}", program, strerror(errno)));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return std::unexpected(Status::unavailable("{}: fork: {}", program, strerror(errno)));
  }
  if (pid == 0) {  // only async-signal-safe calls until exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // a caller's blocked SIGTERM is not the command's
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
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
  for (;;) {  // its output ended; it still has until the deadline to exit
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) break;
    if (!failure.empty() || left_ms() == 0) {
      if (failure.empty()) failure = fmt::format("no exit within {} ms (a wedged driver?)", timeout.count());
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!failure.empty()) return std::unexpected(Status::unavailable("{}: {}", program, failure));
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
