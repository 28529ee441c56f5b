// Raw UCX writes that complete when they landed: a window of ucp_put_nbx
// followed by ucp_ep_flush_nbx, the next window once the flush completed.
// The baseline for Baton's writes that `ucx_perftest -t ucp_put_bw` is not:
// over TCP (UCX's software RMA) a put completes once UCX holds its bytes,
// so perftest's window bounds nothing on the wire, while a Baton write
// completes when the holder has the bytes in place (docs/results.md,
// "Writes that landed"). Same working set as perftest: every put of a window
// goes to one block at the same offset.
//
//   baton_raw_put_flush --listen [HOST:]PORT [--err-peer]   (HOST: 127.0.0.1)
//   baton_raw_put_flush --connect HOST:PORT --size BYTES --window N --duration S [--err-peer]
//
// The client prints one JSON line: {"size", "window", "puts", "seconds",
// "gbps", "puts_per_s", "window_p50_us", "window_p99_us"}. UCX settings come from the environment (UCX_TLS,
// UCX_TCP_*), as for ucx_perftest. Addresses and the rkey travel over a plain
// TCP socket first, as perftest's do.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "baton_raw_put_flush: %s\n", what.c_str());
  std::exit(1);
}

void check(ucs_status_t s, const char* what) {
  if (s != UCS_OK) die(std::string(what) + ": " + ucs_status_string(s));
}

// Length-prefixed blobs over the setup socket.
void send_blob(int fd, const void* data, std::uint64_t n) {
  if (::send(fd, &n, sizeof n, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof n)) die("setup send");
  const auto* p = static_cast<const char*>(data);
  for (std::uint64_t done = 0; done < n;) {
    const ssize_t w = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (w <= 0) die("setup send");
    done += static_cast<std::uint64_t>(w);
  }
}

std::vector<char> recv_blob(int fd) {
  std::uint64_t n = 0;
  if (::recv(fd, &n, sizeof n, MSG_WAITALL) != static_cast<ssize_t>(sizeof n) || n > (1u << 20)) die("setup recv");
  std::vector<char> out(n);
  if (n > 0 && ::recv(fd, out.data(), n, MSG_WAITALL) != static_cast<ssize_t>(n)) die("setup recv");
  return out;
}

constexpr auto kWaitLimit = std::chrono::seconds(30);
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 30;

struct Ucx {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;

  Ucx() {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    check(ucp_init(&params, nullptr, &context), "ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    check(ucp_worker_create(context, &wp, &worker), "ucp_worker_create");
  }
  ~Ucx() {
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
  }

  std::vector<char> address() const {
    ucp_address_t* a = nullptr;
    std::size_t n = 0;
    check(ucp_worker_get_address(worker, &a, &n), "ucp_worker_get_address");
    std::vector<char> out(reinterpret_cast<char*>(a), reinterpret_cast<char*>(a) + n);
    ucp_worker_release_address(worker, a);
    return out;
  }

  ucp_ep_h connect(const std::vector<char>& address, bool err_peer) const {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep.err_mode = err_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h out = nullptr;
    check(ucp_ep_create(worker, &ep, &out), "ucp_ep_create");
    return out;
  }

  // Progresses until the request (or an immediate status) is done.
  // Progresses until the request (or an immediate status) is done; a peer
  // that stopped answering ends the run after kWaitLimit, not never.
  void wait(ucs_status_ptr_t r, const char* what) const {
    if (r == nullptr) return;
    if (UCS_PTR_IS_ERR(r)) check(UCS_PTR_STATUS(r), what);
    const auto limit = std::chrono::steady_clock::now() + kWaitLimit;
    ucs_status_t s;
    for (unsigned n = 0; (s = ucp_request_check_status(r)) == UCS_INPROGRESS; ++n) {
      ucp_worker_progress(worker);
      if (n % 1024 == 0 && std::chrono::steady_clock::now() > limit) die(std::string(what) + ": no answer in 30 s");
    }
    ucp_request_free(r);
    check(s, what);
  }
};

void close_ep(const Ucx& ucx, ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(ucx.worker);
    ucp_request_free(r);
  }
}

// The target: a registered buffer, progressed until the client hangs up.
// It listens on 127.0.0.1 unless given a host: it answers anyone who
// connects with memory to write into.
int serve(const std::string& host, int port, bool err_peer) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &at.sin_addr) != 1) die("--listen: " + host + " is not an IPv4 address");
  if (::bind(listener, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 || ::listen(listener, 1) != 0) {
    die("cannot listen on " + host + ":" + std::to_string(port));
  }
  const int fd = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  if (fd < 0) die("accept");
  const std::vector<char> wanted = recv_blob(fd);  // the client's worker address, then the buffer size
  std::uint64_t bytes = 0;
  if (::recv(fd, &bytes, sizeof bytes, MSG_WAITALL) != sizeof bytes || bytes == 0 || bytes > kMaxBytes) {
    die("setup: buffer size");
  }
  Ucx ucx;
  // Page-aligned, as the holder's region in Baton's runs (a memfd).
  const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
  std::unique_ptr<char, decltype(&std::free)> buffer(static_cast<char*>(std::aligned_alloc(4096, rounded)), &std::free);
  if (!buffer) die("out of memory");
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = buffer.get();
  mp.length = rounded;
  ucp_mem_h mem = nullptr;
  check(ucp_mem_map(ucx.context, &mp, &mem), "ucp_mem_map");
  void* rkey = nullptr;
  std::size_t rkey_bytes = 0;
  check(ucp_rkey_pack(ucx.context, mem, &rkey, &rkey_bytes), "ucp_rkey_pack");
  const auto base = reinterpret_cast<std::uint64_t>(buffer.get());
  const std::vector<char> mine = ucx.address();
  send_blob(fd, mine.data(), mine.size());
  send_blob(fd, rkey, rkey_bytes);
  send_blob(fd, &base, sizeof base);
  ucp_rkey_buffer_release(rkey);
  // An endpoint back, so the software RMA's completion messages have a way.
  const ucp_ep_h ep = ucx.connect(wanted, err_peer);
  // Progress until the client closes the setup socket.
  ::shutdown(fd, SHUT_WR);
  for (char byte = 0;;) {
    const ssize_t r = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    for (int i = 0; i < 64; ++i) ucp_worker_progress(ucx.worker);
  }
  ::close(fd);
  close_ep(ucx, ep);
  ucp_mem_unmap(ucx.context, mem);
  return 0;
}

int client(const std::string& target, std::uint64_t size, int window, double seconds, bool err_peer) {
  const auto colon = target.rfind(':');
  if (colon == std::string::npos) die("--connect wants HOST:PORT");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(target.substr(0, colon).c_str(), target.substr(colon + 1).c_str(), &hints, &found) != 0) {
    die("cannot resolve " + target);
  }
  // The server may still be starting: a fresh socket each try (one whose
  // connect failed is in no defined state to try again).
  int fd = -1;
  for (int attempt = 0; attempt < 200 && fd < 0; ++attempt) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
      ::usleep(10'000);
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) die("cannot connect to " + target);
  Ucx ucx;
  const std::vector<char> mine = ucx.address();
  send_blob(fd, mine.data(), mine.size());
  if (::send(fd, &size, sizeof size, MSG_NOSIGNAL) != sizeof size) die("setup send");
  const std::vector<char> theirs = recv_blob(fd);
  const std::vector<char> packed = recv_blob(fd);
  const std::vector<char> base_blob = recv_blob(fd);
  std::uint64_t base = 0;
  if (base_blob.size() != sizeof base) die("setup: base address");
  std::memcpy(&base, base_blob.data(), sizeof base);
  const ucp_ep_h ep = ucx.connect(theirs, err_peer);
  ucp_rkey_h rkey = nullptr;
  check(ucp_ep_rkey_unpack(ep, packed.data(), &rkey), "ucp_ep_rkey_unpack");

  std::vector<char> source(size, 'x');
  std::vector<ucs_status_ptr_t> posted;
  posted.reserve(static_cast<std::size_t>(window));
  ucp_request_param_t none{};
  const auto flushed_window = [&] {
    for (int i = 0; i < window; ++i) posted.push_back(ucp_put_nbx(ep, source.data(), size, base, rkey, &none));
    for (ucs_status_ptr_t r : posted) ucx.wait(r, "ucp_put_nbx");
    posted.clear();
    ucx.wait(ucp_ep_flush_nbx(ep, &none), "ucp_ep_flush_nbx");
  };
  for (int i = 0; i < 20; ++i) flushed_window();  // warm-up, as perftest's -w
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::uint64_t puts = 0;
  double elapsed = 0;
  std::vector<double> window_us;  // each window's time, as Baton's batch latency
  while (elapsed < seconds) {
    const auto before = Clock::now();
    flushed_window();
    puts += static_cast<std::uint64_t>(window);
    const auto after = Clock::now();
    window_us.push_back(std::chrono::duration<double, std::micro>(after - before).count());
    elapsed = std::chrono::duration<double>(after - start).count();
  }
  std::sort(window_us.begin(), window_us.end());
  const auto at = [&](double q) { return window_us[static_cast<std::size_t>(q * static_cast<double>(window_us.size() - 1))]; };
  std::printf(
      "{\"size\": %llu, \"window\": %d, \"puts\": %llu, \"seconds\": %.6f, \"gbps\": %.6f, \"puts_per_s\": %.1f, "
      "\"window_p50_us\": %.1f, \"window_p99_us\": %.1f}\n",
      static_cast<unsigned long long>(size), window, static_cast<unsigned long long>(puts), elapsed,
      static_cast<double>(puts * size) / elapsed / 1e9, static_cast<double>(puts) / elapsed, at(0.5), at(0.99));
  ucp_rkey_destroy(rkey);
  close_ep(ucx, ep);
  ::close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen, target;
  std::uint64_t size = 0;
  int window = 16;
  double seconds = 2;
  bool err_peer = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " wants a value");
      return argv[++i];
    };
    if (a == "--listen") {
      listen = value();
    } else if (a == "--connect") {
      target = value();
    } else if (a == "--size") {
      size = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--window") {
      window = std::atoi(value().c_str());
    } else if (a == "--duration") {
      seconds = std::atof(value().c_str());
    } else if (a == "--err-peer") {
      err_peer = true;
    } else {
      die("unknown argument " + a);
    }
  }
  if (!listen.empty() == !target.empty()) die("give one of --listen [HOST:]PORT and --connect HOST:PORT");
  if (!listen.empty()) {
    const auto colon = listen.rfind(':');
    const std::string host = colon == std::string::npos ? "127.0.0.1" : listen.substr(0, colon);
    const int port = std::atoi(listen.substr(colon == std::string::npos ? 0 : colon + 1).c_str());
    if (port <= 0 || port > 65535) die("--listen wants a port in 1..65535");
    return serve(host, port, err_peer);
  }
  if (size == 0 || size > kMaxBytes) die("--size wants 1 .. 1 GiB");
  if (window < 1 || window > 4096) die("--window wants 1 .. 4096");
  if (!(seconds > 0 && seconds <= 600)) die("--duration wants (0, 600] seconds");
  return client(target, size, window, seconds, err_peer);
}
