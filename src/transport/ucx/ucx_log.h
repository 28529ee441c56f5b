// Where UCX's own log lines go. UCX prints them on stdout, where a program
// using Baton writes its output (and `baton serve` its address): from the
// first transport on, they go to stderr with Baton's. Private to transport/ucx.
#pragma once

namespace baton::transport::ucx {

// Once per process; later calls do nothing. UCX still decides which lines
// there are (UCX_LOG_LEVEL, warn by default).
void log_to_stderr();

}  // namespace baton::transport::ucx
