// copy_bytes against std::memcpy, the destination 0 or 16 bytes past the
// source modulo 64 (a malloc'd buffer against a page-aligned region; other
// offsets at 64 KiB), over a
// 16 MiB working set a block at a time, as a same-host transfer copies
// (docs/results.md, "Misaligned copies").
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "baton/common/copy.h"

namespace {

constexpr std::size_t kWorkingSet = std::size_t{16} << 20;

struct Buffers {
  std::unique_ptr<std::byte, decltype(&std::free)> from{static_cast<std::byte*>(std::aligned_alloc(4096, kWorkingSet)),
                                                        &std::free};
  std::unique_ptr<std::byte, decltype(&std::free)> to{
      static_cast<std::byte*>(std::aligned_alloc(4096, kWorkingSet + 4096)), &std::free};
  Buffers() {
    std::memset(from.get(), 1, kWorkingSet);
    std::memset(to.get(), 2, kWorkingSet + 4096);
  }
};

template <bool kCopyBytes>
void BM_Copy(benchmark::State& state) {
  static Buffers b;
  const auto block = static_cast<std::size_t>(state.range(0));
  std::byte* to = b.to.get() + state.range(1);
  std::size_t off = 0;
  for (auto _ : state) {
    if (kCopyBytes) {
      baton::copy_bytes(to + off, b.from.get() + off, block);
    } else {
      std::memcpy(to + off, b.from.get() + off, block);
    }
    benchmark::DoNotOptimize(to);
    off = off + 2 * block <= kWorkingSet ? off + block : 0;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * block));
}

void shapes(benchmark::internal::Benchmark* b) {
  for (std::int64_t block : {4 << 10, 64 << 10, 256 << 10, 1 << 20}) {
    for (std::int64_t apart : {0, 16}) b->Args({block, apart});
  }
  for (std::int64_t apart : {8, 24, 32, 40, 48, 56}) b->Args({64 << 10, apart});  // which offsets are slow
  b->ArgNames({"block", "apart"});
}

BENCHMARK(BM_Copy<false>)->Name("BM_Memcpy")->Apply(shapes);
BENCHMARK(BM_Copy<true>)->Name("BM_CopyBytes")->Apply(shapes);

}  // namespace
