#include "ucx_options.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "baton/common/units.h"
#include "commands.h"

namespace baton::cli {
namespace {

// A bad option value, reported like CLI11's own parse errors (exit code 2).
class BadValue : public CLI::ParseError {
 public:
  explicit BadValue(std::string message) : ParseError("BadValue", std::move(message), 2) {}
};

}  // namespace

std::vector<const CLI::Option*> add_ucx_options(CLI::App& app, transport::UcxConfig& ucx) {
  std::vector<const CLI::Option*> added;
  added.push_back(app.add_option("--ucx-tls", ucx.tls, "UCX_TLS for this engine and a spawned peer (e.g. tcp); empty: UCX's default"));
  added.push_back(app.add_option("--lanes", ucx.lanes_per_peer, "UCP endpoints per peer")->check(CLI::Range(1, 64)));
  added.push_back(app.add_option("--nics", ucx.nics,
                 "NICs to carry slices, one UCP context each (eth1,eth2 or mlx5_0:1,...): lane i on NIC i mod N, "
                 "paired by order with the peer's; a NIC that fails hands its lanes to the others; auto: the "
                 "topology's NICs, NUMA-local (default: UCX's choice)")
      ->delimiter(','));
  added.push_back(app.add_flag("--peer-failure-detection,!--no-peer-failure-detection", ucx.peer_failure_detection,
               "Report a dead peer as unavailable (default on: UCX then uses TCP here; off lets it pick shared memory)"));
  added.push_back(app.add_flag("--same-host-copy,!--no-same-host-copy", ucx.same_host_copy,
               "Copy to and from peers of this host directly (memfd mapping or CMA) instead of through UCX "
               "(default on; off: the UCX transports carry same-host bytes too)"));
  added.push_back(app.add_option_function<std::string>(
         "--direct-copy-max",
         [&ucx](const std::string& text) {
           auto bytes = parse_size(text);
           if (!bytes) throw BadValue("--direct-copy-max: " + bytes.error().message());
           ucx.direct_copy_max_bytes = *bytes;
         },
         "Copy same-host batches of at most this size on the submitting thread, larger ones on the engine's "
         "copier thread, without the loop, while the loop holds no request (size; 0: always through the loop; "
         "default 16MiB)"));
  added.push_back(app.add_option_function<std::string>(
         "--tcp-receive-buffer",
         [&ucx](const std::string& text) {
           auto bytes = parse_size(text);
           if (!bytes) throw BadValue("--tcp-receive-buffer: " + bytes.error().message());
           if (*bytes != 0 && (*bytes < transport::kMinTcpReceiveBufferBytes || *bytes > transport::kMaxTcpReceiveBufferBytes)) {
             throw BadValue(fmt::format("--tcp-receive-buffer {}: expected 0 (the kernel's autotuning) or {} .. {}", text,
                                        format_size(transport::kMinTcpReceiveBufferBytes),
                                        format_size(transport::kMaxTcpReceiveBufferBytes)));
           }
           ucx.tcp_receive_buffer_bytes = *bytes;
         },
         "SO_RCVBUF of UCX's TCP sockets (size; 0: the kernel's autotuning, also kept where "
         "net.core.rmem_max is lower; default 1MiB)"));
  added.push_back(app.add_option("--copy-threads", ucx.copy_threads,
                 "Datapath threads for same-host copies that take the loop (-1: one per 8 cores, at most 4, none "
                 "below 8 cores; 0: none)")
      ->check(CLI::Range(-1, 64)));
  added.push_back(app.add_option("--progress-threads", ucx.progress_threads,
                 "A datapath thread per NIC that progresses its UCP worker, pinned near the NIC (-1: on from 8 "
                 "cores; 0: off, the loop progresses; 1: on)")
      ->check(CLI::Range(-1, 1)));
  added.push_back(app.add_option_function<std::string>(
         "--stall-timeout",
         [&ucx](const std::string& text) {
           auto ns = text == "0" ? Result<TimeNs>(0) : parse_duration(text);  // "0": never, as the help says
           if (!ns) throw BadValue("--stall-timeout: " + ns.error().message());
           // Kept in ms: a shorter nonzero one would silently turn into "never".
           if (*ns > 0 && *ns < 1'000'000) throw BadValue("--stall-timeout " + text + ": below 1ms (0: never)");
           ucx.stall_timeout_ms = *ns / 1'000'000;
         },
         "Fail a path whose posted slices made no progress this long (duration; 0: never; default 10s)"));
  added.push_back(app.add_option("--token-file", ucx.secret_file,
                 "The deployment secret peers prove to each other (a chmod 600 file of 16..4096 bytes; default: "
                 "$BATON_TOKEN_FILE; none: loopback only)")
                     // A missing one is the caller's input: exit 2, as the rest.
                     ->check(CLI::Validator(
                         [](std::string& path) { return path.empty() ? "an empty value" : CLI::ExistingFile(path); },
                         "FILE")));
  added.push_back(app.add_flag("--allow-unauthenticated", ucx.allow_unauthenticated,
               "Listen beyond loopback without a secret: any host that reaches the port becomes a peer"));
  return added;
}

std::vector<std::string> serve_args(std::uint64_t buffer_bytes, const transport::UcxConfig& ucx) {
  std::vector<std::string> args{"--buffer-size", std::to_string(buffer_bytes), "--lanes",
                                std::to_string(ucx.lanes_per_peer)};
  if (!ucx.tls.empty()) args.insert(args.end(), {"--ucx-tls", ucx.tls});
  if (!ucx.nics.empty()) args.insert(args.end(), {"--nics", fmt::format("{}", fmt::join(ucx.nics, ","))});
  if (!ucx.peer_failure_detection) args.emplace_back("--no-peer-failure-detection");
  if (!ucx.same_host_copy) args.emplace_back("--no-same-host-copy");
  if (ucx.tcp_receive_buffer_bytes != transport::UcxConfig{}.tcp_receive_buffer_bytes) {
    args.insert(args.end(), {"--tcp-receive-buffer", std::to_string(ucx.tcp_receive_buffer_bytes)});
  }
  if (ucx.copy_threads != transport::UcxConfig{}.copy_threads) {
    args.insert(args.end(), {"--copy-threads", std::to_string(ucx.copy_threads)});
  }
  if (ucx.progress_threads != transport::UcxConfig{}.progress_threads) {
    args.insert(args.end(), {"--progress-threads", std::to_string(ucx.progress_threads)});
  }
  args.insert(args.end(), {"--stall-timeout", std::to_string(ucx.stall_timeout_ms) + "ms"});
  if (!ucx.secret_file.empty()) args.insert(args.end(), {"--token-file", ucx.secret_file});
  if (ucx.allow_unauthenticated) args.emplace_back("--allow-unauthenticated");
  return args;
}

Result<SpawnSecret> SpawnSecret::create(transport::UcxConfig& ucx) {
  // A memfd, not a file in /tmp: nothing is left behind however the run
  // ends (SIGTERM or SIGKILL included). It is inherited (no MFD_CLOEXEC), so
  // the child opens it by the same /proc/self/fd path as we do.
  const int fd = ::memfd_create("baton-secret", 0);
  if (fd < 0) return std::unexpected(Status::unavailable("cannot make a secret file: {}", std::strerror(errno)));
  SpawnSecret made(fd);
  if (::fchmod(fd, 0600) != 0) {
    return std::unexpected(Status::unavailable("cannot make the secret file private: {}", std::strerror(errno)));
  }
  std::random_device entropy;
  std::string secret;
  for (int i = 0; i < 32; ++i) secret += fmt::format("{:02x}", entropy() & 0xff);
  if (::write(fd, secret.data(), secret.size()) != static_cast<ssize_t>(secret.size())) {
    return std::unexpected(Status::unavailable("cannot write the secret file: {}", std::strerror(errno)));
  }
  ucx.secret_file = fmt::format("/proc/self/fd/{}", fd);
  return made;
}

SpawnSecret::~SpawnSecret() {
  if (fd_ >= 0) ::close(fd_);
}

std::string PeerOptions::link() const {
  return fmt::format("ucx to {} (tls {})", target, ucx.tls.empty() ? "default" : ucx.tls);
}

void add_peer_options(CLI::App& app, PeerOptions& peer) {
  app.add_option("--transport", peer.transport, "sim (virtual clock, the default) or ucx (real loopback transfers)");
  app.add_option("--target", peer.target, "ucx: a running `baton serve` (host:port)")->check(kHostPort);
  app.add_flag("--spawn", peer.spawn, "ucx: start a `baton serve` child on 127.0.0.1 and use it");
  peer.ucx_options = add_ucx_options(app, peer.ucx);
}

namespace {

// The first option of `options` given on the command line, by every name
// ("--a / --no-a", without CLI11's "{false}" markers); empty if none was.
std::string first_given(const std::vector<const CLI::Option*>& options) {
  for (const CLI::Option* o : options) {
    if (o->count() == 0) continue;
    std::vector<std::string> names;
    for (std::string name : CLI::detail::split(o->get_name(false, true), ',')) {
      names.push_back(name.substr(0, name.find('{')));
    }
    return fmt::format("{}", fmt::join(names, " / "));
  }
  return {};
}

}  // namespace

Status check_peer(const PeerOptions& peer) {
  if (peer.transport != "sim" && peer.transport != "ucx") {
    return Status::invalid_argument("--transport \"{}\": expected sim or ucx", peer.transport);
  }
  if (peer.real()) {
    if (peer.spawn == !peer.target.empty()) {
      return Status::invalid_argument("--transport ucx needs one of --target and --spawn");
    }
    if (std::string name = first_given(peer.sim_only); !name.empty()) {
      return Status::invalid_argument("{} is for the simulated link; --transport ucx measures the real one", name);
    }
    return Status::ok();
  }
  if (peer.spawn || !peer.target.empty()) return Status::invalid_argument("--spawn and --target need --transport ucx");
  std::string name = first_given(peer.ucx_options);
  if (name.empty()) name = first_given(peer.ucx_only);
  if (!name.empty()) {
    return Status::invalid_argument("{} needs --transport ucx (the simulator moves no bytes and would ignore it)", name);
  }
  return Status::ok();
}

Result<std::optional<ServeChild>> resolve_peer(PeerOptions& peer, std::uint64_t buffer_bytes) {
  if (Status s = check_peer(peer); !s.is_ok()) return std::unexpected(s);
  if (!peer.real() || !peer.spawn) return std::optional<ServeChild>{};
  auto started = ServeChild::start(serve_args(buffer_bytes, peer.ucx));
  if (!started) return std::unexpected(started.error());
  peer.target = started->address();
  return std::optional<ServeChild>(std::move(*started));
}

}  // namespace baton::cli
