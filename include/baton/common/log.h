// Baton's log: a spdlog logger of its own, "baton", on stderr (stdout stays
// clean for JSON), at BATON_LOG_LEVEL (trace, debug, info, warn, error,
// off; else warn). A library does not take over its program's logging:
// spdlog's default logger and the program's own loggers stay as the program
// set them. The program reaches Baton's with spdlog::get("baton") (its
// level, its sinks); a "baton" logger it registered first is used as is.
#pragma once

#include <string_view>

#include "baton/common/status.h"

namespace spdlog {
class logger;
}

namespace baton {

// Every layer logs through this one; made on first use.
spdlog::logger& logger();

// Sets the level of logger(): `level`, or when empty BATON_LOG_LEVEL, else
// warn. An unknown level → invalid_argument, the level unchanged.
Status init_logging(std::string_view level = {});

}  // namespace baton
