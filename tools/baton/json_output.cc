#include "json_output.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>

namespace baton::cli {
namespace {

int json_fd = -1;  // the process's stdout, once prepare_json_output("-") moved the rest to stderr

}  // namespace

Status prepare_json_output(const std::string& path) {
  if (path.empty()) return Status::invalid_argument("--json \"\": an empty path (- for stdout)");
  if (path == "-") {
    std::fflush(stdout);
    json_fd = ::dup(STDOUT_FILENO);
    if (json_fd < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
      return Status::unavailable("--json -: cannot set stdout aside for the JSON");
    }
    return Status::ok();
  }
  return check_output_file("--json", path);
}

Status check_output_file(std::string_view flag, const std::string& path) {
  if (path.empty()) return Status::invalid_argument("{} \"\": an empty path", flag);
  std::error_code error;
  // Refused now, not after a run of minutes: a directory, or a file that
  // cannot be written over.
  if (std::filesystem::is_directory(path, error)) {
    return Status::invalid_argument("{} \"{}\": a directory, not a file", flag, path);
  }
  if (std::filesystem::exists(path, error) && ::access(path.c_str(), W_OK) != 0) {
    return Status::invalid_argument("{} \"{}\": the file is not writable", flag, path);
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (!std::filesystem::is_directory(dir, error) || ::access(dir.c_str(), W_OK) != 0) {
    return Status::invalid_argument("{} \"{}\": \"{}\" is not a writable directory", flag, path, dir.string());
  }
  return Status::ok();
}

Status write_json_output(const std::string& json, const std::string& path) {
  if (path.empty()) return Status::ok();
  if (path == "-") {
    if (json_fd < 0) {
      fmt::print("{}\n", json);
      return Status::ok();
    }
    std::fflush(stdout);
    const std::string text = json + "\n";
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(json_fd, text.data() + done, text.size() - done);
      if (n <= 0) return Status::unavailable("cannot write JSON to stdout");
      done += static_cast<std::size_t>(n);
    }
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
