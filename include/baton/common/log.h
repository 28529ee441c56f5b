// Logging setup. Layers log through spdlog directly; this only decides the
// level, from the argument or from BATON_LOG_LEVEL (trace, debug, info, warn,
// error, off). Logs go to stderr so that stdout stays clean for JSON output.
#pragma once

#include <string_view>

#include "baton/common/status.h"

namespace baton {

// `level` empty → BATON_LOG_LEVEL, else "warn". Unknown level → invalid_argument.
Status init_logging(std::string_view level = {});

// What an engine's creation calls, once per process: init_logging() (an
// unknown BATON_LOG_LEVEL: warn), unless the program installed a default
// spdlog logger of its own, which stays. Without it a program using the
// library got spdlog's default: info lines on its stdout.
void init_default_logging();

}  // namespace baton
