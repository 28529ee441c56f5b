#include <fmt/core.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "baton/common/log.h"
#include "commands.h"
#include "json_output.h"

namespace {

// The word where a command line stops naming subcommands, as "bench bogus",
// or "" when every word was one (or there was none): CLI11 says only "A
// subcommand is required" for `baton bogus`.
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.starts_with("-")) {
      // An option's value is its next word unless given with '='.
      const CLI::Option* option = at->get_option_no_throw(word.substr(0, word.find('=')));
      if (option == nullptr) return path + word.substr(0, word.find('='));  // a flag it does not know
      if (option->get_type_size() != 0 && word.find('=') == std::string::npos) ++i;
      continue;
    }
    const CLI::App* sub = nullptr;
    for (const CLI::App* candidate : at->get_subcommands({})) {
      if (candidate->check_name(word)) sub = candidate;
    }
    if (sub == nullptr) return at->get_subcommands({}).empty() ? std::string() : path + word;
    at = sub;
    path += word + " ";
  }
  return {};
}

// The first option given an empty value ("--token-file ''", a variable
// that was not set): refused, never taken for "the default". Flags take no
// value and are not looked at.
const CLI::Option* empty_value(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_type_size() == 0 || option->count() == 0) continue;
    for (const std::string& value : option->results()) {
      if (value.empty()) return option;
    }
  }
  for (const CLI::App* sub : app.get_subcommands()) {
    if (const CLI::Option* option = empty_value(*sub)) return option;
  }
  return nullptr;
}

// "bench handoff": the subcommands the parse reached, for a message.
std::string parsed_command(const CLI::App& app) {
  std::string path;
  const CLI::App* at = &app;
  for (;;) {
    const auto subs = at->get_subcommands();
    if (subs.empty()) return path;
    at = subs.front();
    path += (path.empty() ? "" : " ") + at->get_name();
  }
}

// "bench store", "serve": the command as its messages name it.
std::string command_name(const CLI::App& app, const baton::cli::Command& command) {
  const CLI::App* parent = command.app->get_parent();
  return parent != nullptr && parent != &app ? parent->get_name() + " " + command.app->get_name()
                                             : command.app->get_name();
}

// Runs the command. An exception that reaches here (a thread the system
// would not start: std::system_error) is the command's failure in one line,
// not std::terminate's abort; stdout that could not be written (a full
// disk, a closed pipe) fails the run instead of losing its output silently.
int finish(const std::string& name, const baton::cli::Command& command) {
  int rc = 1;
  try {
    rc = command.run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "baton {}: {}\n", name, e.what());
    rc = 1;
  }
  if ((std::fflush(stdout) != 0 || std::ferror(stdout) != 0) && rc == 0) {
    fmt::print(stderr, "baton {}: writing the output failed: {}\n", name, std::strerror(errno));
    rc = 1;
  }
  return rc;
}

}  // namespace

namespace {

// Whether SIGHUP was ignored as the process started (nohup), read before any
// library's initializer runs: UCX's replaces the disposition as it loads.
// An executable's .preinit_array runs before every shared library's init.
bool sighup_ignored_at_start = false;

void read_sighup_disposition(int, char**, char**) {
  struct sigaction action {};
  sighup_ignored_at_start = sigaction(SIGHUP, nullptr, &action) == 0 && action.sa_handler == SIG_IGN;
}

[[gnu::section(".preinit_array"), gnu::used]] void (*const read_sighup_at_start)(int, char**, char**) =
    &read_sighup_disposition;

}  // namespace

int main(int argc, char** argv) {
  // A write to a child that died (a handoff rank's stdin, a peer's socket)
  // is an error to report, not a silent exit 141. The children we start are
  // `baton` too: their writes to a parent gone fail the same way.
  std::signal(SIGPIPE, SIG_IGN);
  // UCX takes SIGHUP as it loads, for its debug mode (UCX_DEBUG_SIGNO): a
  // hang-up turned debug logging on and the command ran on. Unless that
  // variable asks for it, a hang-up ends a command (serve and store stop
  // cleanly on it) — or is ignored, as it was when we started (nohup).
  if (std::getenv("UCX_DEBUG_SIGNO") == nullptr) std::signal(SIGHUP, sighup_ignored_at_start ? SIG_IGN : SIG_DFL);
  CLI::App app{"baton: a topology-aware, deadline-driven KV-cache transfer engine"};
  app.require_subcommand(1);
  // Every flag's help shows the value it starts with (subcommands inherit this).
  app.option_defaults()->always_capture_default();
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (default: BATON_LOG_LEVEL or warn)");

  std::vector<baton::cli::Command> commands{baton::cli::add_topo_command(app), baton::cli::add_serve_command(app),
                                            baton::cli::add_demo_command(app), baton::cli::add_store_command(app),
                                            baton::cli::add_handoff_worker_command(app)};
  for (auto& mode : baton::cli::add_bench_commands(app)) commands.push_back(std::move(mode));
  baton::cli::require_decimal_integers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (const std::string word = unknown_command(app, argc, argv);
        !word.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      const auto last = word.rfind(' ');
      if (word.compare(last == std::string::npos ? 0 : last + 1, 1, "-") == 0) {
        const std::string where = last == std::string::npos ? "baton" : "baton " + word.substr(0, last);
        fmt::print(stderr, "{}: unknown flag \"{}\" ({} --help lists the flags)\n", where,
                   word.substr(last == std::string::npos ? 0 : last + 1), where);
        return 2;
      }
      fmt::print(stderr, "baton: unknown command \"{}\" (baton --help lists them)\n", word);
      return 2;
    }
    // --help is 0; every usage error is 2, as for values the commands refuse
    // themselves (CLI11's own codes, 105 for a value out of range, say nothing
    // more), and one line, as theirs are.
    if (e.get_exit_code() == 0) return app.exit(e);
    const std::string command = parsed_command(app);
    const std::string where = command.empty() ? "baton" : "baton " + command;
    fmt::print(stderr, "{}: {} ({} --help lists the flags)\n", where, e.what(), where);
    return 2;
  }
  if (const CLI::Option* empty = empty_value(app)) {
    const std::string command = parsed_command(app);
    const std::string where = command.empty() ? "baton" : "baton " + command;
    fmt::print(stderr, "{}: {}: an empty value ({} --help lists the flags)\n", where, empty->get_name(), where);
    return 2;
  }
  if (auto s = baton::init_logging(log_level); !s.is_ok()) {
    fmt::print(stderr, "baton: {}\n", s.message());
    return 2;
  }
  for (const auto& command : commands) {
    if (!command.app->parsed()) continue;
    if (const CLI::Option* json = command.app->get_option_no_throw("--json"); json != nullptr && json->count() > 0) {
      if (auto s = baton::cli::prepare_json_output(json->as<std::string>()); !s.is_ok()) {
        return baton::cli::fail_command(command_name(app, command), s);
      }
    }
    return finish(command_name(app, command), command);
  }
  return 2;
}
