#include "transport/ucx/ucx_log.h"

#include <ucs/debug/log_def.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace baton::transport::ucx {
namespace {

ucs_log_func_rc_t to_stderr(const char* file, unsigned line, const char* /*function*/, ucs_log_level_t level,
                            const ucs_log_component_config_t* /*component*/, const char* message, va_list ap) {
  char text[1024];
  std::va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof text, message, copy);
  va_end(copy);
  // One write per line, as UCX's own: lines of two threads do not mix.
  std::fprintf(stderr, "UCX %s %s:%u %s\n", ucs_log_level_names[level], file, line, text);
  // A fatal line goes on to UCX's handler, which stops the process as before.
  return level == UCS_LOG_LEVEL_FATAL ? UCS_LOG_FUNC_RC_CONTINUE : UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void log_to_stderr() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(&to_stderr); });
}

}  // namespace baton::transport::ucx
