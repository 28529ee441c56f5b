#include "baton/store/service.h"

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "baton/common/log.h"
#include "baton/common/utf8.h"
#include "baton/common/socket_address.h"
#include "baton/plan/wire.h"
#include "baton/store.grpc.pb.h"  // generated (proto/baton/store.proto)

namespace baton::store {
namespace {

// How long a cancelled batch may take to end before its memory is given up:
// a cancelling request ends once nothing it posted can land (the stall
// timeout, 10 s by default, bounds a silent peer).
constexpr TimeNs kDrainTimeoutNs = 10'000'000'000;

namespace wire = baton::store::wire;

// The Status travels whole: gRPC's code for other clients, ours (its
// snake_case name) in the details for StoreClient.
grpc::Status to_grpc(const Status& s) {
  if (s.is_ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (s.code()) {
    case StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case StatusCode::kAlreadyExists: code = grpc::StatusCode::ALREADY_EXISTS; break;
    case StatusCode::kOutOfRange: code = grpc::StatusCode::OUT_OF_RANGE; break;
    case StatusCode::kTimeout: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case StatusCode::kCancelled: code = grpc::StatusCode::CANCELLED; break;
    case StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case StatusCode::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case StatusCode::kDeadlineInfeasible:
    case StatusCode::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case StatusCode::kPermissionDenied: code = grpc::StatusCode::PERMISSION_DENIED; break;
    case StatusCode::kInternal: code = grpc::StatusCode::INTERNAL; break;
    case StatusCode::kOk: break;
  }
  return {code, s.message(), std::string(to_string(s.code()))};
}

// gRPC writes its own errors to stderr in a multi-line format of its own;
// ours already say what failed (a Status), so its lines go to our log at
// debug (BATON_LOG_LEVEL=debug shows them). Protobuf's too: a request whose
// string field is not UTF-8 wrote a line to stderr each, whatever the log
// level (5000 lines in 0.8 s from one client).
void route_grpc_log() {
  static std::once_flag once;
  std::call_once(once, [] {
    gpr_set_log_function([](gpr_log_func_args* args) {
      baton::logger().debug("grpc {}:{}: {}", args->file, args->line, args->message);
    });
    // A fatal one still ends the process; its reason stays visible.
    google::protobuf::SetLogHandler(
        [](google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
          baton::logger().log(level == google::protobuf::LOGLEVEL_FATAL ? spdlog::level::err : spdlog::level::debug,
                              "protobuf {}:{}: {}", file, line, message);
        });
  });
}

// Why binding `host:port` fails, asked of the kernel: gRPC only says that
// no address was added.
std::string bind_error(const SocketAddress& address) {
  std::string why;
  const int fd = ::socket(address.get()->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  if (fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 &&
      ::bind(fd, address.get(), address.length) != 0) {
    why = std::strerror(errno);
  }
  if (fd >= 0) ::close(fd);
  return why;
}

Status from_grpc(const grpc::Status& s, const char* call) {
  if (s.ok()) return Status::ok();
  if (auto c = status_code_from_string(s.error_details()); c && *c != StatusCode::kOk) {
    return Status(*c, s.error_message());
  }
  // Not our server's answer: the channel's own (no server, a deadline, a
  // message over gRPC's size limit, which is no sign of a dead store).
  const StatusCode code = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED    ? StatusCode::kTimeout
                          : s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? StatusCode::kResourceExhausted
                                                                                   : StatusCode::kUnavailable;
  return Status(code, fmt::format("{}: {} (gRPC code {})", call, s.error_message(), static_cast<int>(s.error_code())));
}

// Blocks one call names, at most: its messages stay under gRPC's 4 MiB
// (65536 pages answered by AllocateBlocks are about 3 MiB). A put of 300 000
// blocks had the store allocate them all, then failed to read the answer
// (unavailable), leaving every page unsealed for a minute.
constexpr std::size_t kMaxBlocksPerCall = std::size_t{1} << 16;

// What a proto string field may carry: UTF-8. Other bytes failed in
// protobuf's serializer as an empty INTERNAL error, reported as a dead
// store (unavailable), which a caller would fail over from.
Status check_text(const char* call, const char* what, std::string_view text) {
  const auto bad = first_non_utf8(text);
  if (!bad) return Status::ok();
  return Status::invalid_argument("{}: the {} is not UTF-8 (byte {:#04x} at {})", call, what,
                                  static_cast<unsigned char>(text[*bad]), *bad);
}

Status check_count(const char* call, std::size_t blocks) {
  if (blocks <= kMaxBlocksPerCall) return Status::ok();
  return Status::invalid_argument("{}: {} blocks in one call (at most {}: split the list)", call, blocks,
                                  kMaxBlocksPerCall);
}

std::span<const std::uint64_t> span(const google::protobuf::RepeatedField<std::uint64_t>& f) {
  return {f.data(), static_cast<std::size_t>(f.size())};
}

BlockLayout from_wire(const wire::BlockLayout& l) { return {l.slots(), l.segments(), l.segment_bytes()}; }

void to_wire(const BlockLayout& l, wire::BlockLayout* out) {
  out->set_slots(l.slots);
  out->set_segments(l.segments);
  out->set_segment_bytes(l.segment_bytes);
}

class Service final : public wire::Store::Service {
 public:
  Service(BlockStore& store, engine::Engine& engine) : store_(store), engine_(engine) {}

  grpc::Status Hello(grpc::ServerContext*, const wire::HelloRequest*, wire::HelloReply* reply) override {
    reply->set_engine_address(engine_.address());
    for (const auto& [name, layout] : store_.namespaces()) {
      auto* ns = reply->add_namespaces();
      ns->set_name(name);
      to_wire(layout, ns->mutable_layout());
    }
    return grpc::Status::OK;
  }

  grpc::Status AllocateBlocks(grpc::ServerContext*, const wire::AllocateBlocksRequest* r,
                              wire::AllocateBlocksReply* reply) override {
    // Checked here too: a client of the proto that is not ours asked for a
    // million pages, evicting every sealed block, and got no answer (25 MB).
    if (Status s = check_count("AllocateBlocks", r->count()); !s.is_ok()) return to_grpc(s);
    auto pages = store_.allocate_blocks(r->namespace_(), r->count(), r->producer(), engine_.now_ns());
    if (!pages) return to_grpc(pages.error());
    for (const BlockPage& p : *pages) {
      auto* out = reply->add_pages();
      out->set_page(p.page);
      out->set_region(p.region);
      out->set_offset(p.offset);
      out->set_address(p.address);
      out->set_numa(p.numa);
    }
    return grpc::Status::OK;
  }

  grpc::Status Seal(grpc::ServerContext*, const wire::SealRequest* r, wire::SealReply*) override {
    const auto listed = static_cast<std::size_t>(std::max(r->pages_size(), r->hashes_size()));
    if (Status s = check_count("Seal", listed); !s.is_ok()) return to_grpc(s);
    return to_grpc(store_.seal(r->namespace_(), r->producer(), span(r->pages()), span(r->hashes()),
                               from_wire(r->layout())));
  }

  grpc::Status QueryBlocksForTransfer(grpc::ServerContext*, const wire::QueryBlocksForTransferRequest* r,
                                      wire::QueryBlocksForTransferReply* reply) override {
    if (Status s = check_count("QueryBlocksForTransfer", r->hashes_size()); !s.is_ok()) return to_grpc(s);
    auto answer = store_.query(r->namespace_(), span(r->hashes()), r->requester(), engine_.now_ns());
    if (!answer) return to_grpc(answer.error());
    reply->set_found(answer->found);
    reply->set_plan(std::move(answer->plan));
    reply->set_session(answer->session);
    return grpc::Status::OK;
  }

  grpc::Status Stats(grpc::ServerContext*, const wire::StatsRequest*, wire::StatsReply* reply) override {
    const StoreStats s = store_.stats();
    reply->set_blocks(s.blocks);
    reply->set_bytes(s.bytes);
    reply->set_unsealed(s.unsealed);
    reply->set_free_pages(s.free_pages);
    reply->set_sessions(s.sessions);
    reply->set_locked_blocks(s.locked_blocks);
    reply->set_evictions(s.evictions);
    reply->set_expired_locks(s.expired_locks);
    reply->set_reclaimed_pages(s.reclaimed_pages);
    reply->set_hashes_asked(s.hashes_asked);
    reply->set_hashes_found(s.hashes_found);
    return grpc::Status::OK;
  }

  grpc::Status ReleaseTransferLock(grpc::ServerContext*, const wire::ReleaseTransferLockRequest* r,
                                   wire::ReleaseTransferLockReply*) override {
    return to_grpc(store_.release(r->session()));
  }

 private:
  BlockStore& store_;
  engine::Engine& engine_;
};

}  // namespace

struct StoreServer::State {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  std::thread collector;
};

StoreServer::StoreServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

StoreServer::~StoreServer() {
  // In-flight calls get a moment to finish; without a deadline gRPC's sync
  // server waits seconds on its idle pollers.
  state_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->collector.join();
}

std::string StoreServer::address() const { return state_->address; }

Result<std::unique_ptr<StoreServer>> StoreServer::start(BlockStore& store, engine::Engine& engine,
                                                        ServerConfig config) {
  // gRPC takes a port modulo 65536 and logs its own errors for the rest.
  auto address = parse_socket_address(config.listen);
  if (!address) return std::unexpected(Status(address.error().code(), "store: listen: " + address.error().message()));
  // Until the store proves the deployment secret as the engine does, it
  // serves this host only.
  if (!is_loopback(address->get())) {
    return std::unexpected(Status::invalid_argument(
        "store: listen \"{}\": the store serves loopback only (127.0.0.1:PORT) until its RPCs are authenticated",
        config.listen));
  }
  if (config.collect_every_ns <= 0) {
    return std::unexpected(Status::invalid_argument("store: collect_every {} ns (expected above 0)",
                                                    config.collect_every_ns));
  }
  auto state = std::make_unique<State>();
  state->service = std::make_unique<Service>(store, engine);
  route_grpc_log();
  grpc::ServerBuilder builder;
  int port = 0;
  // gRPC sets SO_REUSEPORT by default: a second store on the same port
  // would start and silently take half the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // What one client may hold here (the port is unauthenticated): partial
  // requests' buffers were kept without bound (60 connections of one ~4 MiB
  // message short of its last byte: 33 → 285 MB), and so were streams per
  // connection and idle connections.
  grpc::ResourceQuota quota("baton-store");
  quota.Resize(std::size_t{256} << 20);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 64);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 60'000);
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(state->service.get());
  state->server = builder.BuildAndStart();
  if (!state->server || port == 0) {
    const std::string why = bind_error(*address);
    return std::unexpected(Status::unavailable("store: cannot listen on {}{}", config.listen, why.empty() ? "" : ": " + why));
  }
  // The host as the caller wrote it (brackets kept), with the port bound.
  state->address = fmt::format("{}:{}", config.listen.substr(0, config.listen.rfind(':')), port);
  State* raw = state.get();
  state->collector = std::thread([raw, &store, &engine, every = config.collect_every_ns] {
    std::unique_lock lock(raw->mutex);
    while (!raw->stop) {
      raw->cv.wait_for(lock, std::chrono::nanoseconds(every));
      if (raw->stop) break;
      lock.unlock();
      store.tick(engine.now_ns());
      lock.lock();
    }
  });
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(state)));
}

// Registered slabs between fetches, by (engine, NUMA node, bytes). Shared
// with the slabs a caller still holds, which come back when released.
struct SlabCache {
  static constexpr std::size_t kMaxFreeSlabs = 8;
  struct Slab {
    engine::Engine* engine;
    engine::RegionHandle handle;
    plan::SlabMemory memory;
  };
  std::mutex mutex;
  std::vector<std::shared_ptr<Slab>> free;
  bool closed = false;  // the client is gone: slabs coming back are dropped

  std::shared_ptr<Slab> take(engine::Engine* e, int numa, std::uint64_t bytes) {
    std::lock_guard lock(mutex);
    for (auto it = free.begin(); it != free.end(); ++it) {
      if ((*it)->engine == e && (*it)->memory.numa() == numa && (*it)->memory.bytes() == bytes) {
        auto slab = std::move(*it);
        free.erase(it);
        return slab;
      }
    }
    return nullptr;
  }
  void give_back(const std::shared_ptr<Slab>& slab) {
    std::lock_guard lock(mutex);
    if (closed) {
      (void)slab->engine->unregister(slab->handle);
      return;
    }
    free.push_back(slab);
    // Fetches of many sizes (prefixes of 1..n blocks) kept one slab per
    // size for good (prefixes of 1..100 blocks of 2.25 MiB: 11 GiB). The
    // oldest go beyond kMaxFreeSlabs.
    while (free.size() > kMaxFreeSlabs) {
      (void)free.front()->engine->unregister(free.front()->handle);
      free.erase(free.begin());
    }
  }
  void close() {
    std::lock_guard lock(mutex);
    closed = true;
    for (auto& slab : free) (void)slab->engine->unregister(slab->handle);
    free.clear();
  }
};

// The end of the fetch() this thread is in, if any (see State::deadline).
thread_local std::optional<std::chrono::steady_clock::time_point> t_fetch_until;

struct StoreClient::State {
  std::unique_ptr<wire::Store::Stub> stub;
  std::shared_ptr<SlabCache> slabs = std::make_shared<SlabCache>();
  TimeNs timeout_ns = 0;
  // What hello() last said, shared by the threads using this client (a
  // router hands one client to all of them).
  std::mutex said_mutex;
  std::string engine_address;  // the store's
  std::map<std::string, BlockLayout> layouts;  // its namespaces'

  // A call's deadline: the client's call timeout, cut to what is left of
  // the fetch this thread is in (a fetch of 2 s against a stopped store
  // took the 10 s call timeout), but never below kLeastCallNs: a query the
  // store answers after the client gave up leaves its lock held until the
  // lock timeout (with the fetch's 20 us, 16 of 150 cut fetches did). A
  // lock's release is never cut short.
  static constexpr TimeNs kLeastCallNs = 1'000'000'000;
  void deadline(grpc::ClientContext& context, bool within_fetch = true) const {
    TimeNs bound = std::min(timeout_ns, kForeverNs);
    if (within_fetch && t_fetch_until.has_value()) {
      const auto left = *t_fetch_until - std::chrono::steady_clock::now();
      bound = std::clamp<TimeNs>(std::chrono::duration_cast<std::chrono::nanoseconds>(left).count(),
                                 std::min(kLeastCallNs, bound), bound);
    }
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::nanoseconds(bound));
  }
};

StoreClient::StoreClient(std::unique_ptr<State> state) : state_(std::move(state)) {}
StoreClient::~StoreClient() { state_->slabs->close(); }

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& address, TimeNs call_timeout_ns) {
  if (address.empty() || call_timeout_ns <= 0) {
    return std::unexpected(Status::invalid_argument("StoreClient: address \"{}\", call timeout {} ns", address,
                                                    call_timeout_ns));
  }
  route_grpc_log();
  auto state = std::make_unique<State>();
  // The store is on loopback: trying it again costs nothing, while gRPC's
  // default backoff (1 s, growing to 120 s) kept a client failing for
  // seconds after a store restarted on its address was back (5.9 s after 4 s
  // away).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  state->stub = wire::Store::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  state->timeout_ns = call_timeout_ns;
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(state)));
}

Result<std::pair<std::string, std::vector<NamespaceInfo>>> StoreClient::hello() {
  grpc::ClientContext context;
  state_->deadline(context);
  wire::HelloReply reply;
  if (auto s = from_grpc(state_->stub->Hello(&context, {}, &reply), "Hello"); !s.is_ok()) return std::unexpected(s);
  std::vector<NamespaceInfo> namespaces;
  for (const auto& ns : reply.namespaces()) namespaces.push_back({ns.name(), from_wire(ns.layout())});
  return std::make_pair(reply.engine_address(), std::move(namespaces));
}

Result<std::vector<BlockPage>> StoreClient::allocate_blocks(const std::string& ns, std::uint32_t count,
                                                            const std::string& producer) {
  if (Status s = check_text("AllocateBlocks", "namespace", ns); !s.is_ok()) return std::unexpected(s);
  if (Status s = check_text("AllocateBlocks", "producer", producer); !s.is_ok()) return std::unexpected(s);
  if (Status s = check_count("AllocateBlocks", count); !s.is_ok()) return std::unexpected(s);
  grpc::ClientContext context;
  state_->deadline(context);
  wire::AllocateBlocksRequest request;
  request.set_namespace_(ns);
  request.set_count(count);
  request.set_producer(producer);
  wire::AllocateBlocksReply reply;
  if (auto s = from_grpc(state_->stub->AllocateBlocks(&context, request, &reply), "AllocateBlocks"); !s.is_ok()) {
    return std::unexpected(s);
  }
  std::vector<BlockPage> pages;
  for (const auto& p : reply.pages()) pages.push_back({p.page(), p.region(), p.offset(), p.address(), p.numa()});
  return pages;
}

Status StoreClient::seal(const std::string& ns, const std::string& producer, std::span<const std::uint64_t> pages,
                         std::span<const std::uint64_t> hashes, const BlockLayout& layout) {
  for (auto [what, text] : {std::pair{"namespace", std::string_view(ns)}, std::pair{"producer", std::string_view(producer)}}) {
    if (Status s = check_text("Seal", what, text); !s.is_ok()) return s;
  }
  if (Status s = check_count("Seal", std::max(pages.size(), hashes.size())); !s.is_ok()) return s;
  grpc::ClientContext context;
  state_->deadline(context);
  wire::SealRequest request;
  request.set_namespace_(ns);
  request.set_producer(producer);
  request.mutable_pages()->Add(pages.begin(), pages.end());
  request.mutable_hashes()->Add(hashes.begin(), hashes.end());
  to_wire(layout, request.mutable_layout());
  wire::SealReply reply;
  return from_grpc(state_->stub->Seal(&context, request, &reply), "Seal");
}

Result<QueryAnswer> StoreClient::query(const std::string& ns, std::span<const std::uint64_t> hashes,
                                       const std::string& requester) {
  for (auto [what, text] : {std::pair{"namespace", std::string_view(ns)}, std::pair{"requester", std::string_view(requester)}}) {
    if (Status s = check_text("QueryBlocksForTransfer", what, text); !s.is_ok()) return std::unexpected(s);
  }
  if (Status s = check_count("QueryBlocksForTransfer", hashes.size()); !s.is_ok()) return std::unexpected(s);
  grpc::ClientContext context;
  state_->deadline(context);
  wire::QueryBlocksForTransferRequest request;
  request.set_namespace_(ns);
  request.mutable_hashes()->Add(hashes.begin(), hashes.end());
  request.set_requester(requester);
  wire::QueryBlocksForTransferReply reply;
  if (auto s = from_grpc(state_->stub->QueryBlocksForTransfer(&context, request, &reply), "QueryBlocksForTransfer");
      !s.is_ok()) {
    return std::unexpected(s);
  }
  return QueryAnswer{reply.found(), std::move(*reply.mutable_plan()), reply.session()};
}

Result<StoreStats> StoreClient::stats() {
  grpc::ClientContext context;
  state_->deadline(context);
  wire::StatsReply r;
  if (auto s = from_grpc(state_->stub->Stats(&context, {}, &r), "Stats"); !s.is_ok()) return std::unexpected(s);
  return StoreStats{r.blocks(),         r.bytes(),          r.unsealed(),        r.free_pages(),
                    r.sessions(),       r.locked_blocks(),  r.evictions(),       r.expired_locks(),
                    r.reclaimed_pages(), r.hashes_asked(),  r.hashes_found()};
}

Status StoreClient::release(std::uint64_t session) {
  grpc::ClientContext context;
  state_->deadline(context, /*within_fetch=*/false);
  wire::ReleaseTransferLockRequest request;
  request.set_session(session);
  wire::ReleaseTransferLockReply reply;
  return from_grpc(state_->stub->ReleaseTransferLock(&context, request, &reply), "ReleaseTransferLock");
}

}  // namespace baton::store

namespace baton::store {

Result<RemoteRange> locate(std::span<const transport::RemoteRegion> regions, std::uint64_t address,
                           std::uint64_t length) {
  for (const auto& r : regions) {
    if (address >= r.base && length <= r.length && address - r.base <= r.length - length) {
      return RemoteRange{r.key, address - r.base};
    }
  }
  return std::unexpected(
      Status::not_found("{:#x}+{} lies in no region the peer exported to us ({} regions)", address, length,
                        regions.size()));
}

Result<engine::Peer> StoreClient::store_peer(engine::Engine& engine) {
  std::string known;
  {
    std::lock_guard lock(state_->said_mutex);
    known = state_->engine_address;
  }
  if (!known.empty()) {
    auto peer = engine.connect(known);
    if (peer) return peer;
  }
  // First use, or the store's engine is no longer where it was: a store
  // restarted on the same RPC address has a new engine port, and every
  // put and fetch failed for good against the old one. Asked again.
  auto h = hello();
  if (!h) return std::unexpected(h.error());
  {
    std::lock_guard lock(state_->said_mutex);
    state_->engine_address = h->first;
    state_->layouts.clear();
    for (const NamespaceInfo& n : h->second) state_->layouts[n.name] = n.layout;
  }
  return engine.connect(h->first);
}

Status StoreClient::put(engine::Engine& engine, const std::string& ns, const std::string& producer,
                        std::span<const std::uint64_t> hashes, const BlockLayout& layout, engine::RegionHandle local,
                        std::uint64_t local_offset, TimeNs timeout_ns) {
  const std::uint64_t block_bytes = layout.block_bytes();
  return put_blocks(engine, ns, producer, hashes, layout, local,
                    [&](std::size_t b) { return local_offset + b * block_bytes; }, timeout_ns);
}

Status StoreClient::put(engine::Engine& engine, const std::string& ns, const std::string& producer,
                        std::span<const std::uint64_t> hashes, const BlockLayout& layout, engine::RegionHandle local,
                        std::span<const std::uint64_t> local_offsets, TimeNs timeout_ns) {
  if (local_offsets.size() != hashes.size()) {
    return Status::invalid_argument("put: {} local offsets for {} hashes (expected one per hash)",
                                    local_offsets.size(), hashes.size());
  }
  return put_blocks(engine, ns, producer, hashes, layout, local, [&](std::size_t b) { return local_offsets[b]; },
                    timeout_ns);
}

Status StoreClient::put_blocks(engine::Engine& engine, const std::string& ns, const std::string& producer,
                               std::span<const std::uint64_t> hashes, const BlockLayout& layout,
                               engine::RegionHandle local, const std::function<std::uint64_t(std::size_t)>& offset_of,
                               TimeNs timeout_ns) {
  if (hashes.empty() || hashes.size() > std::numeric_limits<std::uint32_t>::max() || timeout_ns <= 0) {
    return Status::invalid_argument("put: {} blocks, timeout {} ns (expected at least one block and a timeout above 0)",
                                    hashes.size(), timeout_ns);
  }
  if (Status s = layout.validate(); !s.is_ok()) return s;
  if (Status s = check_count("put", hashes.size()); !s.is_ok()) return s;
  for (auto [what, text] : {std::pair{"namespace", std::string_view(ns)}, std::pair{"producer", std::string_view(producer)}}) {
    if (Status s = check_text("put", what, text); !s.is_ok()) return s;
  }
  // A hash named twice fails at seal, after the store allocated a page for
  // each (evicting good blocks to make room): refused first.
  std::vector<std::uint64_t> sorted(hashes.begin(), hashes.end());
  std::ranges::sort(sorted);
  if (auto twice = std::ranges::adjacent_find(sorted); twice != sorted.end()) {
    return Status::invalid_argument("put {}: hash {:#x} is named twice (nothing allocated or written)", ns, *twice);
  }
  // Checked before anything is written: seal() checks it too, but only after
  // the writes, and a block larger than the namespace's spills into the
  // pages after it — another producer's sealed blocks.
  std::optional<BlockLayout> want;
  {
    std::lock_guard lock(state_->said_mutex);
    if (auto it = state_->layouts.find(ns); it != state_->layouts.end()) want = it->second;
  }
  if (!want) {  // a namespace added since the last hello()
    auto h = hello();
    if (!h) return h.error();
    std::lock_guard lock(state_->said_mutex);
    for (const NamespaceInfo& n : h->second) state_->layouts[n.name] = n.layout;
    if (auto it = state_->layouts.find(ns); it != state_->layouts.end()) want = it->second;
  }
  if (!want) return Status::not_found("put: the store has no namespace \"{}\"", ns);
  if (*want != layout) {
    return Status::invalid_argument(
        "put {}: layout {} slots × {} segments × {} bytes, the namespace's is {} × {} × {} (nothing written)", ns,
        layout.slots, layout.segments, layout.segment_bytes, want->slots, want->segments, want->segment_bytes);
  }
  // Our own ranges too: the store evicts good blocks to allocate pages for
  // a put, so a put that can only fail on this side must fail first.
  auto region = engine.region(local);
  if (!region) return Status(region.error().code(), fmt::format("put {}: {} (nothing allocated)", ns,
                                                                 region.error().message()));
  const std::uint64_t block_bytes = layout.block_bytes();
  for (std::size_t b = 0; b < hashes.size(); ++b) {
    const std::uint64_t at = offset_of(b);
    if (at > region->length || block_bytes > region->length - at) {
      return Status::out_of_range("put {}: block {} at local offset {} + {} bytes is outside region {} ({} bytes; "
                                  "nothing allocated)",
                                  ns, b, at, block_bytes, local, region->length);
    }
  }
  auto peer = store_peer(engine);
  if (!peer) return peer.error();
  auto pages = allocate_blocks(ns, static_cast<std::uint32_t>(hashes.size()), producer);
  if (!pages) return pages.error();
  // One page per block, or the writes below would read past our blocks
  // (more pages) or leave some unwritten (fewer): nothing is written.
  if (pages->size() != hashes.size()) {
    return Status::unavailable("put {}: the store answered {} pages for {} blocks (nothing written)", ns,
                               pages->size(), hashes.size());
  }
  engine::Batch writes;
  std::vector<std::uint64_t> ids;
  for (std::size_t b = 0; b < pages->size(); ++b) {
    const BlockPage& page = (*pages)[b];
    writes.requests.push_back({.op = engine::Op::kWrite, .local_region = local,
                               .local_offset = offset_of(b), .peer = peer->address,
                               .remote_region = page.region, .remote_offset = page.offset, .length = block_bytes,
                               .timeout_ns = timeout_ns});
    ids.push_back(page.page);
  }
  // The pages may lie in a region exported after we connected.
  if (Status s = engine.refresh(*peer); !s.is_ok()) return s;
  auto h = engine.submit(writes);
  if (!h) return h.error();
  Status written = engine.wait(*h, timeout_ns);
  if (written.is_ok()) {
    auto st = engine.poll(*h);
    written = st ? st->status : st.error();
  } else {
    (void)engine.cancel(*h);
    (void)engine.wait(*h, kDrainTimeoutNs);  // the cancel's own bound, not the caller's
  }
  (void)engine.release(*h);
  if (!written.is_ok()) return written;
  return seal(ns, producer, ids, hashes, layout);
}

Result<FetchedBlocks> StoreClient::fetch(engine::Engine& engine, const std::string& ns,
                                         std::span<const std::uint64_t> hashes, const std::string& requester,
                                         const FetchOptions& options) {
  if (options.timeout_ns <= 0 || options.deadline_ns < 0) {
    return std::unexpected(Status::invalid_argument("fetch: timeout {} ns, deadline {} ns (expected a timeout above 0 "
                                                    "and a deadline not below 0)",
                                                    options.timeout_ns, options.deadline_ns));
  }
  const TimeNs deadline = options.deadline_ns > 0 ? engine.now_ns() + options.deadline_ns : 0;
  // The RPCs below end within the fetch's timeout too (State::deadline).
  struct Bound {
    explicit Bound(TimeNs timeout_ns) {
      t_fetch_until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(std::min(timeout_ns, kForeverNs));
    }
    ~Bound() { t_fetch_until.reset(); }
  } bound{options.timeout_ns};
  auto peer = store_peer(engine);
  if (!peer) return std::unexpected(peer.error());
  auto answer = query(ns, hashes, requester);
  if (!answer) return std::unexpected(answer.error());
  FetchedBlocks out;
  out.found = answer->found;
  out.plan_wire_bytes = answer->plan.size();
  if (answer->found == 0) return out;
  // From here the lock is ours: every path below releases it.
  struct Lock {
    StoreClient& client;
    std::uint64_t session;
    ~Lock() { (void)client.release(session); }
  } lock{*this, answer->session};
  auto plan = plan::parse_plan(answer->plan);
  if (!plan) return std::unexpected(plan.error());
  // The plan must be for the prefix asked, in its order: a caller reads
  // block b of the answer as hashes[b]'s KV, and indexes up to `found`.
  if (answer->found > hashes.size() || plan->blocks != answer->found) {
    return std::unexpected(Status::unavailable("fetch {}: the store found {} of {} hashes with a plan of {} blocks", ns,
                                               answer->found, hashes.size(), plan->blocks));
  }
  if (!plan->block_hashes.empty() && !std::ranges::equal(plan->block_hashes, hashes.first(answer->found))) {
    return std::unexpected(
        Status::unavailable("fetch {}: the store's plan is for other blocks than the {} asked for", ns, answer->found));
  }
  auto ops = plan::materialize(*plan, engine.topology(), options.materialize);
  if (!ops) return std::unexpected(ops.error());
  // Every op inside memory the store exported, before any slab is made: the
  // slabs then hold at most what the store has (a 60-byte plan named 64 TiB).
  auto regions = engine.remote_regions(*peer);
  if (!regions) return std::unexpected(regions.error());
  std::vector<RemoteRange> sources;
  sources.reserve(ops->ops.size());
  for (const plan::TransferOp& op : ops->ops) {
    auto in = locate(*regions, op.remote_address, op.length);
    if (!in) return std::unexpected(Status::not_found("fetch: {}", in.error().message()));
    sources.push_back(*in);
  }
  // Slabs the engine can read into: allocated by plan/ and registered once,
  // then kept (SlabCache) for the next fetch, so a fetch costs neither page
  // faults nor a registration after the first.
  std::map<std::byte*, engine::RegionHandle> slab_regions;  // by slab address
  std::shared_ptr<SlabCache> cache = state_->slabs;
  engine::Engine* e = &engine;
  auto abandoned = std::make_shared<bool>(false);  // set when reads may still land in the slabs
  plan::Rebuilder rebuilder([e, cache, abandoned, &slab_regions](int numa, std::uint64_t bytes) -> Result<plan::SlabMemory> {
    std::shared_ptr<SlabCache::Slab> slab = cache->take(e, numa, bytes);
    if (!slab) {
      auto memory = plan::allocate_slab(numa, bytes);
      if (!memory) return std::unexpected(memory.error());
      auto region = e->register_memory(memory->data(), memory->bytes(), engine::MemoryKind::kDram, numa);
      if (!region) return std::unexpected(region.error());
      slab = std::make_shared<SlabCache::Slab>(SlabCache::Slab{e, region->handle, std::move(*memory)});
    }
    slab_regions[slab->memory.data()] = slab->handle;
    return plan::SlabMemory(slab->memory.data(), bytes, numa, slab->memory.bound(),
                            [cache, slab, abandoned](std::byte*, std::uint64_t) {
                              if (*abandoned) {
                                new std::shared_ptr<SlabCache::Slab>(slab);  // kept: a late read may land
                                return;
                              }
                              cache->give_back(slab);
                            });
  });
  auto rebuilt = rebuilder.rebuild(*plan);
  if (!rebuilt) return std::unexpected(rebuilt.error());
  engine::Batch batch;
  for (std::size_t i = 0; i < ops->ops.size(); ++i) {
    const plan::TransferOp& op = ops->ops[i];
    const RemoteRange& in = sources[i];
    engine::Request r;
    r.op = engine::Op::kRead;
    r.local_region = slab_regions.at(rebuilt->slabs()[op.slab].data());
    r.local_offset = op.slab_offset;
    r.peer = peer->address;
    r.remote_region = in.region;
    r.remote_offset = in.offset;
    r.length = op.length;
    r.qos = options.qos;
    r.timeout_ns = options.timeout_ns;
    r.deadline_ns = deadline;
    batch.requests.push_back(std::move(r));
    out.bytes += op.length;
  }
  auto handle = engine.submit(batch);
  if (!handle) return std::unexpected(handle.error());
  Status waited = engine.wait(*handle, options.timeout_ns);
  if (waited.is_ok()) {
    auto st = engine.poll(*handle);
    waited = st ? st->status : st.error();
  } else {
    // Nothing may still land in the slabs once we give them back: the cancel
    // is waited for on its own bound (a caller's 20 us timeout left reads
    // cancelling while their slabs went back for the next fetch). Reads
    // that still did not end keep their slabs out of use for good.
    (void)engine.cancel(*handle);
    if (!engine.wait(*handle, kDrainTimeoutNs).is_ok()) {
      *abandoned = true;
      baton::logger().warn("StoreClient::fetch: reads still cancelling after {} s; their slabs are not reused",
                           kDrainTimeoutNs / 1'000'000'000);
    }
  }
  (void)engine.release(*handle);
  if (!waited.is_ok()) return std::unexpected(waited);
  out.blocks.emplace(std::move(*rebuilt));
  return out;
}

}  // namespace baton::store
