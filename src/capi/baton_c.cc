// The C ABI (include/baton/c/baton.h) over baton::engine::Engine. Every
// entry point checks its arguments, maps a Status to its code and keeps the
// message for baton_last_error(), and catches every exception.
//
// An engine handle is a number, never dereferenced: the registry maps it to
// the engine, so a destroyed or made-up handle is refused (BATON_MISUSE)
// instead of touched, and a call on another thread keeps the engine alive
// (shared_ptr) until it returns, even across baton_engine_destroy().
#include "baton/c/baton.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "baton/engine/engine.h"

namespace {

using baton::Status;
using baton::StatusCode;
using baton::TimeNs;
namespace engine = baton::engine;

static_assert(BATON_OK == static_cast<int>(StatusCode::kOk));
static_assert(BATON_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(BATON_NOT_FOUND == static_cast<int>(StatusCode::kNotFound));
static_assert(BATON_ALREADY_EXISTS == static_cast<int>(StatusCode::kAlreadyExists));
static_assert(BATON_OUT_OF_RANGE == static_cast<int>(StatusCode::kOutOfRange));
static_assert(BATON_TIMEOUT == static_cast<int>(StatusCode::kTimeout));
static_assert(BATON_CANCELLED == static_cast<int>(StatusCode::kCancelled));
static_assert(BATON_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable));
static_assert(BATON_DEADLINE_INFEASIBLE == static_cast<int>(StatusCode::kDeadlineInfeasible));
static_assert(BATON_RESOURCE_EXHAUSTED == static_cast<int>(StatusCode::kResourceExhausted));
static_assert(BATON_FAILED_PRECONDITION == static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(BATON_PERMISSION_DENIED == static_cast<int>(StatusCode::kPermissionDenied));
static_assert(BATON_INTERNAL == static_cast<int>(StatusCode::kInternal));
static_assert(BATON_MISUSE == BATON_INTERNAL + 1);
static_assert(BATON_OP_WRITE == static_cast<int>(baton::transport::Op::kWrite));
static_assert(BATON_OP_READ == static_cast<int>(baton::transport::Op::kRead));
static_assert(BATON_QOS_DECODE_CRITICAL == static_cast<int>(baton::sched::QosClass::kDecodeCritical));
static_assert(BATON_QOS_HOT_KV == static_cast<int>(baton::sched::QosClass::kHotKv));
static_assert(BATON_QOS_PREFILL_BULK == static_cast<int>(baton::sched::QosClass::kPrefillBulk));
static_assert(BATON_QOS_BACKGROUND == static_cast<int>(baton::sched::QosClass::kBackground));
static_assert(BATON_QOS_BACKGROUND + 1 == baton::sched::kQosClassCount);
static_assert(BATON_MEMORY_DRAM == static_cast<int>(baton::transport::MemoryKind::kDram));
static_assert(BATON_MEMORY_VRAM == static_cast<int>(baton::transport::MemoryKind::kVram));

// Relative times past this are clamped: steady_clock::now() plus them still
// fits in 64 bits (about 146 years).
constexpr TimeNs kMaxRelativeNs = std::numeric_limits<TimeNs>::max() / 2;
constexpr TimeNs kDefaultRefreshNs = 5'000'000'000;

// baton_engine_config sizes: the first layout's (up to `nics`), and the
// most a caller's struct may claim (this one is 64 bytes).
constexpr std::size_t kFirstConfigSize = offsetof(baton_engine_config, nics);
constexpr std::size_t kMaxConfigSize = 4096;

thread_local std::string last_error;

// Keeps `text` for baton_last_error() and returns `code`. Never throws: out
// of memory, the text is dropped.
int fail(int code, std::string_view text) noexcept {
  try {
    last_error.assign(text);
  } catch (...) {
    last_error.clear();
  }
  return code;
}

int fail(const Status& status) noexcept {
  try {
    return fail(static_cast<int>(status.code()), status.to_string());
  } catch (...) {
    return fail(static_cast<int>(status.code()), "");
  }
}

template <typename... Args>
int misuse(fmt::format_string<Args...> format, Args&&... args) {
  return fail(BATON_MISUSE, "misuse: " + fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
int invalid(fmt::format_string<Args...> format, Args&&... args) {
  return fail(Status::invalid_argument(format, std::forward<Args>(args)...));
}

int check(const Status& status) { return status.is_ok() ? BATON_OK : fail(status); }

// Runs one entry point's body: no exception leaves it.
template <typename Body>
int guarded(const char* call, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(BATON_RESOURCE_EXHAUSTED, std::string(call) + ": out of memory");
  } catch (const std::exception& e) {
    return fail(BATON_INTERNAL, std::string(call) + ": " + e.what());
  } catch (...) {
    return fail(BATON_INTERNAL, std::string(call) + ": unknown exception");
  }
}

// A batch from baton_prepare, submitted with baton_submit_prepared.
struct Prepared {
  std::mutex mutex;  // one submit at a time
  engine::PreparedBatch batch;
  std::vector<TimeNs> deadlines;  // relative, per request (0: none)
  bool with_deadlines = false;
};

// Prepared batches one engine holds at most: a caller that never unprepares shows up.
constexpr std::size_t kMaxPrepared = 65536;

// One engine, the notifications taken from it that the caller has not had
// yet (a buffer too small leaves one here), and its prepared batches.
struct EngineBox {
  std::unique_ptr<engine::Engine> engine;
  std::mutex notifications_mutex;
  std::deque<baton::transport::Notification> notifications;
  std::mutex prepared_mutex;
  std::unordered_map<std::uint64_t, std::shared_ptr<Prepared>> prepared;
};

// Handles start at a random value and step by a large odd number: a
// small integer or a guessed pointer cast to a handle names no engine (with
// sequential handles 1, 2, 3 a made-up 3 was a live engine).
struct Registry {
  static constexpr std::uintptr_t kStride = 0x9e3779b97f4a7c15ULL | 1;
  std::mutex mutex;
  std::uintptr_t next = [] {
    std::random_device seed;
    return ((std::uintptr_t{seed()} << 32) ^ seed()) | 1;  // odd: never NULL
  }();
  std::unordered_map<std::uintptr_t, std::shared_ptr<EngineBox>> engines;
};

// Never destroyed: an engine the caller did not destroy must not be torn
// down during static destruction, after the logger it uses.
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

std::uintptr_t id_of(baton_engine* handle) { return reinterpret_cast<std::uintptr_t>(handle); }

std::shared_ptr<EngineBox> find(baton_engine* handle) {
  if (handle == nullptr) return nullptr;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.engines.find(id_of(handle));
  return it == r.engines.end() ? nullptr : it->second;
}

// Runs body(EngineBox&) on a known engine; a NULL or unknown handle is BATON_MISUSE.
template <typename Body>
int with_engine(const char* call, baton_engine* handle, Body&& body) noexcept {
  return guarded(call, [&]() -> int {
    auto box = find(handle);
    if (!box) {
      return handle == nullptr ? misuse("{}: engine is NULL", call)
                               : misuse("{}: unknown engine handle {} (destroyed, or never created)", call,
                                        static_cast<const void*>(handle));
    }
    return body(*box);
  });
}

// Writes `text` and its NUL into a caller buffer (see "Caller buffers").
int write_text(const char* call, std::string_view text, char* buffer, std::size_t capacity, std::size_t* needed) {
  if (buffer == nullptr && capacity != 0) return misuse("{}: buffer is NULL with capacity {}", call, capacity);
  const std::size_t size = text.size() + 1;
  if (needed != nullptr) *needed = size;
  if (buffer == nullptr) return BATON_OK;
  if (capacity < size) {
    return fail(Status::out_of_range("{}: the buffer holds {} bytes, \"{}\" needs {}", call, capacity, text, size));
  }
  std::memcpy(buffer, text.data(), text.size());
  buffer[text.size()] = '\0';
  return BATON_OK;
}

// A relative time from the caller, validated and clamped.
int relative_ns(const char* call, std::string_view what, std::int64_t ns, TimeNs& out) {
  if (ns < 0) return invalid("{}: {} is {} (expected >= 0)", call, what, ns);
  out = std::min<TimeNs>(ns, kMaxRelativeNs);
  return BATON_OK;
}

// The config's string field at `offset`, or "" when it is NULL or the
// caller's struct (from an older baton.h) ends before it.
std::string field(const baton_engine_config& config, std::size_t offset) {
  if (config.size < offset + sizeof(const char*)) return {};
  const char* value = nullptr;
  std::memcpy(&value, reinterpret_cast<const char*>(&config) + offset, sizeof value);
  return value == nullptr ? std::string{} : std::string(value);
}

}  // namespace

extern "C" {

int baton_abi_version(void) { return BATON_ABI_VERSION; }

const char* baton_status_name(int status) {
  if (status == BATON_MISUSE) return "misuse";
  if (status < BATON_OK || status > BATON_INTERNAL) return "unknown";
  // to_string() returns views of string literals: NUL-terminated.
  return baton::to_string(static_cast<StatusCode>(status)).data();
}

const char* baton_last_error(void) { return last_error.c_str(); }

void baton_engine_config_init_sized(baton_engine_config* config, size_t size) {
  if (config == nullptr || size < kFirstConfigSize || size > kMaxConfigSize) return;
  const baton_engine_config defaults{};
  std::memcpy(config, &defaults, std::min(size, sizeof defaults));
  if (size > sizeof defaults) std::memset(reinterpret_cast<char*>(config) + sizeof defaults, 0, size - sizeof defaults);
  config->size = size;
}

// Programs built before the macro call this symbol: it cannot know their
// size, and writes ours.
void(baton_engine_config_init)(baton_engine_config* config) {
  baton_engine_config_init_sized(config, sizeof(baton_engine_config));
}

int baton_engine_create(const baton_engine_config* config, baton_engine** out) {
  return guarded("baton_engine_create", [&]() -> int {
    if (out == nullptr) return misuse("baton_engine_create: engine is NULL");
    engine::EngineConfig c;
    if (config != nullptr) {
      // The first layout ended before `nics`; a size above kMaxConfigSize
      // is garbage, and its "fields past ours are zero" scan would read
      // whatever memory follows the struct.
      if (config->size < kFirstConfigSize || config->size > kMaxConfigSize) {
        return misuse("baton_engine_create: config->size is {} (expected {} to {}; baton_engine_config_init() sets it)",
                      config->size, kFirstConfigSize, kMaxConfigSize);
      }
      // A newer baton.h's struct: fields this library does not know must be
      // unset (zero), else the caller asked for something it would ignore.
      if (config->size > sizeof(baton_engine_config)) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(config);
        if (std::any_of(bytes + sizeof(baton_engine_config), bytes + config->size,
                        [](unsigned char b) { return b != 0; })) {
          return invalid("baton_engine_create: config->size is {}: fields past this library's {} bytes are set",
                         config->size, sizeof(baton_engine_config));
        }
      }
      if (auto s = field(*config, offsetof(baton_engine_config, listen_address)); !s.empty()) {
        c.ucx.listen_address = s;
      }
      c.ucx.tls = field(*config, offsetof(baton_engine_config, ucx_tls));
      c.ucx.secret_file = field(*config, offsetof(baton_engine_config, secret_file));
      if (config->secret_file != nullptr && *config->secret_file == '\0') {  // within every layout accepted
        return invalid("baton_engine_create: secret_file is \"\" (NULL asks for $BATON_TOKEN_FILE, else none)");
      }
      c.policy_file = field(*config, offsetof(baton_engine_config, policy_file));
      c.metrics_address = field(*config, offsetof(baton_engine_config, metrics_address));
      const std::string nics = field(*config, offsetof(baton_engine_config, nics));
      for (std::size_t at = 0; !nics.empty() && at <= nics.size();) {
        const std::size_t comma = std::min(nics.find(',', at), nics.size());
        if (comma == at) return invalid("baton_engine_create: nics \"{}\" holds an empty name", nics);
        c.ucx.nics.push_back(nics.substr(at, comma - at));
        at = comma + 1;
      }
      if (config->size >= offsetof(baton_engine_config, gpu_paths) + sizeof(std::int32_t)) {
        std::int32_t gpu_paths = 0;
        std::memcpy(&gpu_paths, reinterpret_cast<const char*>(config) + offsetof(baton_engine_config, gpu_paths),
                    sizeof gpu_paths);
        if (gpu_paths != 0 && gpu_paths != 1) return invalid("baton_engine_create: gpu_paths is {} (0 or 1)", gpu_paths);
        c.gpu_paths = gpu_paths == 1;
      }
      if (config->size >= offsetof(baton_engine_config, allow_unauthenticated) + sizeof(std::int32_t)) {
        std::int32_t open = 0;
        std::memcpy(&open, reinterpret_cast<const char*>(config) + offsetof(baton_engine_config, allow_unauthenticated),
                    sizeof open);
        if (open != 0 && open != 1) return invalid("baton_engine_create: allow_unauthenticated is {} (0 or 1)", open);
        c.ucx.allow_unauthenticated = open == 1;
      }
    }
    auto created = engine::Engine::create(std::move(c));
    if (!created) return fail(created.error());
    auto box = std::make_shared<EngineBox>();
    box->engine = std::move(*created);
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    std::uintptr_t id = r.next;
    while (id == 0 || r.engines.contains(id)) id += Registry::kStride;  // a wrap, however unlikely
    r.next = id + Registry::kStride;
    r.engines.emplace(id, std::move(box));
    *out = reinterpret_cast<baton_engine*>(id);
    return BATON_OK;
  });
}

int baton_engine_shutdown(baton_engine* handle) {
  return with_engine("baton_engine_shutdown", handle, [&](EngineBox& box) -> int {
    box.engine->shutdown();
    return BATON_OK;
  });
}

void baton_engine_destroy(baton_engine* handle) {
  (void)guarded("baton_engine_destroy", [&]() -> int {
    if (handle == nullptr) return BATON_OK;
    std::shared_ptr<EngineBox> box;
    {
      Registry& r = registry();
      std::lock_guard lock(r.mutex);
      auto it = r.engines.find(id_of(handle));
      if (it == r.engines.end()) return BATON_OK;
      box = std::move(it->second);
      r.engines.erase(it);
    }
    // Shut down here, not when the last call still running on it returns:
    // a thread in baton_wait would keep the engine moving bytes into memory
    // the caller frees once this returns. That wait returns now.
    box->engine->shutdown();
    box.reset();
    return BATON_OK;
  });
}

int baton_engine_address(baton_engine* handle, char* address, size_t capacity, size_t* needed) {
  return with_engine("baton_engine_address", handle, [&](EngineBox& box) -> int {
    return write_text("baton_engine_address", box.engine->address(), address, capacity, needed);
  });
}

int baton_engine_metrics_address(baton_engine* handle, char* address, size_t capacity, size_t* needed) {
  return with_engine("baton_engine_metrics_address", handle, [&](EngineBox& box) -> int {
    return write_text("baton_engine_metrics_address", box.engine->metrics_address(), address, capacity, needed);
  });
}

int baton_register_memory(baton_engine* handle, void* ptr, size_t length, int kind, int device,
                          baton_region* region) {
  return with_engine("baton_register_memory", handle, [&](EngineBox& box) -> int {
    if (region == nullptr) return misuse("baton_register_memory: region is NULL");
    if (kind != BATON_MEMORY_DRAM && kind != BATON_MEMORY_VRAM) {
      return invalid("baton_register_memory: kind {} (expected BATON_MEMORY_DRAM or BATON_MEMORY_VRAM)", kind);
    }
    auto r = box.engine->register_memory(ptr, length, static_cast<engine::MemoryKind>(kind), device);
    if (!r) return fail(r.error());
    *region = baton_region{r->handle, reinterpret_cast<void*>(r->base), r->length};
    return BATON_OK;
  });
}

int baton_allocate_memory(baton_engine* handle, size_t length, int numa_node, baton_region* region) {
  return with_engine("baton_allocate_memory", handle, [&](EngineBox& box) -> int {
    if (region == nullptr) return misuse("baton_allocate_memory: region is NULL");
    auto r = box.engine->allocate_memory(length, numa_node);
    if (!r) return fail(r.error());
    *region = baton_region{r->handle, reinterpret_cast<void*>(r->base), r->length};
    return BATON_OK;
  });
}

// More names than any deployment has peers: a count past it is a caller's
// mistake (a negative number cast), not a list to allocate for.
constexpr std::size_t kMaxExportPeers = std::size_t{1} << 20;

int baton_export_region(baton_engine* handle, uint32_t region, const char* const* peers, size_t peer_count) {
  return with_engine("baton_export_region", handle, [&](EngineBox& box) -> int {
    if (peers == nullptr && peer_count != 0) {
      return misuse("baton_export_region: peers is NULL with peer_count {}", peer_count);
    }
    if (peer_count > kMaxExportPeers) {
      return invalid("baton_export_region: peer_count is {} (expected at most {})", peer_count, kMaxExportPeers);
    }
    std::vector<std::string> names;
    names.reserve(peer_count);
    for (std::size_t i = 0; i < peer_count; ++i) {
      if (peers[i] == nullptr) return misuse("baton_export_region: peers[{}] is NULL", i);
      names.emplace_back(peers[i]);
    }
    return check(box.engine->export_region(region, names));
  });
}

int baton_unregister(baton_engine* handle, uint32_t region) {
  return with_engine("baton_unregister", handle,
                     [&](EngineBox& box) -> int { return check(box.engine->unregister(region)); });
}

int baton_connect(baton_engine* handle, const char* address, char* peer, size_t capacity, size_t* needed) {
  return with_engine("baton_connect", handle, [&](EngineBox& box) -> int {
    if (address == nullptr) return misuse("baton_connect: address is NULL");
    if (peer == nullptr && capacity != 0) return misuse("baton_connect: peer is NULL with capacity {}", capacity);
    auto p = box.engine->connect(address);
    if (!p) return fail(p.error());
    return write_text("baton_connect", p->address, peer, capacity, needed);
  });
}

int baton_refresh(baton_engine* handle, const char* peer, int64_t timeout_ns) {
  return with_engine("baton_refresh", handle, [&](EngineBox& box) -> int {
    if (peer == nullptr) return misuse("baton_refresh: peer is NULL");
    TimeNs timeout = 0;
    if (int rc = relative_ns("baton_refresh", "timeout_ns", timeout_ns, timeout); rc != BATON_OK) return rc;
    return check(box.engine->refresh(engine::Peer{peer, {}}, timeout == 0 ? kDefaultRefreshNs : timeout));
  });
}

int baton_remote_regions(baton_engine* handle, const char* peer, baton_remote_region* regions, size_t capacity,
                         size_t* count) {
  return with_engine("baton_remote_regions", handle, [&](EngineBox& box) -> int {
    if (peer == nullptr) return misuse("baton_remote_regions: peer is NULL");
    if (count == nullptr) return misuse("baton_remote_regions: count is NULL");
    if (regions == nullptr && capacity != 0) {
      return misuse("baton_remote_regions: regions is NULL with capacity {}", capacity);
    }
    auto known = box.engine->remote_regions(engine::Peer{peer, {}});
    if (!known) return fail(known.error());
    *count = known->size();
    if (regions == nullptr) return BATON_OK;
    if (capacity < known->size()) {
      return fail(Status::out_of_range("baton_remote_regions: the array holds {} regions, peer {} has {}", capacity,
                                       peer, known->size()));
    }
    for (std::size_t i = 0; i < known->size(); ++i) {
      const auto& r = (*known)[i];
      regions[i] = baton_remote_region{r.key, r.staged ? 1u : 0u, r.base, r.length};
    }
    return BATON_OK;
  });
}

}  // extern "C"

// Helpers outside extern "C": in an unnamed namespace within it, GCC still
// exported them under their plain names, and a program's own `to_batch`
// replaced ours.
namespace {

// More would only be a caller's corrupt count: the batch's copy alone would
// be gigabytes.
constexpr std::size_t kMaxBatchRequests = std::size_t{1} << 24;

// The caller's requests as a Batch, checked as baton_submit documents; each
// relative deadline goes to `deadlines` (0: none), the Batch's stay 0.
int to_batch(const char* call, const baton_request* requests, size_t count, const void* notification,
             size_t notification_length, engine::Batch& b, std::vector<TimeNs>& deadlines) {
  if (requests == nullptr && count != 0) return misuse("{}: requests is NULL with count {}", call, count);
  if (count == 0) return invalid("{}: the batch is empty (count 0)", call);
  if (count > kMaxBatchRequests) {
    return invalid("{}: count is {} (expected at most {} requests a batch)", call, count, kMaxBatchRequests);
  }
  if (notification == nullptr && notification_length != 0) {
    return misuse("{}: notification is NULL with length {}", call, notification_length);
  }
  // Before the copy: a corrupt length would read far past the caller's bytes.
  if (notification_length > baton::transport::kMaxNotificationBytes) {
    return invalid("{}: notification_length is {} (at most {} bytes)", call, notification_length,
                   baton::transport::kMaxNotificationBytes);
  }
  if (notification_length != 0) b.notification.assign(static_cast<const char*>(notification), notification_length);
  b.requests.reserve(count);
  deadlines.assign(count, 0);
  for (std::size_t i = 0; i < count; ++i) {
    const baton_request& in = requests[i];
    if (in.peer == nullptr) return misuse("{}: requests[{}].peer is NULL", call, i);
    if (in.op != BATON_OP_READ && in.op != BATON_OP_WRITE) {
      return invalid("{}: requests[{}].op is {} (expected BATON_OP_READ or BATON_OP_WRITE)", call, i, in.op);
    }
    if (in.qos < 0 || in.qos >= baton::sched::kQosClassCount) {
      return invalid("{}: requests[{}].qos is {} (expected BATON_QOS_*, 0..{})", call, i, in.qos,
                     baton::sched::kQosClassCount - 1);
    }
    engine::Request r;
    r.op = static_cast<engine::Op>(in.op);
    r.qos = static_cast<baton::sched::QosClass>(in.qos);
    r.local_region = in.local_region;
    r.local_offset = in.local_offset;
    r.peer = in.peer;
    r.remote_region = in.remote_region;
    r.remote_offset = in.remote_offset;
    r.length = in.length;
    const int deadline_rc = relative_ns(call, fmt::format("requests[{}].deadline_ns", i), in.deadline_ns, deadlines[i]);
    if (deadline_rc != BATON_OK) return deadline_rc;
    const int timeout_rc = relative_ns(call, fmt::format("requests[{}].timeout_ns", i), in.timeout_ns, r.timeout_ns);
    if (timeout_rc != BATON_OK) return timeout_rc;
    b.requests.push_back(std::move(r));
  }
  return BATON_OK;
}

// Relative deadlines made absolute, as of `now`.
void set_deadlines(engine::Batch& b, const std::vector<TimeNs>& deadlines, TimeNs now) {
  for (std::size_t i = 0; i < b.requests.size(); ++i) b.requests[i].deadline_ns = deadlines[i] == 0 ? 0 : now + deadlines[i];
}

// The prepared batch `id` of `box`, held by `use` (one caller at a time:
// its resolution is rewritten by the call that finds it stale), with its
// relative deadlines made absolute as of now when it has any.
template <typename Use>
int with_prepared(const char* call, EngineBox& box, std::uint64_t id, Use use) {
  std::shared_ptr<Prepared> p;
  {
    std::lock_guard lock(box.prepared_mutex);
    auto it = box.prepared.find(id);
    if (it == box.prepared.end()) return fail(Status::not_found("{}: no prepared batch {} on this engine", call, id));
    p = it->second;
  }
  std::lock_guard one_at_a_time(p->mutex);
  if (!p->with_deadlines) return use(p->batch);
  engine::Batch b = p->batch.batch();
  set_deadlines(b, p->deadlines, box.engine->now_ns());
  return use(b);
}

// The requests converted and checked as `call`, their relative deadlines
// made absolute as of now (baton_submit's and baton_run's batch).
int batch_as_of_now(const char* call, EngineBox& box, const baton_request* requests, size_t count,
                    const void* notification, size_t notification_length, engine::Batch& b) {
  std::vector<TimeNs> deadlines;
  if (int rc = to_batch(call, requests, count, notification, notification_length, b, deadlines); rc != BATON_OK) {
    return rc;
  }
  set_deadlines(b, deadlines, box.engine->now_ns());
  return BATON_OK;
}

}  // namespace

extern "C" {

int baton_submit(baton_engine* handle, const baton_request* requests, size_t count, const void* notification,
                 size_t notification_length, uint64_t* batch) {
  return with_engine("baton_submit", handle, [&](EngineBox& box) -> int {
    if (batch == nullptr) return misuse("baton_submit: batch is NULL");
    engine::Batch b;
    if (int rc = batch_as_of_now("baton_submit", box, requests, count, notification, notification_length, b);
        rc != BATON_OK) {
      return rc;
    }
    auto h = box.engine->submit(b);
    if (!h) return fail(h.error());
    *batch = h->id;
    return BATON_OK;
  });
}

int baton_prepare(baton_engine* handle, const baton_request* requests, size_t count, const void* notification,
                  size_t notification_length, uint64_t* prepared) {
  return with_engine("baton_prepare", handle, [&](EngineBox& box) -> int {
    if (prepared == nullptr) return misuse("baton_prepare: prepared is NULL");
    engine::Batch b;
    auto p = std::make_shared<Prepared>();
    if (int rc = to_batch("baton_prepare", requests, count, notification, notification_length, b, p->deadlines);
        rc != BATON_OK) {
      return rc;
    }
    // baton_submit's refusals, once, here.
    if (Status s = box.engine->check(b); !s.is_ok()) return fail(s);
    p->with_deadlines = std::ranges::any_of(p->deadlines, [](TimeNs d) { return d != 0; });
    p->batch = engine::PreparedBatch(std::move(b));
    std::lock_guard lock(box.prepared_mutex);
    if (box.prepared.size() >= kMaxPrepared) {
      return fail(Status::resource_exhausted("baton_prepare: {} prepared batches held (baton_unprepare the unused)",
                                             kMaxPrepared));
    }
    // Unique in the process: another engine's id is not_found here.
    static std::atomic<std::uint64_t> next_prepared{1};
    const std::uint64_t id = next_prepared.fetch_add(1, std::memory_order_relaxed);
    box.prepared.emplace(id, std::move(p));
    *prepared = id;
    return BATON_OK;
  });
}

int baton_submit_prepared(baton_engine* handle, uint64_t prepared, uint64_t* batch) {
  return with_engine("baton_submit_prepared", handle, [&](EngineBox& box) -> int {
    if (batch == nullptr) return misuse("baton_submit_prepared: batch is NULL");
    return with_prepared("baton_submit_prepared", box, prepared, [&](auto& b) {
      auto h = box.engine->submit(b);
      if (!h) return fail(h.error());
      *batch = h->id;
      return static_cast<int>(BATON_OK);
    });
  });
}

int baton_run(baton_engine* handle, const baton_request* requests, size_t count, const void* notification,
              size_t notification_length) {
  return with_engine("baton_run", handle, [&](EngineBox& box) -> int {
    engine::Batch b;
    if (int rc = batch_as_of_now("baton_run", box, requests, count, notification, notification_length, b);
        rc != BATON_OK) {
      return rc;
    }
    const Status s = box.engine->run(b);
    return s.is_ok() ? BATON_OK : fail(s);
  });
}

int baton_run_prepared(baton_engine* handle, uint64_t prepared) {
  return with_engine("baton_run_prepared", handle, [&](EngineBox& box) -> int {
    return with_prepared("baton_run_prepared", box, prepared, [&](auto& b) {
      const Status s = box.engine->run(b);
      return s.is_ok() ? static_cast<int>(BATON_OK) : fail(s);
    });
  });
}

int baton_unprepare(baton_engine* handle, uint64_t prepared) {
  return with_engine("baton_unprepare", handle, [&](EngineBox& box) -> int {
    std::lock_guard lock(box.prepared_mutex);
    if (box.prepared.erase(prepared) == 0) {
      return fail(Status::not_found("baton_unprepare: no prepared batch {} on this engine", prepared));
    }
    return BATON_OK;
  });
}

int baton_poll(baton_engine* handle, uint64_t batch, baton_batch_status* status) {
  return with_engine("baton_poll", handle, [&](EngineBox& box) -> int {
    if (status == nullptr) return misuse("baton_poll: status is NULL");
    thread_local engine::BatchStatus s;  // reused: a C poll loop allocates nothing
    if (Status polled = box.engine->poll(engine::BatchHandle{batch}, s); !polled.is_ok()) return fail(polled);
    *status = baton_batch_status{s.done ? 1 : 0, static_cast<int32_t>(s.status.code()), s.bytes, s.bytes_done};
    // The batch's failure, for the caller to read: the call itself succeeded.
    if (!s.status.is_ok()) (void)fail(s.status);
    if (s.requests.capacity() > 4096) s.requests = {};  // one huge batch does not pin its memory
    return BATON_OK;
  });
}

int baton_wait(baton_engine* handle, uint64_t batch, int64_t timeout_ns) {
  return with_engine("baton_wait", handle, [&](EngineBox& box) -> int {
    TimeNs timeout = 0;
    if (int rc = relative_ns("baton_wait", "timeout_ns", timeout_ns, timeout); rc != BATON_OK) return rc;
    return check(box.engine->wait(engine::BatchHandle{batch}, timeout));
  });
}

int baton_cancel(baton_engine* handle, uint64_t batch) {
  return with_engine("baton_cancel", handle,
                     [&](EngineBox& box) -> int { return check(box.engine->cancel(engine::BatchHandle{batch})); });
}

int baton_release(baton_engine* handle, uint64_t batch) {
  return with_engine("baton_release", handle,
                     [&](EngineBox& box) -> int { return check(box.engine->release(engine::BatchHandle{batch})); });
}

int baton_batch_event_fd(baton_engine* handle, int* fd) {
  return with_engine("baton_batch_event_fd", handle, [&](EngineBox& box) -> int {
    if (fd == nullptr) return misuse("baton_batch_event_fd: fd is NULL");
    const int event_fd = box.engine->batch_event_fd();
    if (event_fd < 0) return fail(Status::unavailable("baton_batch_event_fd: the kernel refused an eventfd"));
    *fd = event_fd;
    return BATON_OK;
  });
}

int baton_take_notification(baton_engine* handle, char* from, size_t from_capacity, size_t* from_needed,
                            void* message, size_t message_capacity, size_t* message_length, int* taken) {
  return with_engine("baton_take_notification", handle, [&](EngineBox& box) -> int {
    if (from_needed == nullptr || message_length == nullptr || taken == nullptr) {
      return misuse("baton_take_notification: from_needed, message_length and taken must not be NULL");
    }
    if (from == nullptr && from_capacity != 0) {
      return misuse("baton_take_notification: from is NULL with capacity {}", from_capacity);
    }
    if (message == nullptr && message_capacity != 0) {
      return misuse("baton_take_notification: message is NULL with capacity {}", message_capacity);
    }
    std::lock_guard lock(box.notifications_mutex);
    if (box.notifications.empty()) {
      for (auto& n : box.engine->take_notifications()) box.notifications.push_back(std::move(n));
    }
    *taken = 0;
    if (box.notifications.empty()) {
      *from_needed = 0;
      *message_length = 0;
      return BATON_OK;
    }
    const baton::transport::Notification& n = box.notifications.front();
    *from_needed = n.from.size() + 1;
    *message_length = n.message.size();
    if (from == nullptr) return BATON_OK;  // sizes only
    if (from_capacity < *from_needed || message_capacity < *message_length) {
      return fail(Status::out_of_range(
          "baton_take_notification: the buffers hold {} and {} bytes, the notification needs {} (from) and {} "
          "(message)",
          from_capacity, message_capacity, *from_needed, *message_length));
    }
    std::memcpy(from, n.from.data(), n.from.size());
    from[n.from.size()] = '\0';
    if (!n.message.empty()) std::memcpy(message, n.message.data(), n.message.size());
    box.notifications.pop_front();
    *taken = 1;
    return BATON_OK;
  });
}

}  // extern "C"
