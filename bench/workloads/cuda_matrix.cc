#include "workloads/cuda_matrix.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "baton/topology/graph.h"
#include "baton/topology/probe.h"
#include "baton/transport/cuda_transport.h"

namespace baton::workloads {
namespace {

using transport::CudaRuntime;
using transport::CudaTransport;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Memory of one endpoint, freed with the object.
class Block {
 public:
  Block(CudaRuntime& rt, std::optional<int> device) : rt_(rt), device_(device.has_value()) {}
  ~Block() {
    if (data_ == nullptr) return;
    if (device_) {
      rt_.free_device(data_);
    } else {
      rt_.free_pinned(data_);
    }
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  Status allocate(std::optional<int> device, std::uint64_t bytes) {
    auto data = device ? rt_.alloc_device(*device, bytes) : rt_.alloc_pinned(bytes);
    if (!data) return data.error();
    data_ = *data;
    return Status::ok();
  }
  [[nodiscard]] std::byte* data() const { return static_cast<std::byte*>(data_); }

 private:
  CudaRuntime& rt_;
  bool device_;
  void* data_ = nullptr;
};

std::string kind_of(const transport::PathInfo& p) {
  const bool from_gpu = p.from.starts_with("gpu");
  const bool to_gpu = p.to.starts_with("gpu");
  if (from_gpu && to_gpu) return p.type == topology::PathType::kHostStaging ? "staging" : "peer";
  return from_gpu ? "d2h" : "h2d";
}

// Writes `repeat` blocks from `from` to `to` on one path, a slice per lane
// in flight, after one untimed block.
Result<double> time_path(CudaTransport& t, CudaRuntime& rt, transport::PathId path, const MatrixOptions& o,
                         transport::SliceId& next_id) {
  const transport::PathInfo info = t.paths()[path];
  auto src_device = t.device_of(info.from);
  auto dst_device = t.device_of(info.to);
  const std::optional<int> sd = src_device ? std::optional(*src_device) : std::nullopt;
  const std::optional<int> dd = dst_device ? std::optional(*dst_device) : std::nullopt;
  Block src(rt, sd);
  Block dst(rt, dd);
  if (Status s = src.allocate(sd, o.block_bytes); !s.is_ok()) return std::unexpected(s);
  if (Status s = dst.allocate(dd, o.block_bytes); !s.is_ok()) return std::unexpected(s);
  using transport::MemoryKind;
  auto local = t.register_memory(src.data(), o.block_bytes, sd ? MemoryKind::kVram : MemoryKind::kDram, sd.value_or(-1));
  if (!local) return std::unexpected(local.error());
  auto remote = t.register_memory(dst.data(), o.block_bytes, dd ? MemoryKind::kVram : MemoryKind::kDram, dd.value_or(-1));
  if (!remote) return std::unexpected(remote.error());

  std::vector<transport::Completion> out;
  Status failed;
  auto run = [&](int blocks) {
    int posted = 0;
    int done = 0;
    TimeNs now = 0;
    while (done < blocks && failed.is_ok()) {
      while (posted < blocks && posted - done < info.lanes) {
        const transport::SliceSubmit s{next_id++, path, posted % info.lanes, o.block_bytes,
                                       {transport::Op::kWrite, src.data(),
                                        reinterpret_cast<std::uint64_t>(dst.data()), *remote}};
        if (Status st = t.submit(s, now); !st.is_ok()) {
          failed = st;
          return;
        }
        ++posted;
      }
      out.clear();
      t.poll(++now, out);
      for (const transport::Completion& c : out) {
        if (!c.status.is_ok()) failed = c.status;
        ++done;
      }
    }
    // Let what was posted finish before the memory goes.
    while (t.slices_in_flight() > 0) t.poll(++now, out);
  };
  run(1);
  const auto start = std::chrono::steady_clock::now();
  run(o.repeat);
  const double elapsed = seconds_since(start);
  (void)t.unregister(*local);
  (void)t.unregister(*remote);
  if (!failed.is_ok()) return std::unexpected(failed);
  return static_cast<double>(o.block_bytes) * o.repeat / elapsed / 1e9;
}

// Copies within one GPU on a stream of its own.
Result<double> time_d2d(CudaRuntime& rt, int device, const MatrixOptions& o) {
  Block a(rt, device);
  Block b(rt, device);
  if (Status s = a.allocate(device, o.block_bytes); !s.is_ok()) return std::unexpected(s);
  if (Status s = b.allocate(device, o.block_bytes); !s.is_ok()) return std::unexpected(s);
  auto stream = rt.create_stream(device);
  if (!stream) return std::unexpected(stream.error());
  Status s = rt.copy_async(b.data(), a.data(), o.block_bytes, *stream);
  if (s.is_ok()) s = rt.synchronize(*stream);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.repeat && s.is_ok(); ++i) s = rt.copy_async(b.data(), a.data(), o.block_bytes, *stream);
  if (s.is_ok()) s = rt.synchronize(*stream);
  const double elapsed = seconds_since(start);
  rt.destroy_stream(*stream);
  if (!s.is_ok()) return std::unexpected(s);
  return static_cast<double>(o.block_bytes) * o.repeat / elapsed / 1e9;
}

}  // namespace

Status MatrixOptions::validate() const {
  if (gpus.empty()) return Status::invalid_argument("matrix: no GPUs listed (--gpus 0,1)");
  for (int g : gpus) {
    if (g < 0) return Status::invalid_argument("matrix: GPU {} is below 0", g);
    if (std::count(gpus.begin(), gpus.end(), g) > 1) return Status::invalid_argument("matrix: GPU {} is listed twice", g);
  }
  if (block_bytes == 0 || repeat < 1) {
    return Status::invalid_argument("matrix: block size {} and repeat {} must be > 0", block_bytes, repeat);
  }
  return Status::ok();
}

Result<std::vector<MatrixCell>> measure_matrix(std::shared_ptr<CudaRuntime> runtime, const MatrixOptions& o) {
  if (!runtime) return std::unexpected(Status::invalid_argument("matrix: no CUDA runtime (null)"));
  if (Status s = o.validate(); !s.is_ok()) return std::unexpected(s);
  auto facts = o.topology_model.empty() ? topology::probe_machine() : topology::load_model(o.topology_model);
  if (!facts) return std::unexpected(facts.error());
  auto graph = topology::TopologyGraph::build(*facts);
  if (!graph) return std::unexpected(graph.error());
  std::vector<std::string> gpus;
  for (int g : o.gpus) {
    gpus.push_back(fmt::format("gpu{}", g));
    if (graph->find(gpus.back()) == nullptr) {
      return std::unexpected(Status::invalid_argument("matrix: GPU {} is not in the topology ({} GPUs)", g,
                                                      graph->nodes_of(topology::NodeKind::kGpu).size()));
    }
  }
  auto transport = CudaTransport::create(*graph, runtime);
  if (!transport) return std::unexpected(transport.error());
  CudaTransport& t = **transport;
  auto selected = [&](const std::string& node) {
    return node.starts_with("numa") || std::ranges::find(gpus, node) != gpus.end();
  };

  std::vector<MatrixCell> cells;
  transport::SliceId next_id = 1;
  for (transport::PathId p = 0; p < t.paths().size(); ++p) {
    const transport::PathInfo& info = t.paths()[p];
    if (!selected(info.from) || !selected(info.to)) continue;
    auto gbps = time_path(t, *runtime, p, o, next_id);
    if (!gbps) return std::unexpected(Status(gbps.error().code(), fmt::format("matrix: {}: {}", info.name(), gbps.error().message())));
    MatrixCell c{info.from, info.to, kind_of(info), info.type, topology::Proximity::kLocal, 0, *gbps,
                 info.bandwidth_gbps, info.latency_us};
    for (const topology::Link& l : graph->links()) {
      if (l.path == info.type && ((l.from == info.from && l.to == info.to) || (l.from == info.to && l.to == info.from))) {
        c.proximity = l.proximity;
        c.nvlinks = l.nvlinks;
      }
    }
    cells.push_back(std::move(c));
  }
  for (const std::string& g : gpus) {
    auto device = t.device_of(g);
    if (!device) return std::unexpected(device.error());
    auto gbps = time_d2d(*runtime, *device, o);
    if (!gbps) return std::unexpected(Status(gbps.error().code(), fmt::format("matrix: {} d2d: {}", g, gbps.error().message())));
    cells.push_back({g, g, "d2d", std::nullopt, topology::Proximity::kLocal, 0, *gbps, std::nullopt, 0});
  }
  return cells;
}

}  // namespace baton::workloads
