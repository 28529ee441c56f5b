// The C++ Engine from an installed libbaton: reads the first 2 MiB of
// `baton serve`'s buffer in two requests and checks them against the pattern
// serve fills it with (salt 0).
// Usage: cxx_consumer ADDRESS REGION BYTES (serve's "address" and "region" lines)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <baton/c/baton.h>
#include <baton/engine/engine.h>
#include <baton/engine/pattern.h>

namespace {

int failed(const char* what, const baton::Status& s) {
  std::fprintf(stderr, "cxx_consumer: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace baton::engine;
  if (argc != 4) {
    std::fprintf(stderr, "usage: cxx_consumer ADDRESS REGION BYTES\n");
    return 2;
  }
  const auto key = static_cast<RegionHandle>(std::strtoul(argv[2], nullptr, 10));
  const std::uint64_t bytes = std::min<std::uint64_t>(std::strtoull(argv[3], nullptr, 10), 2 << 20);
  if (bytes < 2) return 2;
  // The C ABI and the C++ API come from the same library.
  if (baton_abi_version() != BATON_ABI_VERSION) return 1;

  std::vector<std::byte> buffer(bytes);  // declared first: it outlives the engine
  auto engine = Engine::create(EngineConfig{});
  if (!engine) return failed("create", engine.error());
  // Nothing listens on port 1: refused, and the library logs why (at info,
  // on stderr: install_test.sh runs this with BATON_LOG_LEVEL=info and
  // checks that the line is on stderr and stdout has only ours).
  if (auto refused = (*engine)->connect("127.0.0.1:1"); refused) {
    std::fprintf(stderr, "cxx_consumer: a connect to 127.0.0.1:1 succeeded (something listens on port 1)\n");
    return 1;
  }
  auto region = (*engine)->register_memory(buffer.data(), buffer.size());
  if (!region) return failed("register_memory", region.error());
  auto peer = (*engine)->connect(argv[1]);
  if (!peer) return failed("connect", peer.error());

  Batch batch;
  for (std::uint64_t offset : {std::uint64_t{0}, bytes / 2}) {
    Request r;
    r.op = Op::kRead;
    r.local_region = region->handle;
    r.local_offset = offset;
    r.peer = peer->address;
    r.remote_region = key;
    r.remote_offset = offset;
    r.length = offset == 0 ? bytes / 2 : bytes - bytes / 2;
    batch.requests.push_back(r);
  }
  auto handle = (*engine)->submit(batch);
  if (!handle) return failed("submit", handle.error());
  if (auto s = (*engine)->wait(*handle, 30'000'000'000); !s.is_ok()) return failed("wait", s);
  auto status = (*engine)->poll(*handle);
  if (!status) return failed("poll", status.error());
  if (!status->status.is_ok()) return failed("the batch", status->status);
  if (auto bad = pattern_mismatch(buffer, 0)) {
    std::fprintf(stderr, "cxx_consumer: byte %zu differs from the pattern\n", *bad);
    return 1;
  }
  (void)(*engine)->release(*handle);
  std::printf("cxx_consumer: read %llu bytes of the pattern from %s\n", static_cast<unsigned long long>(bytes),
              peer->address.c_str());
  return 0;
}
