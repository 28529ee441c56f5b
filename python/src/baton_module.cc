// The `baton._baton` extension: the Engine for Python (pybind11). The
// package `baton` (python/baton/__init__.py) re-exports it and adds asyncio.
//
// Lifetimes: a Python Engine holds the C++ Engine through a shared pointer
// that Peers and Batches share, so close() on one thread never frees the
// engine under a call on another; close() shuts it down, and later calls
// raise Unavailable. Registered buffers stay referenced by the engine (and
// their buffer export held) until unregister() or close(): a peer may write
// into them until then.
//
// Every call that can wait releases the GIL.
#include <Python.h>
#include <cxxabi.h>
#include <pthread.h>
#include <unistd.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "baton/engine/engine.h"

namespace py = pybind11;
using baton::Status;
using baton::StatusCode;
namespace engine = baton::engine;
namespace transport = baton::transport;

namespace {

// --- the GIL ------------------------------------------------------------------
//
// A thread that takes the GIL back while the interpreter finalizes is ended
// by CPython with pthread_exit (3.11-3.13); that unwind through a destructor
// (pybind11's gil_scoped_release) aborts the whole process ("terminate
// called without an active exception"), as a daemon thread blocked in
// wait() did at every exit. Such a thread parks instead, without the GIL,
// until the process is gone; the finalizing thread itself takes it back.

unsigned long main_thread_ident = 0;  // threading.main_thread(), set at import

bool must_not_take_gil() {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing() != 0;
#else
  const bool finalizing = _Py_IsFinalizing() != 0;
#endif
  return finalizing && PyThread_get_thread_ident() != main_thread_ident;
}

[[noreturn]] void park_forever() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// Takes the GIL back, or parks: finalizing may begin while this thread
// waits for the GIL, after the check, and CPython then ends it from inside
// the call (pthread_exit's forced unwind), which is caught here and never
// returns, so it cannot leave a noexcept destructor.
template <typename Take>
void take_gil_or_park(Take take) {
  if (must_not_take_gil()) park_forever();
  try {
    take();
  } catch (abi::__forced_unwind&) {
    park_forever();
  }
}

// The GIL released for a call that may wait (every call that can, so a
// daemon thread in any of them survives the exit).
class GilReleased {
 public:
  GilReleased() : thread_(PyEval_SaveThread()) {}
  ~GilReleased() {
    take_gil_or_park([this] { PyEval_RestoreThread(thread_); });
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* thread_;
};

// The GIL taken inside a GilReleased scope (a signal check between waits),
// or from a thread that may or may not hold it (a destructor).
class GilTaken {
 public:
  GilTaken() {
    take_gil_or_park([this] { gil_.emplace(); });
  }

 private:
  std::optional<py::gil_scoped_acquire> gil_;
};

// --- exceptions ---------------------------------------------------------------

struct Exceptions {
  PyObject* base = nullptr;
  std::map<StatusCode, PyObject*> by_code;
};
Exceptions& exceptions() {
  static Exceptions e;
  return e;
}

PyObject* make_exception(py::module_& m, const char* name, PyObject* base, PyObject* builtin, const char* doc) {
  PyObject* bases = builtin == nullptr ? PyTuple_Pack(1, base) : PyTuple_Pack(2, base, builtin);
  const std::string qualified = std::string("baton.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  Py_DECREF(bases);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));
  return type;
}

void register_exceptions(py::module_& m) {
  Exceptions& e = exceptions();
  const std::string qualified = "baton.BatonError";
  e.base = PyErr_NewExceptionWithDoc(qualified.c_str(), "A Baton call failed; the message says why.", PyExc_Exception,
                                     nullptr);
  m.add_object("BatonError", py::handle(e.base));
  e.by_code[StatusCode::kInvalidArgument] =
      make_exception(m, "InvalidArgument", e.base, PyExc_ValueError, "A value was refused.");
  e.by_code[StatusCode::kNotFound] = make_exception(m, "NotFound", e.base, PyExc_LookupError, "No such thing.");
  e.by_code[StatusCode::kOutOfRange] =
      make_exception(m, "OutOfRange", e.base, PyExc_IndexError, "A range is outside its region.");
  e.by_code[StatusCode::kUnavailable] =
      make_exception(m, "Unavailable", e.base, PyExc_ConnectionError, "A peer or the engine is not there.");
  e.by_code[StatusCode::kTimeout] = make_exception(m, "Timeout", e.base, PyExc_TimeoutError, "Time ran out.");
  e.by_code[StatusCode::kCancelled] = make_exception(m, "Cancelled", e.base, nullptr, "Cancelled.");
  e.by_code[StatusCode::kDeadlineInfeasible] =
      make_exception(m, "DeadlineInfeasible", e.base, nullptr, "The deadline cannot be met; recompute locally.");
  e.by_code[StatusCode::kPermissionDenied] =
      make_exception(m, "PermissionDenied", e.base, PyExc_PermissionError, "The peer did not prove the secret.");
  e.by_code[StatusCode::kFailedPrecondition] =
      make_exception(m, "FailedPrecondition", e.base, nullptr, "Not now: the object's state forbids it.");
  e.by_code[StatusCode::kResourceExhausted] =
      make_exception(m, "ResourceExhausted", e.base, PyExc_MemoryError, "More than the machine can give.");
  e.by_code[StatusCode::kAlreadyExists] = make_exception(m, "AlreadyExists", e.base, nullptr, "Already there.");
}

[[noreturn]] void raise(const Status& s) {
  const auto it = exceptions().by_code.find(s.code());
  // Sized, not as a C string: a NUL that a caller's argument brought into
  // the message cut it there ('op "read').
  const std::string& m = s.message();
  py::object text = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(m.data(), static_cast<Py_ssize_t>(m.size()), "backslashreplace"));
  if (!text) throw py::error_already_set();
  PyErr_SetObject(it == exceptions().by_code.end() ? exceptions().base : it->second, text.ptr());
  throw py::error_already_set();
}

[[noreturn]] void raise(StatusCode code, const std::string& message) { raise(Status(code, message)); }

template <typename T>
T value_or_raise(baton::Result<T> r) {
  if (!r) raise(r.error());
  return std::move(*r);
}

void ok_or_raise(const Status& s) {
  if (!s.is_ok()) raise(s);
}

// --- the objects ----------------------------------------------------------------

// What the memoryviews of Region.buffer hold for allocate()'s memory: the
// engine that mapped it, so a view that outlives close() (or the Engine
// object) still points at mapped memory; the engine goes with the last view.
struct AllocatedView {
  std::shared_ptr<engine::Engine> engine;
  void* base = nullptr;
  std::size_t length = 0;
  ~AllocatedView() {
    GilReleased release;  // its loop thread is joined without the GIL
    engine.reset();
  }
};

// A registered buffer: what keeps its memory alive.
struct RegionState {
  engine::Region region;
  py::object owner;            // the object registered (or None for allocate())
  std::optional<Py_buffer> view;  // held until unregister, so a bytearray cannot move
  py::object views;            // allocate(): the AllocatedView that Region.buffer's views hold, once asked
  bool tensor = false;         // registered through data_ptr(): nothing pins its storage (see check_unmoved)
  bool unregistering = false;  // unregister() runs without the GIL: no new view of memory about to be unmapped
  bool closed = false;         // its engine was closed: no longer registered
  ~RegionState() {
    if (view || views) {
      GilTaken gil;
      if (view) PyBuffer_Release(&*view);
      views = py::object();
    }
  }
  // Whether a memoryview (or an array over one) of Region.buffer still
  // lives: unregistering would unmap memory it points at.
  [[nodiscard]] bool has_live_views() const { return views && Py_REFCNT(views.ptr()) > 1; }
};

// Nothing may need the GIL while `mutex` is held: a thread holding the GIL
// may be waiting for the mutex (a RegionState is destroyed outside it).
// Forks seen in this process (counted in the child, as the engine counts
// them): an engine made before one belongs to the parent. metrics_text()
// and take_notifications() answered "" and [] there, where every other
// call raises; now they raise too.
std::atomic<std::uint64_t> forks{0};

struct EngineState {
  EngineState() {
    static std::once_flag registered;
    std::call_once(registered, [] { (void)::pthread_atfork(nullptr, nullptr, [] { forks.fetch_add(1); }); });
    forks_at_creation = forks.load();
  }
  std::uint64_t forks_at_creation = 0;
  pid_t creator = ::getpid();
  std::shared_ptr<engine::Engine> engine;  // null once closed
  std::mutex mutex;                        // guards `engine`, `regions` and `orphans`
  std::map<baton::transport::RegionHandle, std::shared_ptr<RegionState>> regions;
  // Batches whose Batch object went without release(): released once they
  // ended (sweep_orphans), so a dropped batch does not stay in the engine.
  std::vector<engine::BatchHandle> orphans;

  // Dropped without close() (its last object gone, or the interpreter
  // exiting): closed as close() does, so the engine stops before the
  // buffers it may still write into go.
  ~EngineState();

  std::shared_ptr<engine::Engine> get(const char* call) {
    if (forks.load(std::memory_order_relaxed) != forks_at_creation) {
      raise(StatusCode::kFailedPrecondition,
            fmt::format("{}: the engine belongs to process {}, which created it before fork(); a child process "
                        "creates its own engine", call, creator));
    }
    std::lock_guard lock(mutex);
    if (!engine) raise(StatusCode::kUnavailable, std::string(call) + ": the engine is closed");
    return engine;
  }
  void orphan(engine::BatchHandle h) {
    std::lock_guard lock(mutex);
    if (engine) orphans.push_back(h);
  }
  // Releases the orphans that ended; without the GIL.
  void sweep_orphans(engine::Engine& e) {
    std::vector<engine::BatchHandle> look;
    {
      std::lock_guard lock(mutex);
      if (orphans.empty()) return;
      look.swap(orphans);
    }
    std::erase_if(look, [&e](engine::BatchHandle h) {
      const Status ended = e.wait(h, 0);  // a look: no loop round trip
      if (ended.code() == StatusCode::kNotFound) return true;
      return ended.is_ok() && e.release(h).is_ok();  // kept while slices are still on the wire
    });
    std::lock_guard lock(mutex);
    orphans.insert(orphans.end(), look.begin(), look.end());
  }
};

struct PyRegion {
  std::shared_ptr<RegionState> state;
  bool allocated = false;
  std::shared_ptr<EngineState> engine;  // the engine it belongs to, kept alive by the region
};

const engine::Region& registered(const PyRegion& r, const char* what) {
  if (!r.state) raise(StatusCode::kFailedPrecondition, std::string(what) + ": the region was unregistered");
  return r.state->region;
}

struct PyPeer {
  std::shared_ptr<EngineState> engine;
  std::string address;
};

struct PyRequest {
  engine::Request request;
  std::optional<double> deadline_ms;  // relative to submit
  std::shared_ptr<EngineState> engine;  // the local region's: a request runs on that engine only
  std::vector<std::shared_ptr<RegionState>> regions;  // this engine's regions it names, looked at again at submit
};

// Whether __init__ built the C++ part of `self` (Engine and Request, whose
// __new__ callers may call alone).
bool built(py::handle self) {
  return reinterpret_cast<py::detail::instance*>(self.ptr())->get_value_and_holder().holder_constructed();
}

// submit's and prepare's `requests`: a sequence of Requests, each one built
// by __init__ (pybind11 would copy an unbuilt one's uninitialized memory).
std::vector<PyRequest> requests_of(const char* call, const py::object& given) {
  if (!py::isinstance<py::sequence>(given) || py::isinstance<py::str>(given) || py::isinstance<py::bytes>(given)) {
    throw py::type_error(std::string(call) + ": requests: expected a list of Request, not " +
                         std::string(py::str(py::type::of(given).attr("__name__"))));
  }
  std::vector<PyRequest> out;
  const auto items = py::reinterpret_borrow<py::sequence>(given);
  out.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const py::object item = items[i];
    if (!py::isinstance<PyRequest>(item)) {
      throw py::type_error(fmt::format("{}: requests[{}]: expected a Request, not {}", call, i,
                                       std::string(py::str(py::type::of(item).attr("__name__")))));
    }
    if (!built(item)) {
      throw py::type_error(fmt::format("{}: requests[{}] was made by Request.__new__() without __init__()", call, i));
    }
    out.push_back(item.cast<const PyRequest&>());
  }
  return out;
}

// A peer's region as Peer.regions lists it: a handle means something only
// at the peer that exported it, so the region remembers whose it is.
struct PyRemoteRegion {
  transport::RemoteRegion region;
  std::string peer;  // the Peer's address
};

// A region, or a request's local region, of another engine names a handle
// this engine may also have: refused, never looked up.
void check_same_engine(const EngineState& s, const std::shared_ptr<EngineState>& owner, const char* call) {
  if (owner.get() != &s) {
    raise(StatusCode::kInvalidArgument, std::string(call) + ": the region was registered with another engine");
  }
}

struct PyBatch {
  std::shared_ptr<EngineState> engine;  // null once moved from
  engine::BatchHandle handle;
  std::uint64_t bytes = 0;
  bool released = false;

  PyBatch(std::shared_ptr<EngineState> e, engine::BatchHandle h, std::uint64_t b)
      : engine(std::move(e)), handle(h), bytes(b) {}
  PyBatch(PyBatch&&) = default;
  PyBatch(const PyBatch&) = delete;
  ~PyBatch() {
    if (engine && !released) engine->orphan(handle);
  }
};

engine::Op parse_op(const std::string& op) {
  if (op == "read") return engine::Op::kRead;
  if (op == "write") return engine::Op::kWrite;
  raise(StatusCode::kInvalidArgument, "op \"" + op + "\": expected \"read\" or \"write\"");
}

baton::sched::QosClass parse_qos(const std::string& qos) {
  auto q = baton::sched::parse_qos_class(qos);
  if (!q) {
    raise(StatusCode::kInvalidArgument,
          "qos \"" + qos + "\": expected decode_critical, hot_kv, prefill_bulk or background");
  }
  return *q;
}

std::uint64_t non_negative(const char* what, long long v) {
  if (v < 0) raise(StatusCode::kInvalidArgument, std::string(what) + " is " + std::to_string(v) + " (expected >= 0)");
  return static_cast<std::uint64_t>(v);
}

baton::TimeNs milliseconds_ns(const char* what, std::optional<double> ms) {
  if (!ms) return 0;
  if (!(*ms >= 0) || *ms > 1e12) {
    raise(StatusCode::kInvalidArgument, fmt::format("{} is {} ms (expected 0 to 1e12)", what, *ms));
  }
  // Rounded up: a positive time below 1 ns is not 0, which asks for the
  // policy's default (60 s).
  return static_cast<baton::TimeNs>(std::ceil(*ms * 1e6));
}

// A timeout in seconds (wait, refresh), checked before it becomes
// nanoseconds: NaN, negative or beyond a year is refused, not converted.
baton::TimeNs seconds_ns(const char* what, double s) {
  constexpr double kYear = 365.0 * 24 * 3600;
  if (!(s >= 0) || s > kYear) {
    raise(StatusCode::kInvalidArgument, fmt::format("{} is {} s (expected 0 to {} s, a year)", what, s, kYear));
  }
  return static_cast<baton::TimeNs>(s * 1e9);
}

// The handle `remote` names at `peer`: a RemoteRegion of that peer, or an
// integer (anything with __index__, numpy's included).
baton::transport::RegionHandle remote_handle(const py::object& remote, const std::string& peer) {
  if (py::isinstance<PyRemoteRegion>(remote)) {
    const auto& r = remote.cast<const PyRemoteRegion&>();
    if (r.peer != peer) {
      raise(StatusCode::kInvalidArgument,
            fmt::format("remote: region {} is peer \"{}\"'s, not \"{}\"'s: pass the Peer it came from, or the "
                        "address as connected (a handle names a region only at the peer that listed it)",
                        r.region.key, r.peer, peer));
    }
    return r.region.key;
  }
  if (PyIndex_Check(remote.ptr())) {
    const py::int_ v = py::reinterpret_steal<py::int_>(PyNumber_Index(remote.ptr()));
    if (!v) throw py::error_already_set();
    if (v < py::int_(0) || v > py::int_(0xffffffffLL)) {
      raise(StatusCode::kInvalidArgument, "remote handle " + std::string(py::repr(v)) + " (expected 0 to 2**32-1)");
    }
    return v.cast<baton::transport::RegionHandle>();
  }
  throw py::type_error("remote: expected a region handle (int) or a peer's region, not " +
                       std::string(py::str(py::type::of(remote).attr("__name__"))));
}

std::string peer_address(const py::object& peer) {
  if (peer.is_none()) return {};  // between this engine's own regions
  if (py::isinstance<PyPeer>(peer)) return peer.cast<const PyPeer&>().address;
  if (py::isinstance<py::str>(peer)) {
    std::string address = peer.cast<std::string>();
    // Not None's meaning: an unset variable would name this engine's own
    // regions with a peer's handle.
    if (address.empty()) raise(StatusCode::kInvalidArgument, "peer: \"\" (None means between this engine's own regions)");
    return address;
  }
  throw py::type_error("peer: expected a Peer (engine.connect()), \"host:port\" or None, not " +
                       std::string(py::str(py::type::of(peer).attr("__name__"))));
}

// An offset or a length: any integer (numpy's too). Negative is refused as a
// value; 2**64 and beyond (a TypeError from a 64-bit argument before) as out
// of any region's range.
std::uint64_t byte_index(const char* what, const py::object& v, bool positive = false) {
  if (!PyIndex_Check(v.ptr())) {
    throw py::type_error(std::string(what) + ": expected an integer, not " +
                         std::string(py::str(py::type::of(v).attr("__name__"))));
  }
  const py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  if (positive ? i <= py::int_(0) : i < py::int_(0)) {
    raise(StatusCode::kInvalidArgument,
          std::string(what) + " is " + std::string(py::repr(i)) + (positive ? " (expected > 0)" : " (expected >= 0)"));
  }
  if (i > py::int_(std::numeric_limits<std::uint64_t>::max())) {
    raise(StatusCode::kOutOfRange, std::string(what) + " is " + std::string(py::repr(i)) + " (beyond any region: 2**64 bytes)");
  }
  return i.cast<std::uint64_t>();
}

PyRequest make_request(const std::string& op, const PyRegion& local, const py::object& local_offset, const py::object& peer,
                       const py::object& remote, const py::object& remote_offset, const py::object& length, const std::string& qos,
                       std::optional<double> deadline_ms, std::optional<double> timeout_ms) {
  PyRequest r;
  r.request.op = parse_op(op);
  if (!local.state) raise(StatusCode::kNotFound, "local: an unregistered region");
  r.engine = local.engine;
  r.regions.push_back(local.state);
  r.request.local_region = local.state->region.handle;
  r.request.local_offset = byte_index("local_offset", local_offset);
  r.request.peer = peer_address(peer);
  // A handle means nothing without whose it is: ours with no peer, the
  // peer's with one. Mixed, the bytes would land in an unrelated region.
  if (py::isinstance<PyRegion>(remote) != peer.is_none()) {
    raise(StatusCode::kInvalidArgument,
          "remote: one of this engine's Regions goes with peer=None, a peer's region (or its handle) with that peer");
  }
  if (py::isinstance<PyRegion>(remote)) {  // one of this engine's own regions (peer None)
    const auto& other = remote.cast<const PyRegion&>();
    if (!other.state) raise(StatusCode::kNotFound, "remote: an unregistered region");
    check_same_engine(*local.engine, other.engine, "remote");
    r.regions.push_back(other.state);
    r.request.remote_region = other.state->region.handle;
  } else {
    r.request.remote_region = remote_handle(remote, r.request.peer);
  }
  r.request.remote_offset = byte_index("remote_offset", remote_offset);
  r.request.length = byte_index("length", length, /*positive=*/true);
  r.request.qos = parse_qos(qos);
  milliseconds_ns("deadline_ms", deadline_ms);
  r.deadline_ms = deadline_ms;
  r.request.timeout_ns = milliseconds_ns("timeout_ms", timeout_ms);
  return r;
}

// A tensor's address and byte count from data_ptr(), numel() and
// element_size(): whole numbers of 64 bits, a count that does not wrap (an
// object claiming 2^62 elements of 4 bytes registered 4 bytes).
std::pair<std::uintptr_t, std::size_t> tensor_extent(const py::object& tensor) {
  auto whole = [&](const char* method) {
    const py::object v = tensor.attr(method)();
    PyObject* index = PyNumber_Index(v.ptr());  // an int, or what says it is one (numpy's); not a float
    if (index == nullptr) PyErr_Clear();
    const auto whole_number = py::reinterpret_steal<py::int_>(index);
    if (!whole_number || whole_number < py::int_(0) || whole_number > py::int_(UINT64_MAX)) {
      raise(StatusCode::kInvalidArgument,
            fmt::format("register: the tensor's {}() is {}, not a whole number of 0..2^64-1", method,
                        std::string(py::repr(v))));
    }
    return whole_number.cast<std::uint64_t>();
  };
  const std::uint64_t ptr = whole("data_ptr");
  std::uint64_t length = 0;
  if (__builtin_mul_overflow(whole("numel"), whole("element_size"), &length)) {
    raise(StatusCode::kInvalidArgument, "register: the tensor's numel() * element_size() is more than 2^64 bytes");
  }
  return {static_cast<std::uintptr_t>(ptr), static_cast<std::size_t>(length)};
}

// A tensor registered through data_ptr() holds no buffer export: resize_()
// or set_() can move its storage and free the registered memory; so can a
// numpy array's resize(refcheck=False) despite our export. Caught at submit
// (a move during a transfer cannot be, docs/python.md says so).
void check_unmoved(const RegionState& state) {
  if (state.view) {
    Py_buffer now{};
    if (PyObject_GetBuffer(state.owner.ptr(), &now, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
      const py::error_already_set why;
      raise(StatusCode::kFailedPrecondition,
            fmt::format("submit: the buffer of region {} can no longer be exported ({}); unregister it", state.region.handle,
                        why.what()));
    }
    const auto ptr = reinterpret_cast<std::uintptr_t>(now.buf);
    const auto length = static_cast<std::uint64_t>(now.len);
    PyBuffer_Release(&now);
    if (ptr != state.region.base || length != state.region.length) {
      raise(StatusCode::kFailedPrecondition,
            fmt::format("submit: the buffer of region {} moved or changed size since register ({} bytes at {:#x}, now "
                        "{} at {:#x}: a resize with its reference check off); unregister it and register it again",
                        state.region.handle, state.region.length, state.region.base, length, ptr));
    }
    return;
  }
  if (!state.tensor) return;
  const auto [ptr, length] = tensor_extent(state.owner);
  if (ptr != state.region.base || length != state.region.length) {
    raise(StatusCode::kFailedPrecondition,
          fmt::format("submit: the tensor of region {} moved or changed size since register ({} bytes at {:#x}, now {} "
                      "at {:#x}: resize_() or set_()); unregister it and register it again",
                      state.region.handle, state.region.length, state.region.base, length, ptr));
  }
}

// Requests as a Batch, after submit's checks, with no deadline set yet;
// `regions` gets each region of this engine they name, once.
engine::Batch checked_batch(const EngineState& s, const std::vector<PyRequest>& requests, std::string notification,
                            std::vector<std::shared_ptr<RegionState>>& regions) {
  engine::Batch b;
  b.notification = std::move(notification);
  b.requests.reserve(requests.size());
  for (const PyRequest& r : requests) {
    check_same_engine(s, r.engine, "submit: local");
    for (const auto& region : r.regions) {  // a batch names a few regions, many times each
      if (std::ranges::find(regions, region) != regions.end()) continue;
      check_unmoved(*region);
      regions.push_back(region);
    }
    b.requests.push_back(r.request);
  }
  return b;
}

// Relative deadlines (ms) made absolute on the engine's clock.
void set_deadlines(engine::Batch& b, const std::vector<std::optional<double>>& deadlines_ms, baton::TimeNs now) {
  for (std::size_t i = 0; i < b.requests.size(); ++i) {
    if (deadlines_ms[i]) b.requests[i].deadline_ns = now + milliseconds_ns("deadline_ms", deadlines_ms[i]);
  }
}

std::vector<std::optional<double>> deadlines_of(const std::vector<PyRequest>& requests) {
  std::vector<std::optional<double>> out;
  out.reserve(requests.size());
  for (const PyRequest& r : requests) out.push_back(r.deadline_ms);
  return out;
}

// Requests with their deadlines made absolute on the engine's clock.
engine::Batch to_batch(const EngineState& s, engine::Engine& e, const std::vector<PyRequest>& requests,
                       std::string notification) {
  std::vector<std::shared_ptr<RegionState>> regions;
  engine::Batch b = checked_batch(s, requests, std::move(notification), regions);
  set_deadlines(b, deadlines_of(requests), e.now_ns());
  return b;
}

// Engine.prepare(): requests converted and checked once, submitted many
// times (engine::PreparedBatch). The tensors are checked unmoved at every
// submit, the deadlines made absolute at every submit.
struct PyPrepared {
  std::shared_ptr<EngineState> engine;
  std::mutex mutex;  // one submit at a time: a stale resolution is rewritten by the submit that finds it
  engine::PreparedBatch batch;
  std::vector<std::optional<double>> deadlines_ms;
  bool with_deadlines = false;
  std::vector<std::shared_ptr<RegionState>> regions;
  std::uint64_t bytes = 0;
};

// Engine::wait in slices, looking for a signal between them with the GIL: a
// wait that never comes back to Python never sees Ctrl-C. Called without
// the GIL; `interrupted` says a signal handler raised (its exception is set,
// for the caller to throw once it holds the GIL again).
Status wait_interruptible(engine::Engine& e, engine::BatchHandle h, baton::TimeNs limit, bool& interrupted) {
  constexpr baton::TimeNs kSlice = 50'000'000;  // how late Ctrl-C may be seen
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const baton::TimeNs left =
        limit - std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    Status s = e.wait(h, std::clamp<baton::TimeNs>(left, 0, kSlice));
    if (s.code() != StatusCode::kTimeout) return s;
    if (left <= kSlice) return Status::timeout("wait: batch {} still running after {} s", h.id, limit / 1e9);
    GilTaken gil;
    // A first interrupt's exception, still pending while a cancelled batch
    // settles, is set aside: a handler run over it raised SystemError. A
    // second one replaces it, as a second Ctrl-C would in Python.
    PyObject* type = nullptr;
    PyObject* value = nullptr;
    PyObject* trace = nullptr;
    PyErr_Fetch(&type, &value, &trace);
    if (PyErr_CheckSignals() != 0) {
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(trace);
      interrupted = true;
      return s;
    }
    PyErr_Restore(type, value, trace);
  }
}

// Wait, then the batch's own failure as an exception; the batch stays known
// (after Ctrl-C too: it runs on, for the caller to cancel or wait again).
void wait_batch(engine::Engine& e, engine::BatchHandle h, std::optional<double> timeout_s) {
  const baton::TimeNs limit = seconds_ns("timeout", timeout_s.value_or(365.0 * 24 * 3600));
  Status waited;
  engine::BatchStatus st;
  bool interrupted = false;
  {
    GilReleased release;
    waited = wait_interruptible(e, h, limit, interrupted);
    if (waited.is_ok()) {
      auto polled = e.poll(h);
      if (polled) st = std::move(*polled);
      else waited = polled.error();
    }
  }
  if (interrupted) throw py::error_already_set();
  ok_or_raise(waited);
  ok_or_raise(st.status);
}

// One request, start to end: submit, wait, release. Past `timeout_s`, or
// on Ctrl-C, the request is cancelled, and the Timeout (or the
// KeyboardInterrupt) comes once it ended: the caller must know that nothing
// more lands in its buffer once this returns.
// The wait a `timeout` in seconds allows (none: a year), refused before
// anything runs.
baton::TimeNs wait_limit(std::optional<double> timeout_s) {
  return seconds_ns("timeout", timeout_s.value_or(365.0 * 24 * 3600));
}

// A batch submitted by `submit` (called without the GIL), waited for in
// slices that see Ctrl-C, cancelled past `limit` (wait_limit(timeout_s)),
// released; raises its failure. `what` names the call in messages, `ran`
// what it moved ("request", or "batch" for several). A
// cancelled batch is waited for until it ended, so nothing lands in the
// buffer after the call returns: with a peer that stopped answering that is
// the engine's stall timeout, and the message says how long it took. A
// second Ctrl-C while it settles leaves it to the engine (released once it
// ended, as a dropped Batch is).
template <typename Submit>
void run_submitted(EngineState& es, engine::Engine& e, const char* what, const char* ran, Submit submit,
                   baton::TimeNs limit, std::optional<double> timeout_s) {
  Status failed;
  bool cancelled = false;
  bool interrupted = false;
  bool left_running = false;
  double settled_s = 0;
  {
    GilReleased release;
    baton::Result<engine::BatchHandle> submitted = submit();
    if (!submitted) {
      failed = submitted.error();
    } else {
      const engine::BatchHandle h = *submitted;
      Status waited = wait_interruptible(e, h, limit, interrupted);
      if (waited.code() == StatusCode::kTimeout) {
        cancelled = e.cancel(h).is_ok();  // not when it ended just now
        const auto start = std::chrono::steady_clock::now();
        bool again = false;
        waited = wait_interruptible(e, h, wait_limit(std::nullopt), again);  // a copy under way finishes first
        settled_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        left_running = again;
        interrupted = interrupted || again;
      }
      if (waited.is_ok()) {
        thread_local engine::BatchStatus status;  // its storage reused
        const Status polled = e.poll(h, status);
        failed = polled.is_ok() ? status.status : polled;
      } else {
        failed = waited;
      }
      if (left_running || !e.release(h).is_ok()) es.orphan(h);
    }
  }
  if (interrupted) throw py::error_already_set();
  if (cancelled) {
    // A slice on the wire to a peer that stopped answering ends only when
    // the path fails: say so rather than let the timeout look ignored.
    const std::string settled =
        settled_s < 0.5 ? std::string()
                        : fmt::format(" {:.1f} s later, once its slices on the wire had ended (a peer that stops "
                                      "answering holds them until the engine's stall_timeout)",
                                      settled_s);
    raise(StatusCode::kTimeout,
          fmt::format("{}: not done within {} s; the {} was cancelled{} (nothing more lands in the buffer)", what,
                      timeout_s.value_or(0), ran, settled));
  }
  ok_or_raise(failed);
}

void run_one(EngineState& es, const PyRequest& r, std::optional<double> timeout_s) {
  const char* op = r.request.op == engine::Op::kRead ? "read" : "write";
  auto e = es.get(op);
  const baton::TimeNs limit = wait_limit(timeout_s);
  engine::Batch batch = to_batch(es, *e, {r}, {});  // may raise: with the GIL
  run_submitted(es, *e, op, "request", [&] { return e->submit(batch); }, limit, timeout_s);
}

// The memory of a GPU array, read off its `__cuda_array_interface__`
// (version 2 or later: data, shape, typestr, strides). Anything malformed in
// it is InvalidArgument naming what, not a KeyError from deep inside.
void gpu_array_of(const py::object& obj, void*& ptr, std::size_t& length, int& device) {
  try {
    const py::dict cai = obj.attr("__cuda_array_interface__");
    if (cai.contains("strides") && !cai["strides"].is_none()) {
      raise(StatusCode::kInvalidArgument, "register: the GPU array is not contiguous (.contiguous() it first)");
    }
    const py::tuple data = cai["data"];
    if (data.size() != 2) raise(StatusCode::kInvalidArgument, "register: __cuda_array_interface__ data is not (pointer, read-only)");
    if (data[1].cast<bool>()) raise(StatusCode::kInvalidArgument, "register: the GPU array is read-only");
    std::size_t items = 1;
    for (const py::handle d : py::tuple(cai["shape"])) {
      if (__builtin_mul_overflow(items, d.cast<std::size_t>(), &items)) {
        raise(StatusCode::kInvalidArgument, "register: the GPU array's shape holds more than 2**64 items");
      }
    }
    const std::string typestr = cai["typestr"].cast<std::string>();
    std::size_t itemsize = 0;
    if (typestr.size() >= 3 && typestr.find_first_not_of("0123456789", 2) == std::string::npos) {
      itemsize = std::stoul(typestr.substr(2));
    }
    if (itemsize == 0 || __builtin_mul_overflow(items, itemsize, &length)) {
      raise(StatusCode::kInvalidArgument, "register: GPU array typestr \"" + typestr + "\" with that shape");
    }
    ptr = reinterpret_cast<void*>(data[0].cast<std::uintptr_t>());
    if (py::hasattr(obj, "device") && py::hasattr(obj.attr("device"), "index") &&
        !obj.attr("device").attr("index").is_none()) {
      device = obj.attr("device").attr("index").cast<int>();
    }
  } catch (py::error_already_set& e) {
    if (e.matches(exceptions().base)) throw;  // ours, already saying what
    raise(StatusCode::kInvalidArgument, fmt::format("register: a malformed __cuda_array_interface__ ({})", e.what()));
  } catch (const std::exception& e) {  // a cast that failed, a number too long
    raise(StatusCode::kInvalidArgument, fmt::format("register: a malformed __cuda_array_interface__ ({})", e.what()));
  }
}

// What register() takes: host memory (the buffer protocol, a CPU torch
// tensor) or GPU memory (`__cuda_array_interface__`: a CUDA torch tensor, a
// CuPy array; `kind` turns kVram and `device` the tensor's GPU, or -1 for
// the engine to read it off the pointer).
std::shared_ptr<RegionState> buffer_of(const py::object& obj, void*& ptr, std::size_t& length,
                                       engine::MemoryKind& kind, int& device) {
  auto state = std::make_shared<RegionState>();
  state->owner = obj;
  kind = engine::MemoryKind::kDram;
  device = -1;
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    gpu_array_of(obj, ptr, length, device);
    kind = engine::MemoryKind::kVram;
    // A CUDA torch tensor can move as a CPU one can (resize_, set_).
    state->tensor = py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size") && py::hasattr(obj, "numel");
    return state;
  }
  if (PyObject_CheckBuffer(obj.ptr())) {
    Py_buffer view{};
    if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      const py::error_already_set why;  // Python's reason (read-only, strided, a dtype with no buffer form)
      raise(StatusCode::kInvalidArgument, fmt::format("register: the buffer cannot be exported writable and "
                                                      "C-contiguous ({}); peers write into it",
                                                      why.what()));
    }
    // Python object pointers (numpy dtype=object): bytes a peer writes
    // there are pointers the interpreter follows (a segfault found so).
    if (view.format != nullptr && std::string_view(view.format).find('O') != std::string_view::npos) {
      const std::string format = view.format;
      PyBuffer_Release(&view);
      raise(StatusCode::kInvalidArgument,
            fmt::format("register: the buffer holds Python objects (format \"{}\"); plain bytes or numbers only",
                        format));
    }
    ptr = view.buf;
    length = static_cast<std::size_t>(view.len);
    state->view = view;
    return state;
  }
  if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "element_size") && py::hasattr(obj, "numel")) {
    if (py::hasattr(obj, "is_contiguous") && !obj.attr("is_contiguous")().cast<bool>()) {
      raise(StatusCode::kInvalidArgument, "register: the tensor is not contiguous (.contiguous() it first)");
    }
    const auto [address, bytes] = tensor_extent(obj);
    ptr = reinterpret_cast<void*>(address);
    length = bytes;
    state->tensor = true;
    return state;
  }
  throw py::type_error("register: expected an object with a writable buffer (numpy array, bytearray, memoryview), "
                       "a torch tensor or a GPU array (__cuda_array_interface__), not " +
                       std::string(py::str(py::type::of(obj).attr("__name__"))));
}

// A region registered while another thread closed the engine: close()
// took the regions it knew, so this one would have said registered, its
// buffer held, until the Engine object went. It is closed as they were.
void keep_unless_closed(EngineState& s, const std::shared_ptr<RegionState>& state, const char* call) {
  {
    std::lock_guard lock(s.mutex);
    if (s.engine) {
      s.regions[state->region.handle] = state;
      return;
    }
  }
  state->closed = true;
  state->views = py::object();
  raise(StatusCode::kUnavailable, std::string(call) + ": the engine was closed during the call");
}

// close() and leaving a `with` block: once, from any thread.
void close_engine(EngineState& s) {
  std::shared_ptr<engine::Engine> e;
  std::map<baton::transport::RegionHandle, std::shared_ptr<RegionState>> regions;
  {
    std::lock_guard lock(s.mutex);
    e = std::move(s.engine);
    regions.swap(s.regions);
  }
  // Views of allocated memory keep the engine (and the mapping) from here
  // on; a region object left over no longer does.
  for (auto& [handle, region] : regions) {
    region->views = py::object();
    region->closed = true;
  }
  if (e) {
    GilReleased release;
    e->shutdown();  // waiters wake; calls in flight finish on their own reference
    e.reset();
  }
  regions.clear();  // the buffers go once no peer can reach them
}

EngineState::~EngineState() { close_engine(*this); }

// engine.read / engine.write: one request with Request's keywords.
auto one_request(std::string op) {
  return [op](EngineState& s, const PyRegion& local, const py::object& local_offset, const py::object& peer,
              const py::object& remote, const py::object& remote_offset, const py::object& length, const std::string& qos,
              std::optional<double> deadline_ms, std::optional<double> timeout) {
    run_one(s, make_request(op, local, local_offset, peer, remote, remote_offset, length, qos, deadline_ms, std::nullopt),
            timeout);
  };
}

std::string state_name(baton::sched::RequestState s) { return std::string(baton::sched::to_string(s)); }

// `Region.__new__(Region)` made an object whose C++ part was never built,
// and pybind11 gives a method such an object's memory uninitialized (a
// hang on a garbage mutex, a segfault). Classes only the engine makes
// answer `__new__` with a TypeError instead. Set in the class's dict, not
// through setattr, which would also replace the type's creation slot;
// Engine and Request, which callers make and may subclass, keep theirs.
void refuse_bare_new(const py::handle& cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  const std::string name = py::str(cls.attr("__name__"));
  const py::cpp_function refuse([name](const py::args&, const py::kwargs&) -> py::object {
    throw py::type_error("baton." + name + " objects are made by the engine, not by " + name + ".__new__()");
  });
  if (PyDict_SetItemString(type->tp_dict, "__new__", py::staticmethod(refuse).ptr()) != 0) {
    throw py::error_already_set();
  }
  PyType_Modified(type);
}

// Engine and Request keep their __new__ (callers make and subclass them),
// and an object it made without __init__ has no C++ part either: the
// class's own attributes (methods, properties) are refused on one instead,
// dunders aside (__init__, __class__, repr). A subclass's attributes stay
// its own (set before super().__init__(), hasattr). Set once per class;
// subclasses inherit it.
getattrofunc generic_getattro = nullptr;
std::vector<PyTypeObject*> guarded_classes;

// Whether `name` is an attribute of the guarded class `self` is one of.
bool class_attribute(PyObject* self, PyObject* name) {
  for (PyTypeObject* cls : guarded_classes) {
    if (PyObject_TypeCheck(self, cls) != 0) return PyDict_Contains(cls->tp_dict, name) == 1;
  }
  return false;
}

PyObject* getattro_of_built(PyObject* self, PyObject* name) {
  if (!built(self) && PyUnicode_Check(name) != 0 && PyUnicode_Tailmatch(name, py::str("__").ptr(), 0, 2, -1) == 0 &&
      class_attribute(self, name)) {
    PyObject* cls = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(self)), "__name__");
    if (cls == nullptr) return nullptr;
    PyErr_Format(PyExc_TypeError, "%U.%U: this %U was made by %U.__new__() without __init__(): it has nothing behind it",
                 cls, name, cls, cls);
    Py_DECREF(cls);
    return nullptr;
  }
  return generic_getattro(self, name);
}

void refuse_unbuilt(const py::handle& cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  if (generic_getattro == nullptr) generic_getattro = type->tp_getattro;
  if (type->tp_getattro != generic_getattro) throw std::logic_error("refuse_unbuilt: a class with its own getattro");
  type->tp_getattro = getattro_of_built;
  guarded_classes.push_back(type);
  PyType_Modified(type);
}

}  // namespace

PYBIND11_MODULE(_baton, m) {
  m.doc() = "Baton: a deadline-driven KV-cache transfer engine (the compiled part of the `baton` package)";
  main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  register_exceptions(m);

  py::class_<PyRemoteRegion>(m, "RemoteRegion", "A peer's region as it exported it; it goes with that peer only")
      .def_property_readonly("handle", [](const PyRemoteRegion& r) { return r.region.key; })
      .def_property_readonly("base", [](const PyRemoteRegion& r) { return r.region.base; })
      .def_property_readonly("length", [](const PyRemoteRegion& r) { return r.region.length; })
      .def_property_readonly("staged", [](const PyRemoteRegion& r) { return r.region.staged; },
                             "True for the peer's GPU memory: its engine answers each transfer with a copy")
      .def_readonly("peer", &PyRemoteRegion::peer, "The address of the peer that exported it")
      .def("__repr__", [](const PyRemoteRegion& r) {
        return "RemoteRegion(peer=\"" + r.peer + "\", handle=" + std::to_string(r.region.key) +
               ", length=" + std::to_string(r.region.length) + (r.region.staged ? ", staged=True" : "") + ")";
      });

  py::class_<AllocatedView, std::shared_ptr<AllocatedView>>(
      m, "_AllocatedView", py::buffer_protocol(), "What Region.buffer's views of allocated memory hold")
      .def_buffer([](AllocatedView& v) {
        return py::buffer_info(v.base, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(v.length)}, {py::ssize_t{1}}, /*readonly=*/false);
      });

  py::class_<PyRegion>(m, "Region", "Memory registered with an engine")
      // After unregister the handle may name a later region: refused, not 0.
      .def_property_readonly("handle", [](const PyRegion& r) { return registered(r, "handle").handle; })
      .def_property_readonly("length", [](const PyRegion& r) { return registered(r, "length").length; })
      .def_property_readonly("address", [](const PyRegion& r) { return registered(r, "address").base; })
      .def_property_readonly("registered", [](const PyRegion& r) { return r.state != nullptr && !r.state->closed; })
      .def_property_readonly("buffer",
                             [](const PyRegion& r) -> py::object {
                               registered(r, "buffer");
                               if (!r.allocated) return r.state->owner;
                               if (r.state->unregistering) {
                                 raise(StatusCode::kFailedPrecondition,
                                       "buffer: the region is being unregistered (its memory is about to be unmapped)");
                               }
                               if (!r.state->views) {
                                 auto keeper = std::make_shared<AllocatedView>();
                                 keeper->engine = r.engine->get("buffer");
                                 keeper->base = reinterpret_cast<void*>(r.state->region.base);
                                 keeper->length = r.state->region.length;
                                 r.state->views = py::cast(keeper);
                               }
                               PyObject* view = PyMemoryView_FromObject(r.state->views.ptr());
                               if (view == nullptr) throw py::error_already_set();
                               return py::reinterpret_steal<py::object>(view);
                             })
      .def("__repr__", [](const PyRegion& r) {
        if (!r.state) return std::string("Region(unregistered)");
        return "Region(handle=" + std::to_string(r.state->region.handle) +
               ", length=" + std::to_string(r.state->region.length) + ")";
      });

  py::class_<PyPeer>(m, "Peer", "Another engine, by its handshake address")
      .def_readonly("address", &PyPeer::address)
      .def_property_readonly("regions",
                             [](const PyPeer& p) {
                               auto e = p.engine->get("regions");
                               std::optional<baton::Result<std::vector<baton::transport::RemoteRegion>>> r;
                               {
                                 GilReleased release;
                                 r.emplace(e->remote_regions(engine::Peer{p.address, {}}));
                               }
                               std::vector<PyRemoteRegion> out;
                               for (auto& region : value_or_raise(std::move(*r))) out.push_back({region, p.address});
                               return out;
                             })
      .def("__repr__", [](const PyPeer& p) { return "Peer(\"" + p.address + "\")"; });

  py::class_<PyRequest>(m, "Request", "One read or write between a local region and a peer's region")
      .def(py::init(&make_request), py::kw_only(), py::arg("op"), py::arg("local"), py::arg("local_offset") = py::int_(0),
           py::arg("peer"), py::arg("remote"), py::arg("remote_offset") = py::int_(0), py::arg("length"),
           py::arg("qos") = "prefill_bulk", py::arg("deadline_ms") = py::none(), py::arg("timeout_ms") = py::none())
      .def_property_readonly("op", [](const PyRequest& r) { return r.request.op == engine::Op::kRead ? "read" : "write"; })
      .def_property_readonly("length", [](const PyRequest& r) { return r.request.length; })
      .def_property_readonly("qos", [](const PyRequest& r) { return std::string(baton::sched::to_string(r.request.qos)); });

  py::class_<PyBatch>(m, "Batch", "Requests submitted together")
      .def_property_readonly("id", [](const PyBatch& b) { return b.handle.id; })
      .def("wait", [](const PyBatch& b, std::optional<double> timeout) { wait_batch(*b.engine->get("wait"), b.handle, timeout); },
           py::arg("timeout") = py::none(),
           "Until every request ended; raises the batch's failure, or Timeout when `timeout` (s) passed first")
      .def_property_readonly("done",
                             [](const PyBatch& b) {
                               auto e = b.engine->get("done");
                               std::optional<baton::Result<engine::BatchStatus>> st;
                               {
                                 GilReleased release;
                                 st.emplace(e->poll(b.handle));
                               }
                               return value_or_raise(std::move(*st)).done;
                             })
      .def_property_readonly("status",
                             [](const PyBatch& b) -> py::object {
                               auto e = b.engine->get("status");
                               auto st = value_or_raise(e->poll(b.handle));
                               if (!st.done) return py::none();
                               return py::str(st.status.is_ok() ? std::string("ok") : st.status.to_string());
                             },
                             "None while running, then \"ok\" or the failure")
      .def_property_readonly("bytes", [](const PyBatch& b) { return b.bytes; })
      .def_property_readonly("bytes_done",
                             [](const PyBatch& b) { return value_or_raise(b.engine->get("bytes_done")->poll(b.handle)).bytes_done; })
      .def_property_readonly("states",
                             [](const PyBatch& b) {
                               auto st = value_or_raise(b.engine->get("states")->poll(b.handle));
                               std::vector<std::string> out;
                               for (const auto& r : st.requests) out.push_back(state_name(r.state));
                               return out;
                             })
      .def_property_readonly("deadlines_missed",
                             [](const PyBatch& b) {
                               auto st = value_or_raise(b.engine->get("deadlines_missed")->poll(b.handle));
                               std::size_t missed = 0;
                               for (const auto& r : st.requests) {
                                 const bool ended = r.state != baton::sched::RequestState::kQueued &&
                                                    r.state != baton::sched::RequestState::kRunning &&
                                                    r.state != baton::sched::RequestState::kCancelling;
                                 missed += ended && r.deadline_missed() ? 1 : 0;
                               }
                               return missed;
                             },
                             "Requests with a deadline that ended after it, or ended without completing")
      .def("_engine_fd", [](const PyBatch& b) { return b.engine->get("await")->batch_event_fd(); })
      .def_property_readonly("_engine", [](const PyBatch& b) { return b.engine; })
      .def("cancel", [](const PyBatch& b) { ok_or_raise(b.engine->get("cancel")->cancel(b.handle)); })
      .def("release", [](PyBatch& b) {
        const Status s = b.engine->get("release")->release(b.handle);
        if (s.is_ok() || s.code() == StatusCode::kNotFound) b.released = true;
        ok_or_raise(s);
      });

  py::class_<PyPrepared, std::shared_ptr<PyPrepared>>(m, "PreparedBatch",
                                                      "Requests checked once and submitted many times (Engine.prepare)")
      .def("submit",
           [](std::shared_ptr<PyPrepared> p) {
             auto e = p->engine->get("submit");
             for (const auto& region : p->regions) check_unmoved(*region);
             // Deadlines count from this submit: a copy with them made absolute.
             std::optional<engine::Batch> timed;
             if (p->with_deadlines) {
               timed = p->batch.batch();
               set_deadlines(*timed, p->deadlines_ms, e->now_ns());
             }
             baton::Result<engine::BatchHandle> h = std::unexpected(Status::internal("not run"));
             {
               GilReleased release;
               p->engine->sweep_orphans(*e);
               std::lock_guard one_at_a_time(p->mutex);
               h = timed ? e->submit(*timed) : e->submit(p->batch);
             }
             return PyBatch(p->engine, value_or_raise(std::move(h)), p->bytes);
           },
           "Submits the requests again, as Engine.submit would: a Batch")
      .def("run",
           [](std::shared_ptr<PyPrepared> p, std::optional<double> timeout) {
             auto e = p->engine->get("run");
             const baton::TimeNs limit = wait_limit(timeout);
             for (const auto& region : p->regions) check_unmoved(*region);
             std::optional<engine::Batch> timed;
             if (p->with_deadlines) {
               timed = p->batch.batch();
               set_deadlines(*timed, p->deadlines_ms, e->now_ns());
             }
             run_submitted(*p->engine, *e, "run", p->batch.batch().requests.size() == 1 ? "request" : "batch", [&] {
               p->engine->sweep_orphans(*e);
               std::lock_guard one_at_a_time(p->mutex);
               return timed ? e->submit(*timed) : e->submit(p->batch);
             }, limit, timeout);
           },
           py::arg("timeout") = py::none(),
           "Submits the requests again and waits until they ended (Engine.read for a prepared batch): raises the "
           "first failure; past `timeout` seconds cancels them and raises Timeout")
      .def("__len__", [](const PyPrepared& p) { return p.batch.batch().requests.size(); })
      .def_property_readonly("bytes", [](const PyPrepared& p) { return p.bytes; });

  py::class_<EngineState, std::shared_ptr<EngineState>>(m, "Engine", "A Baton engine: registered memory, peers, batches")
      .def(py::init([](const std::string& listen, std::optional<std::string> ucx_tls, std::optional<std::string> policy_file,
                       std::optional<std::string> metrics_address, std::optional<std::string> secret_file, int lanes,
                       std::optional<std::string> topology_model, bool peer_failure_detection,
                       bool same_host_copy, long long direct_copy_max_bytes, std::vector<std::string> nics,
                       int copy_threads, int progress_threads, bool gpu_paths, bool allow_unauthenticated,
                       std::optional<double> stall_timeout, long long tcp_segment_bytes,
                       long long tcp_receive_buffer_bytes) {
             // An empty string is a mistake (an unset variable), never the
             // default that None asks for: a secret_file of "" gave an engine
             // without a secret.
             for (const auto& [name, value] : {std::pair{"ucx_tls", &ucx_tls}, {"policy_file", &policy_file},
                                               {"metrics_address", &metrics_address}, {"secret_file", &secret_file},
                                               {"topology_model", &topology_model}}) {
               if (*value && (*value)->empty()) {
                 raise(StatusCode::kInvalidArgument,
                       std::string("Engine: ") + name + "=\"\" (None asks for the default)");
               }
             }
             engine::EngineConfig c;
             c.ucx.listen_address = listen;
             if (ucx_tls) c.ucx.tls = *ucx_tls;
             if (policy_file) c.policy_file = *policy_file;
             if (metrics_address) c.metrics_address = *metrics_address;
             if (secret_file) c.ucx.secret_file = *secret_file;
             if (topology_model) c.topology_model = *topology_model;
             // Checked here too, so the error names this call's argument,
             // not the C++ field behind it (lanes_per_peer).
             if (lanes < 1 || lanes > baton::sched::PathCredits::kMaxLanes) {
               raise(StatusCode::kInvalidArgument,
                     fmt::format("Engine: lanes={} (expected 1..{})", lanes, baton::sched::PathCredits::kMaxLanes));
             }
             if (!nics.empty() && static_cast<std::size_t>(lanes) < nics.size()) {
               raise(StatusCode::kInvalidArgument,
                     fmt::format("Engine: lanes={} for {} nics (every NIC needs a lane: lanes >= len(nics))", lanes,
                                 nics.size()));
             }
             c.ucx.lanes_per_peer = lanes;
             c.ucx.peer_failure_detection = peer_failure_detection;
             c.ucx.same_host_copy = same_host_copy;
             c.ucx.direct_copy_max_bytes = non_negative("direct_copy_max_bytes", direct_copy_max_bytes);
             c.ucx.nics = std::move(nics);
             c.ucx.copy_threads = copy_threads;
             c.ucx.progress_threads = progress_threads;
             c.gpu_paths = gpu_paths;
             c.ucx.allow_unauthenticated = allow_unauthenticated;
             c.ucx.tcp_segment_bytes = non_negative("tcp_segment_bytes", tcp_segment_bytes);
             c.ucx.tcp_receive_buffer_bytes = non_negative("tcp_receive_buffer_bytes", tcp_receive_buffer_bytes);
             if (stall_timeout) {  // whole milliseconds, rounded up: a small one does not become 0 ("never")
               c.ucx.stall_timeout_ms = (seconds_ns("stall_timeout", *stall_timeout) + 999'999) / 1'000'000;
             }
             auto state = std::make_shared<EngineState>();
             baton::Result<std::unique_ptr<engine::Engine>> made = std::unexpected(Status::internal("not run"));
             {
               GilReleased release;
               made = engine::Engine::create(std::move(c));
             }
             state->engine = std::shared_ptr<engine::Engine>(value_or_raise(std::move(made)).release());
             return state;
           }),
           py::kw_only(), py::arg("listen") = "127.0.0.1:0", py::arg("ucx_tls") = py::none(),
           py::arg("policy_file") = py::none(), py::arg("metrics_address") = py::none(),
           py::arg("secret_file") = py::none(), py::arg("lanes") = 2, py::arg("topology_model") = py::none(),
           py::arg("peer_failure_detection") = true, py::arg("same_host_copy") = true,
           py::arg("direct_copy_max_bytes") = static_cast<long long>(transport::UcxConfig{}.direct_copy_max_bytes),
           py::arg("nics") = std::vector<std::string>{}, py::arg("copy_threads") = transport::UcxConfig{}.copy_threads,
           py::arg("progress_threads") = transport::UcxConfig{}.progress_threads, py::arg("gpu_paths") = false,
           py::arg("allow_unauthenticated") = false, py::arg("stall_timeout") = py::none(),
           py::arg("tcp_segment_bytes") = static_cast<long long>(transport::UcxConfig{}.tcp_segment_bytes),
           py::arg("tcp_receive_buffer_bytes") = static_cast<long long>(transport::UcxConfig{}.tcp_receive_buffer_bytes))
      .def_property_readonly("address", [](EngineState& s) { return s.get("address")->address(); })
      .def_property_readonly("metrics_address", [](EngineState& s) { return s.get("metrics_address")->metrics_address(); })
      .def_property_readonly(
          "ucx_settings",
          [](EngineState& s) {
            py::dict d;
            const auto engine = s.get("ucx_settings");
            for (const auto& [name, value] : engine->ucx_settings()) d[py::str(name)] = value;
            return d;
          },
          "The UCX variables Baton set for this engine ({\"UCX_TCP_RCVBUF\": \"1048576\", ...}); the environment's win")
      .def_property_readonly("batch_event_fd", [](EngineState& s) { return s.get("batch_event_fd")->batch_event_fd(); })
      .def_property_readonly("closed", [](EngineState& s) {
        std::lock_guard lock(s.mutex);
        return s.engine == nullptr;
      })
      .def("close", &close_engine,
           "Shuts the engine down: running batches are cancelled, peers see it go; later calls raise Unavailable")
      .def("__enter__",
           [](std::shared_ptr<EngineState> s) {
             (void)s->get("with");  // a closed engine is not entered again
             return s;
           })
      .def("__exit__", [](EngineState& s, py::args) {
        close_engine(s);
        return false;
      })
      .def("register",
           [](std::shared_ptr<EngineState> sp, const py::object& obj) {
             EngineState& s = *sp;
             auto e = s.get("register");
             void* ptr = nullptr;
             std::size_t length = 0;
             engine::MemoryKind kind = engine::MemoryKind::kDram;
             int device = -1;
             auto state = buffer_of(obj, ptr, length, kind, device);
             if (length == 0) raise(StatusCode::kInvalidArgument, "register: the buffer is empty");
             baton::Result<engine::Region> r = std::unexpected(Status::internal("not run"));
             {
               GilReleased release;
               r = e->register_memory(ptr, length, kind, device);
             }
             state->region = value_or_raise(std::move(r));
             keep_unless_closed(s, state, "register");
             return PyRegion{state, false, sp};
           },
           py::arg("buffer"),
           "Registers a writable buffer (numpy, bytearray, memoryview, CPU torch tensor) or GPU memory (an object "
           "with __cuda_array_interface__: a CUDA torch tensor, a CuPy array)")
      .def("allocate",
           [](std::shared_ptr<EngineState> sp, long long nbytes) {
             EngineState& s = *sp;
             auto e = s.get("allocate");
             if (nbytes <= 0) raise(StatusCode::kInvalidArgument, fmt::format("allocate: nbytes is {} (expected > 0)", nbytes));
             const auto n = static_cast<std::uint64_t>(nbytes);
             baton::Result<engine::Region> r = std::unexpected(Status::internal("not run"));
             {
               GilReleased release;
               r = e->allocate_memory(n);
             }
             auto state = std::make_shared<RegionState>();
             state->region = value_or_raise(std::move(r));
             state->owner = py::none();
             keep_unless_closed(s, state, "allocate");
             return PyRegion{state, true, sp};
           },
           py::arg("nbytes"), "Memory the engine allocates and registers (Region.buffer is a writable memoryview)")
      .def("export",
           [](EngineState& s, const PyRegion& r, std::optional<std::vector<std::string>> peers) {
             if (!r.state) raise(StatusCode::kNotFound, "export: an unregistered region");
             check_same_engine(s, r.engine, "export");
             // The engine's empty list means every peer: an empty list here is a
             // mistake, not an allowlist of nobody.
             if (peers && peers->empty()) {
               raise(StatusCode::kInvalidArgument,
                     "export: peers=[] names no peer (peers=None exports to every peer that proved the secret)");
             }
             auto e = s.get("export");
             Status st;
             {
               GilReleased release;
               st = e->export_region(r.state->region.handle, peers.value_or(std::vector<std::string>{}));
             }
             ok_or_raise(st);
           },
           py::arg("region"), py::arg("peers") = py::none(),
           "Lets peers that proved the secret reach the region: all of them, or those named (\"host:port\")")
      .def("unregister",
           [](EngineState& s, PyRegion& r) {
             if (!r.state) raise(StatusCode::kNotFound, "unregister: the region was already unregistered");
             check_same_engine(s, r.engine, "unregister");
             auto e = s.get("unregister");
             if (r.state->unregistering) {
               raise(StatusCode::kFailedPrecondition, "unregister: another thread is unregistering the region");
             }
             if (r.state->has_live_views()) {
               raise(StatusCode::kFailedPrecondition,
                     "unregister: region " + std::to_string(r.state->region.handle) +
                         ": memoryviews or arrays of its Region.buffer are still alive (release() or drop them "
                         "first: unregistering unmaps that memory)");
             }
             Status st;
             r.state->unregistering = true;  // no view of Region.buffer from here on (it needs the GIL)
             {
               GilReleased release;
               st = e->unregister(r.state->region.handle);
             }
             if (!st.is_ok()) r.state->unregistering = false;
             ok_or_raise(st);
             std::shared_ptr<RegionState> gone;
             {
               std::lock_guard lock(s.mutex);
               s.regions.erase(r.state->region.handle);
               gone = std::move(r.state);
             }
             gone.reset();  // outside the mutex: it may release the GIL (AllocatedView)
           },
           py::arg("region"), "Revokes the region from peers and releases it")
      .def("connect",
           [](std::shared_ptr<EngineState> s, const std::string& address) {
             auto e = s->get("connect");
             baton::Result<engine::Peer> p = std::unexpected(Status::internal("not run"));
             {
               GilReleased release;
               p = e->connect(address);
             }
             return PyPeer{s, value_or_raise(std::move(p)).address};
           },
           py::arg("address"), "Handshake with a peer (\"host:port\"); blocks until ready")
      .def("refresh",
           [](EngineState& s, const PyPeer& p, double timeout) {
             auto e = s.get("refresh");
             // Rounded up: a tiny positive timeout is not the refused 0.
             const baton::TimeNs limit = seconds_ns("refresh: timeout", timeout) + (timeout > 0 ? 1 : 0);
             Status st;
             {
               GilReleased release;
               st = e->refresh(engine::Peer{p.address, {}}, limit);
             }
             ok_or_raise(st);
           },
           py::arg("peer"), py::arg("timeout") = 5.0)
      .def("submit",
           [](std::shared_ptr<EngineState> s, const py::object& given, const py::bytes& notification) {
             auto e = s->get("submit");
             const std::vector<PyRequest> requests = requests_of("submit", given);
             std::string note = notification;
             engine::Batch b = to_batch(*s, *e, requests, std::move(note));
             std::uint64_t bytes = 0;
             for (const auto& r : b.requests) bytes += r.length;
             baton::Result<engine::BatchHandle> h = std::unexpected(Status::internal("not run"));
             {
               GilReleased release;
               s->sweep_orphans(*e);
               h = e->submit(b);
             }
             return PyBatch(s, value_or_raise(std::move(h)), bytes);
           },
           py::arg("requests"), py::arg("notification") = py::bytes(""))
      .def("prepare",
           [](std::shared_ptr<EngineState> s, const py::object& given, const py::bytes& notification) {
             auto e = s->get("prepare");
             const std::vector<PyRequest> requests = requests_of("prepare", given);
             auto p = std::make_shared<PyPrepared>();
             p->engine = s;
             engine::Batch b = checked_batch(*s, requests, std::string(notification), p->regions);
             // What every submit would refuse is refused once, here (a region
             // gone later is each submit's to say).
             Status checked;
             {
               GilReleased release;
               checked = e->check(b);
             }
             if (!checked.is_ok()) {  // check() answers as submit would, and says so
               std::string message = checked.message();
               if (message.starts_with("submit: ")) message.replace(0, 6, "prepare");
               raise(checked.code(), message);
             }
             for (const auto& r : b.requests) p->bytes += r.length;
             p->deadlines_ms = deadlines_of(requests);
             p->with_deadlines = std::ranges::any_of(p->deadlines_ms, [](const auto& d) { return d.has_value(); });
             p->batch = engine::PreparedBatch(std::move(b));
             return p;
           },
           py::arg("requests"), py::arg("notification") = py::bytes(""),
           "The requests checked and converted once, for PreparedBatch.submit() to submit many times")
      .def("read", one_request("read"), py::kw_only(), py::arg("local"), py::arg("local_offset") = 0, py::arg("peer"),
           py::arg("remote"), py::arg("remote_offset") = 0, py::arg("length"), py::arg("qos") = "prefill_bulk",
           py::arg("deadline_ms") = py::none(), py::arg("timeout") = py::none(),
           "One read, synchronous: raises its failure")
      .def("write", one_request("write"), py::kw_only(), py::arg("local"), py::arg("local_offset") = py::int_(0),
           py::arg("peer"), py::arg("remote"), py::arg("remote_offset") = py::int_(0), py::arg("length"),
           py::arg("qos") = "prefill_bulk", py::arg("deadline_ms") = py::none(), py::arg("timeout") = py::none(),
           "One write, synchronous: raises its failure")
      .def("take_notifications",
           [](EngineState& s) {
             auto e = s.get("take_notifications");
             std::vector<baton::transport::Notification> got;
             {
               GilReleased release;
               got = e->take_notifications();
             }
             py::list out;
             for (auto& n : got) out.append(py::make_tuple(n.from, py::bytes(n.message)));
             return out;
           })
      .def("metrics_text", [](EngineState& s) {
        auto e = s.get("metrics_text");
        GilReleased release;
        return e->metrics_text();
      });

  for (const char* made_by_the_engine : {"RemoteRegion", "_AllocatedView", "Region", "Peer", "Batch", "PreparedBatch"}) {
    refuse_bare_new(m.attr(made_by_the_engine));
  }
  for (const char* made_by_callers : {"Engine", "Request"}) refuse_unbuilt(m.attr(made_by_callers));
}
