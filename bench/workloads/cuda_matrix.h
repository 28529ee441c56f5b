// `baton bench matrix`: the measured bandwidth of every path between some
// GPUs and host memory (peer copies, host staging, host→GPU, GPU→host, and
// copies within one GPU), each next to the cost model's figure for it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "baton/common/status.h"
#include "baton/topology/cost_model.h"
#include "baton/transport/cuda_runtime.h"

namespace baton::workloads {

struct MatrixOptions {
  std::vector<int> gpus;  // topology GPUs ("gpuN", as `baton topo` numbers them)
  std::uint64_t block_bytes = 64ULL << 20;
  int repeat = 10;  // timed blocks per path, after one untimed
  // A synthetic topology instead of this machine's probe (tests).
  std::string topology_model;

  // What needs no machine: at least one GPU, none listed twice or below 0,
  // a block and a repeat above 0. invalid_argument naming the value.
  [[nodiscard]] Status validate() const;
};

struct MatrixCell {
  std::string from;  // "gpu0", "numa0"
  std::string to;
  // peer, staging, h2d, d2h (transport paths) or d2d (within one GPU)
  std::string kind;
  std::optional<topology::PathType> type;  // the transport path's; none for d2d
  topology::Proximity proximity = topology::Proximity::kLocal;
  int nvlinks = 0;
  double measured_gbps = 0;  // bytes copied / time (10^9 bytes per second)
  std::optional<double> model_gbps;
  double model_latency_us = 0;
};

// validate()'s errors, invalid_argument for a GPU the topology does not
// have; the runtime's errors (out of memory, …) as they come.
[[nodiscard]] Result<std::vector<MatrixCell>> measure_matrix(std::shared_ptr<transport::CudaRuntime> runtime,
                                                             const MatrixOptions& options);

}  // namespace baton::workloads
