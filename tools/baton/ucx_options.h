// The UCX settings of every command that moves real bytes (serve, bench
// throughput / mixed --transport ucx / idle, demo), and the arguments that
// give a spawned `baton serve` the same ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "baton/transport/ucx_transport.h"

namespace baton::cli {

// --ucx-tls, --lanes, --peer-failure-detection / --no-peer-failure-detection.
void add_ucx_options(CLI::App& app, transport::UcxConfig& ucx);

// `baton serve` arguments for a buffer of `buffer_bytes` with `ucx`'s settings.
[[nodiscard]] std::vector<std::string> serve_args(std::uint64_t buffer_bytes, const transport::UcxConfig& ucx);

}  // namespace baton::cli
