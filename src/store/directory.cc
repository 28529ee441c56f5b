#include "baton/store/directory.h"

#include <httplib.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "baton/common/log.h"

namespace baton::store {
namespace {

// etcd's watch answers are a header and the events of one revision; far
// below this for a directory of stores. The same bound holds an answer.
constexpr std::size_t kMaxWatchLineBytes = 4 << 20;
constexpr std::size_t kMaxAnswerBytes = 4 << 20;
// A call's whole time, its answer included: a read timeout alone bounds each
// read, so an endpoint that drips a byte every few seconds held register()
// (and SIGTERM behind it) without end.
constexpr auto kCallTimeout = std::chrono::seconds(10);
// etcd's answers nest a few levels. A deeper text is no answer of etcd's, and
// copying it would recurse as deep: an answer 100 000 levels deep overflowed
// the stack.
constexpr int kMaxJsonDepth = 32;

using nlohmann::json;

// `text` as JSON, discarded when malformed or nested deeper than etcd nests.
json parse_answer(std::string_view text) {
  bool too_deep = false;
  json j = json::parse(
      text,
      [&too_deep](int depth, json::parse_event_t, json&) {
        too_deep = too_deep || depth > kMaxJsonDepth;
        return !too_deep;
      },
      false);
  return too_deep ? json(json::value_t::discarded) : j;
}

std::string base64(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::optional<std::string> unbase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out(3 * in.size() / 4, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return std::nullopt;
  std::size_t pad = 0;
  if (!in.empty() && in.back() == '=') ++pad;
  if (in.size() > 1 && in[in.size() - 2] == '=') ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

// The key just past every key starting with `prefix` (etcd's range_end).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) != 0xff) {
      ++prefix.back();
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

json to_json(const StoreRecord& r) {
  return {{"name", r.name}, {"address", r.address}, {"engine_address", r.engine_address},
          {"capacity_bytes", r.capacity_bytes}, {"numa_nodes", r.numa_nodes}};
}

// A keepalive's answer for a lease etcd no longer has: its result carries
// no TTL (or 0). An answer without a result (an error) says nothing.
bool lease_expired(const json& beat) {
  const json result = beat.value("result", json());
  if (!result.is_object()) return false;
  const json ttl = result.value("TTL", json());
  if (ttl.is_null()) return true;
  if (ttl.is_number_integer()) return ttl.get<std::int64_t>() <= 0;
  return ttl.is_string() && (ttl.get<std::string>().empty() || ttl.get<std::string>().starts_with('-') ||
                             ttl.get<std::string>() == "0");
}

// splitmix64: a well-mixed 64-bit function, enough for rendezvous scores.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

struct Directory::State {
  std::string endpoint;
  std::string prefix;
  std::mutex mutex;
  std::condition_variable cv;
  std::string lease;  // etcd's lease id (a decimal string), once registered
  bool stop = false;
  std::thread keepalive;
  // The watch: its thread, and the stream's client while one is open (so
  // unwatch() can cut it short).
  std::thread watcher;
  std::atomic<bool> stop_watch = false;
  std::mutex stream_mutex;
  httplib::Client* stream = nullptr;

  // POST `body` to etcd's gateway `path`; the JSON answer, within
  // kCallTimeout and kMaxAnswerBytes.
  Result<json> post(const std::string& path, const json& body) const {
    httplib::Client client("http://" + endpoint);
    client.set_connection_timeout(2, 0);
    client.set_read_timeout(5, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string answer_text;
    bool too_long = false;
    req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
      too_long = too_long || answer_text.size() + n > kMaxAnswerBytes;
      if (!too_long) answer_text.append(data, n);
      return !too_long;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    bool sent = false;
    bool cut = false;
    {
      // A watchdog cuts the connection at the call's deadline, in whatever
      // part of the exchange it is; told first, then joined, on every way out.
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      std::jthread watchdog([&] {
        std::unique_lock lock(m);
        if (!cv.wait_for(lock, kCallTimeout, [&] { return done; })) {
          cut = true;
          client.stop();
        }
      });
      struct Finish {
        std::mutex& m;
        std::condition_variable& cv;
        bool& done;
        ~Finish() {
          {
            std::lock_guard lock(m);
            done = true;
          }
          cv.notify_all();
        }
      } finish{m, cv, done};
      sent = client.send(req, res, error);
    }
    if (too_long) {
      return std::unexpected(Status::unavailable("etcd {}{}: an answer above {} bytes", endpoint, path, kMaxAnswerBytes));
    }
    if (cut) {
      return std::unexpected(Status::unavailable("etcd {}{}: no whole answer within {} s", endpoint, path,
                                                 kCallTimeout.count()));
    }
    if (!sent) return std::unexpected(Status::unavailable("etcd {}{}: {}", endpoint, path, httplib::to_string(error)));
    json answer = parse_answer(answer_text);
    // Every gateway answer is an object; callers read its fields with value().
    if (res.status != 200 || answer.is_discarded() || !answer.is_object()) {
      return std::unexpected(
          Status::unavailable("etcd {}{}: HTTP {}: {}", endpoint, path, res.status, shown(answer_text, 200)));
    }
    return answer;
  }

  // The gateway writes int64 fields as strings; a number is taken too.
  static std::string int64_field(const json& object, const char* name) {
    const json v = object.value(name, json());
    return v.is_string() ? v.get<std::string>() : v.is_number_integer() ? v.dump() : std::string();
  }

  // A lease of `ttl_s` and `value` put under `key` with it, unless another
  // record holds the key: the lease id, or already_exists naming the
  // holder. A second store started under a live one's name overwrote its
  // record, and the first, renewing a lease that held no key any more,
  // was out of the directory for good. The same record (this store's own,
  // from before a restart on the same addresses) is taken over. Another
  // one is waited for until `wait_ns` passed: a predecessor that died
  // leaves at its lease's expiry, a live store renews it.
  Result<std::string> grant_and_put(std::int64_t ttl_s, const std::string& key, const std::string& value,
                                    TimeNs wait_ns = 0) const {
    auto grant = post("/v3/lease/grant", {{"TTL", ttl_s}});
    if (!grant) return std::unexpected(grant.error());
    const std::string lease = int64_field(*grant, "ID");
    if (lease.empty()) {
      return std::unexpected(Status::unavailable("etcd: a lease grant without an ID: {}", shown(grant->dump(), 200)));
    }
    const json put = {{"key", base64(key)}, {"value", base64(value)}, {"lease", lease}};
    const json create_only = {
        {"compare", json::array({{{"key", base64(key)}, {"target", "CREATE"}, {"result", "EQUAL"},
                                  {"create_revision", "0"}}})},
        {"success", json::array({{{"request_put", put}}})},
        {"failure", json::array({{{"request_range", {{"key", base64(key)}}}}})}};
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
    for (;;) {
      auto txn = post("/v3/kv/txn", create_only);
      if (!txn) return revoked(lease, txn.error());
      // Fields of another type are read as absent (value() with a default
      // of another type throws).
      if (const json ok = txn->value("succeeded", json()); ok.is_boolean() && ok.get<bool>()) return lease;
      // Who holds it: the range the failure branch read.
      std::string holder;
      const json responses = txn->value("responses", json());
      if (responses.is_array() && !responses.empty() && responses[0].is_object()) {
        const json range = responses[0].value("response_range", json());
        const json kvs = range.is_object() ? range.value("kvs", json()) : json();
        const json held = kvs.is_array() && !kvs.empty() && kvs[0].is_object() ? kvs[0].value("value", json()) : json();
        if (held.is_string()) holder = unbase64(held.get<std::string>()).value_or("");
      }
      if (holder == value) {
        auto again = post("/v3/kv/put", put);
        if (!again) return revoked(lease, again.error());
        return lease;
      }
      if (std::chrono::steady_clock::now() >= until) {
        return revoked(lease, Status::already_exists("etcd: {} is held by another store's record ({}); a live store "
                                                     "renews it, a dead one leaves when its lease expires",
                                                     key, shown(holder, 200)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

  // `why`, once the lease granted for a put that did not happen is revoked.
  std::unexpected<Status> revoked(const std::string& lease, Status why) const {
    (void)post("/v3/lease/revoke", {{"ID", lease}});
    return std::unexpected(std::move(why));
  }

  void stop_keepalive() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    cv.notify_all();
    if (keepalive.joinable()) keepalive.join();
  }
};

Directory::Directory(std::unique_ptr<State> state) : state_(std::move(state)) {}
Directory::~Directory() {
  unwatch();
  state_->stop_keepalive();
}

Result<std::unique_ptr<Directory>> Directory::connect(const std::string& endpoint, const std::string& prefix) {
  if (endpoint.empty() || prefix.empty()) {
    return std::unexpected(Status::invalid_argument("Directory: endpoint \"{}\", prefix \"{}\" (expected both)",
                                                    endpoint, prefix));
  }
  auto state = std::make_unique<State>();
  state->endpoint = endpoint;
  // A folder of records: "/baton/stores" listed "/baton/storesx/…" too.
  state->prefix = prefix.ends_with('/') ? prefix : prefix + "/";
  return std::unique_ptr<Directory>(new Directory(std::move(state)));
}

Status Directory::register_store(const StoreRecord& record, TimeNs ttl_ns) {
  // Printable ASCII, as a key and a host:port are: other bytes made the
  // JSON writer throw (a name of "\xff" ended `baton store` with a raw
  // exception), and a '/' would nest the key.
  auto plain = [](std::string_view text, bool slash_ok) {
    return !text.empty() && text.size() <= 255 && std::ranges::all_of(text, [&](char c) {
      return c > ' ' && c < '\x7f' && (slash_ok || c != '/');
    });
  };
  if (!plain(record.name, false) || !plain(record.address, true)) {
    return Status::invalid_argument("register_store: name \"{}\", address \"{}\" (expected both, printable ASCII "
                                    "without spaces, at most 255 bytes, and no '/' in the name)",
                                    shown(record.name), shown(record.address));
  }
  // etcd refuses a lease above 9e9 s, in an answer its gateway cuts short.
  constexpr TimeNs kMaxTtlNs = TimeNs{9'000'000'000} * 1'000'000'000;
  if (ttl_ns < 1'000'000'000 || ttl_ns > kMaxTtlNs) {
    return Status::invalid_argument("register_store: a TTL of {} ns (expected 1 s to etcd's most, 9e9 s)", ttl_ns);
  }
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->lease.empty()) return Status::invalid_argument("register_store: registered already");
  }
  const std::int64_t ttl_s = ttl_ns / 1'000'000'000;
  const std::string key = state_->prefix + record.name;
  const std::string value = to_json(record).dump();
  // A predecessor under this name that died leaves within its lease (which
  // was ours to choose too): waited for that long, and a second more.
  auto lease = state_->grant_and_put(ttl_s, key, value, ttl_ns + 1'000'000'000);
  if (!lease) return lease.error();
  std::lock_guard lock(state_->mutex);
  state_->lease = *lease;
  state_->stop = false;
  State* s = state_.get();
  state_->keepalive = std::thread([s, ttl_s, key, value, every = std::chrono::nanoseconds(ttl_ns / 3)] {
    std::unique_lock lock(s->mutex);
    bool out = false;  // our record is gone and could not be put back (said once)
    while (!s->cv.wait_for(lock, every, [s] { return s->stop; })) {
      const std::string lease = s->lease;
      lock.unlock();
      // A miss is retried at the next beat. A lease that expired meanwhile
      // (etcd, the network or this process stood still past the TTL) is
      // answered without a TTL: the record is gone, so it is put again under
      // a new lease; beating the dead one would keep this store out for good.
      auto beat = s->post("/v3/lease/keepalive", {{"ID", lease}});
      std::optional<std::string> renewed;
      if (beat && lease_expired(*beat)) {
        auto again = s->grant_and_put(ttl_s, key, value);
        if (again) {
          renewed = std::move(*again);
          if (std::exchange(out, false)) baton::logger().warn("store directory: {} is listed again", key);
        } else if (!std::exchange(out, true)) {
          // A store that stood still past its lease may find its name taken
          // (a replacement under the same name): it serves on, unlisted.
          baton::logger().warn("store directory: our lease expired and {} could not be listed again ({}); "
                               "requesters will not find this store until it is (tried each {} ms)",
                               key, again.error().message(), every.count() / 1'000'000);
        }
      }
      lock.lock();
      if (renewed) s->lease = std::move(*renewed);
    }
  });
  return Status::ok();
}

Status Directory::deregister() {
  {
    std::lock_guard lock(state_->mutex);
    if (state_->lease.empty()) return Status::invalid_argument("deregister: not registered");
  }
  state_->stop_keepalive();  // first: it may put the record under a new lease
  std::string lease;
  {
    std::lock_guard lock(state_->mutex);
    lease = state_->lease;
  }
  auto revoked = state_->post("/v3/lease/revoke", {{"ID", lease}});
  std::lock_guard lock(state_->mutex);
  state_->lease.clear();
  return revoked ? Status::ok() : revoked.error();
}

void Directory::abandon() {
  state_->stop_keepalive();
  std::lock_guard lock(state_->mutex);
  state_->lease.clear();
}

Result<std::vector<StoreRecord>> Directory::stores() {
  auto range = state_->post("/v3/kv/range",
                            {{"key", base64(state_->prefix)}, {"range_end", base64(prefix_end(state_->prefix))}});
  if (!range) return std::unexpected(range.error());
  std::vector<StoreRecord> out;
  const json kvs = range->value("kvs", json::array());
  if (!kvs.is_array()) return std::unexpected(Status::internal("etcd: a range answer whose kvs is no list"));
  for (const auto& kv : kvs) {
    if (!kv.is_object() || !kv.value("value", json()).is_string() || !kv.value("key", json("")).is_string()) {
      return std::unexpected(Status::internal("etcd: a range answer with a malformed entry"));
    }
    auto value = unbase64(kv.value("value", ""));
    json j = value ? parse_answer(*value) : json();
    try {
      if (j.is_discarded() || !j.is_object()) throw json::other_error::create(501, "not an object", nullptr);
      out.push_back({j.at("name").get<std::string>(), j.at("address").get<std::string>(),
                     j.at("engine_address").get<std::string>(), j.at("capacity_bytes").get<std::uint64_t>(),
                     j.at("numa_nodes").get<std::vector<int>>()});
    } catch (const json::exception& e) {
      return std::unexpected(Status::internal("etcd: the record under {} does not parse: {}",
                                              unbase64(kv.value("key", "")).value_or("?"), e.what()));
    }
  }
  std::ranges::sort(out, {}, &StoreRecord::name);
  return out;
}

Status Directory::watch(std::function<void(std::vector<StoreRecord>)> on_change) {
  if (!on_change) return Status::invalid_argument("watch: no callback");
  if (state_->watcher.joinable()) return Status::invalid_argument("watch: watching already");
  state_->stop_watch = false;
  const json create = {{"create_request",
                        {{"key", base64(state_->prefix)}, {"range_end", base64(prefix_end(state_->prefix))}}}};
  state_->watcher = std::thread([this, s = state_.get(), on_change = std::move(on_change), body = create.dump()] {
    while (!s->stop_watch) {
      httplib::Client client("http://" + s->endpoint);
      client.set_connection_timeout(1, 0);
      client.set_read_timeout(5, 0);  // an idle stream is re-established this often
      {
        std::lock_guard lock(s->stream_mutex);
        if (s->stop_watch) break;
        s->stream = &client;
      }
      httplib::Request req;
      req.method = "POST";
      req.path = "/v3/watch";
      req.body = body;
      req.set_header("Content-Type", "application/json");
      std::string pending;
      // Newline-delimited JSON: the first answer says the watch exists, the
      // others carry events. Either way the list is read again.
      req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
        pending.append(data, n);
        // A line that long is no watch answer: cut the stream, read afresh.
        if (pending.size() > kMaxWatchLineBytes && pending.find('\n') == std::string::npos) return false;
        for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
          const json message = parse_answer(std::string_view(pending).substr(0, nl));
          pending.erase(0, nl + 1);
          // Anything but {"result": {"created": true} or {"events": [...]}}
          // changes nothing; a field of another type is not a reason to stop.
          const json result = message.is_object() ? message.value("result", json::object()) : json::object();
          if (!result.is_object()) continue;
          const json created = result.value("created", json(false));
          const json events = result.value("events", json::array());
          if ((created.is_boolean() && created.get<bool>()) || (events.is_array() && !events.empty())) {
            if (auto live = stores(); live) on_change(std::move(*live));
          }
        }
        return !s->stop_watch.load();
      };
      (void)client.send(req);
      {
        std::lock_guard lock(s->stream_mutex);
        s->stream = nullptr;
      }
      if (!s->stop_watch) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  return Status::ok();
}

void Directory::unwatch() {
  if (!state_->watcher.joinable()) return;
  state_->stop_watch = true;
  {
    std::lock_guard lock(state_->stream_mutex);
    if (state_->stream != nullptr) state_->stream->stop();
  }
  state_->watcher.join();
}

std::optional<std::size_t> place(std::uint64_t block_hash, std::span<const StoreRecord> stores) {
  std::optional<std::size_t> best;
  std::uint64_t best_score = 0;
  for (std::size_t i = 0; i < stores.size(); ++i) {
    const std::uint64_t name = std::hash<std::string>{}(stores[i].name);
    const std::uint64_t score = mix(name ^ mix(block_hash));
    if (!best || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace baton::store
