// Where `--json PATH` goes: every command writes its JSON the same way.
#pragma once

#include <string>
#include <string_view>

#include "baton/common/status.h"

namespace baton::cli {

// Before a command runs (main.cc): with "-", stdout is kept for the JSON
// alone, and what the command prints for people (UCX's warnings too) goes
// to stderr; a PATH whose directory is missing or not writable is refused
// before the run, not after it, and so is an empty one (it wrote nothing).
// invalid_argument naming the path.
[[nodiscard]] Status prepare_json_output(const std::string& path);

// The check prepare_json_output makes of a file PATH, for any option that
// names a file the command will write (`flag` names it in the message).
[[nodiscard]] Status check_output_file(std::string_view flag, const std::string& path);

// Writes `json` and a newline to `path`; "-" is stdout, "" writes nothing.
// unavailable naming the path when the file cannot be written.
[[nodiscard]] Status write_json_output(const std::string& json, const std::string& path);

// write_json_output, saying "baton <command>: <why>" on stderr when it
// fails: the exit code to return (0, or 1).
[[nodiscard]] int emit_json(std::string_view command, const std::string& json, const std::string& path);

}  // namespace baton::cli
