// The compression benchmark: the same bytes written to a peer plain and with
// Baton deciding (a codec registered with its profile measured on the data;
// requests due `slack` times the plain run's duration after submit, under
// admission.theta_compress = `theta_compress`, so that with the default 0
// every request is in the compress band and the "does it pay" rule alone
// decides), per kind of data, each run's bytes read back and compared. Meant for a slow link (a
// network namespace shaped to 1 Gbit/s: scripts/bench-compress).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "baton/common/status.h"
#include "baton/transport/ucx_transport.h"
#include "workloads/payloads.h"

namespace baton::workloads {

struct CompressConfig {
  std::vector<PayloadKind> kinds{PayloadKind::kFp16Kv, PayloadKind::kPaddedKv, PayloadKind::kText};
  std::uint64_t bytes = 64ULL << 20;       // per kind and run
  std::uint64_t block_bytes = 1ULL << 20;  // per request
  std::string codec = "lz4";               // make_codec's spec: lz4, zstd, zstd:3
  double slack = 2.0;                      // the auto run's deadline, in plain-run durations
  double theta_compress = 0.0;             // the auto run's compress band starts at this MLU
  std::uint64_t seed = 1;

  // invalid_argument naming the field.
  [[nodiscard]] Status validate() const;
  // What the peer must register: both runs write side by side.
  [[nodiscard]] std::uint64_t peer_bytes() const { return 2 * bytes; }
};

struct CompressRow {
  PayloadKind data = PayloadKind::kFp16Kv;
  double ratio = 1;             // the codec on this data (measure())
  double compress_gbps = 0;
  double plain_gbps = 0;        // payload bytes / time, no codec
  double auto_gbps = 0;         // payload bytes / time, Baton deciding
  std::uint64_t auto_wire_bytes = 0;  // what the auto run put on the wire
  bool verified = false;        // both runs' bytes read back equal to the source
};

[[nodiscard]] Result<std::vector<CompressRow>> run_compress(const CompressConfig& config, const std::string& peer,
                                                            const transport::UcxConfig& ucx);

}  // namespace baton::workloads
