// A file path a caller gives, checked before a system call sees it.
#pragma once

#include <string_view>

#include "baton/common/status.h"

namespace baton {

// invalid_argument "`what`: the path has a NUL byte at offset N" when it
// has one: the system calls stop at it, and another file would be read.
[[nodiscard]] inline Status check_file_path(std::string_view what, std::string_view path) {
  if (const auto nul = path.find('\0'); nul != std::string_view::npos) {
    return Status::invalid_argument("{}: the path has a NUL byte at offset {}", what, nul);
  }
  return Status::ok();
}

}  // namespace baton
