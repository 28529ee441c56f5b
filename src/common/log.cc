#include "baton/common/log.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace baton {

Status init_logging(std::string_view level) {
  std::string name(level);
  if (name.empty()) {
    const char* env = std::getenv("BATON_LOG_LEVEL");
    name = env != nullptr && *env != '\0' ? env : "warn";
  }
  const auto parsed = spdlog::level::from_str(name);
  // from_str answers "off" for anything it does not know; only "off" means off.
  if (parsed == spdlog::level::off && name != "off") {
    return Status::invalid_argument(
        "init_logging: unknown level \"{}\" (expected trace, debug, info, warn, "
        "error or off)",
        name);
  }
  // Called again (a C program and the Python module in one process, say):
  // the same logger, not a second of that name, which spdlog refuses.
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  auto logger = spdlog::get("baton");
  if (!logger) logger = spdlog::stderr_color_mt("baton");
  spdlog::set_default_logger(logger);
  spdlog::set_level(parsed);
  return Status::ok();
}

void init_default_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    // spdlog's own default logger has an empty name; "baton" is ours.
    if (!spdlog::default_logger()->name().empty()) return;
    if (!init_logging().is_ok()) (void)init_logging("warn");
  });
}

}  // namespace baton
