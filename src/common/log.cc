#include "baton/common/log.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace baton {
namespace {

// from_str answers "off" for anything it does not know; only "off" means off.
std::optional<spdlog::level::level_enum> level_named(const std::string& name) {
  const auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off") return std::nullopt;
  return parsed;
}

const char* environment_level() {
  const char* env = std::getenv("BATON_LOG_LEVEL");
  return env != nullptr && *env != '\0' ? env : nullptr;
}

std::shared_ptr<spdlog::logger> make_logger() {
  if (auto given = spdlog::get("baton")) return given;
  std::shared_ptr<spdlog::logger> made;
  try {
    made = spdlog::stderr_color_mt("baton");
  } catch (const spdlog::spdlog_ex&) {  // the program registered "baton" in between
    if (auto given = spdlog::get("baton")) return given;
    made = std::make_shared<spdlog::logger>("baton", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  }
  const char* env = environment_level();
  const auto level = level_named(env != nullptr ? env : "warn");
  made->set_level(level.value_or(spdlog::level::warn));
  if (!level) {
    made->warn("BATON_LOG_LEVEL=\"{}\" is not a level (trace, debug, info, warn, error or off); ignored", env);
  }
  return made;
}

}  // namespace

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> the = make_logger();
  return *the;
}

Status init_logging(std::string_view level) {
  std::string name(level);
  if (name.empty()) {
    const char* env = environment_level();
    name = env != nullptr ? env : "warn";
  }
  const auto parsed = level_named(name);
  if (!parsed) {
    return Status::invalid_argument(
        "init_logging: unknown level \"{}\" (expected trace, debug, info, warn, error or off)", name);
  }
  logger().set_level(*parsed);
  return Status::ok();
}

}  // namespace baton
