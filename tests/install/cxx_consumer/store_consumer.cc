// The store's RPC side from an installed libbaton_store (Baton::store): a
// store served in this process, a producer engine that puts 4 blocks
// through StoreClient::put, a requester that fetches them back through
// StoreClient::fetch, and every byte of every view checked.
#include <cstdio>
#include <vector>

#include <baton/engine/engine.h>
#include <baton/engine/pattern.h>
#include <baton/store/block_store.h>
#include <baton/store/service.h>

namespace {

int failed(const char* what, const baton::Status& s) {
  std::fprintf(stderr, "store_consumer: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  using namespace baton;
  const store::BlockLayout layout{.slots = 4, .segments = 2, .segment_bytes = 4096};
  constexpr std::uint32_t kBlocks = 4;
  std::vector<std::byte> kv(kBlocks * layout.block_bytes());  // declared first: it outlives the engines
  for (std::uint32_t b = 0; b < kBlocks; ++b) {
    engine::fill_pattern(std::span(kv).subspan(b * layout.block_bytes(), layout.block_bytes()), 50 + b);
  }

  // The requester's engine first: the client keeps its slabs registered
  // with it until the client goes, so it must outlive the client.
  auto requester = engine::Engine::create({});
  if (!requester) return failed("create the requester", requester.error());
  auto holder = engine::Engine::create({});
  if (!holder) return failed("create the store's engine", holder.error());
  auto blocks = store::BlockStore::create(**holder);
  if (!blocks) return failed("BlockStore::create", blocks.error());
  if (auto s = (*blocks)->add_namespace({"llama", layout, 16, {0}}); !s.is_ok()) return failed("add_namespace", s);
  auto server = store::StoreServer::start(**blocks, **holder);
  if (!server) return failed("StoreServer::start", server.error());
  auto client = store::StoreClient::connect((*server)->address());
  if (!client) return failed("StoreClient::connect", client.error());

  auto producer = engine::Engine::create({});
  if (!producer) return failed("create the producer", producer.error());
  auto mine = (*producer)->register_memory(kv.data(), kv.size());
  if (!mine) return failed("register_memory", mine.error());
  const std::vector<std::uint64_t> hashes{0x100, 0x101, 0x102, 0x103};
  if (auto s = (*client)->put(**producer, "llama", "prefill-0", hashes, layout, mine->handle); !s.is_ok()) {
    return failed("put", s);
  }

  auto fetched = (*client)->fetch(**requester, "llama", hashes, "decode-0");
  if (!fetched) return failed("fetch", fetched.error());
  if (fetched->found != kBlocks || !fetched->blocks) {
    std::fprintf(stderr, "store_consumer: fetch found %u of %u blocks\n", fetched->found, kBlocks);
    return 1;
  }
  for (std::uint32_t b = 0; b < kBlocks; ++b) {
    for (std::uint32_t slot = 0; slot < layout.slots; ++slot) {
      for (std::uint32_t seg = 0; seg < layout.segments; ++seg) {
        const std::uint64_t at = (std::uint64_t{slot} * layout.segments + seg) * layout.segment_bytes;
        const std::span<const std::byte> view(fetched->blocks->view(b, slot, seg), layout.segment_bytes);
        if (engine::pattern_mismatch(view, 50 + b, at)) {
          std::fprintf(stderr, "store_consumer: block %u slot %u segment %u differs\n", b, slot, seg);
          return 1;
        }
      }
    }
  }
  std::printf("store_consumer: put and fetched %u blocks of %llu bytes, byte-exact\n", kBlocks,
              static_cast<unsigned long long>(layout.block_bytes()));
  return 0;
}
