// Where `--json PATH` goes: every command writes its JSON the same way.
#pragma once

#include <string>

#include "baton/common/status.h"

namespace baton::cli {

// Writes `json` and a newline to `path`; "-" is stdout, "" writes nothing.
// unavailable naming the path when the file cannot be written.
[[nodiscard]] Status write_json_output(const std::string& json, const std::string& path);

}  // namespace baton::cli
