#include "json_output.h"

#include <fstream>

#include <fmt/core.h>

namespace baton::cli {

Status write_json_output(const std::string& json, const std::string& path) {
  if (path.empty()) return Status::ok();
  if (path == "-") {
    fmt::print("{}\n", json);
    return Status::ok();
  }
  std::ofstream out(path);
  out << json << "\n";
  out.close();
  if (!out) return Status::unavailable("cannot write JSON to \"{}\"", path);
  return Status::ok();
}

int emit_json(std::string_view command, const std::string& json, const std::string& path) {
  if (Status s = write_json_output(json, path); !s.is_ok()) {
    fmt::print(stderr, "baton {}: {}\n", command, s.message());
    return 1;
  }
  return 0;
}

}  // namespace baton::cli
