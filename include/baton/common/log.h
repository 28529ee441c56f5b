// Logging setup. Layers log through spdlog directly; this only decides the
// level, from the argument or from BATON_LOG_LEVEL (trace, debug, info, warn,
// error, off). Logs go to stderr so that stdout stays clean for JSON output.
#pragma once

#include <string_view>

#include "baton/common/status.h"

namespace baton {

// `level` empty → BATON_LOG_LEVEL, else "warn". Unknown level → invalid_argument.
Status init_logging(std::string_view level = {});

}  // namespace baton
