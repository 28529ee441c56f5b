#include <fmt/core.h>

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
      if (option != nullptr && option->get_type_size() != 0 && word.find('=') == std::string::npos) ++i;
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton: a topology-aware, deadline-driven KV-cache transfer engine"};
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off (default: BATON_LOG_LEVEL or warn)");

  std::vector<baton::cli::Command> commands{baton::cli::add_topo_command(app), baton::cli::add_serve_command(app),
                                            baton::cli::add_demo_command(app), baton::cli::add_store_command(app),
                                            baton::cli::add_handoff_worker_command(app)};
  for (auto& mode : baton::cli::add_bench_commands(app)) commands.push_back(std::move(mode));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (const std::string word = unknown_command(app, argc, argv);
        !word.empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
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
  if (auto s = baton::init_logging(log_level); !s.is_ok()) {
    fmt::print(stderr, "baton: {}\n", s.message());
    return 2;
  }
  for (const auto& command : commands) {
    if (!command.app->parsed()) continue;
    if (const CLI::Option* json = command.app->get_option_no_throw("--json"); json != nullptr && json->count() > 0) {
      if (auto s = baton::cli::prepare_json_output(json->as<std::string>()); !s.is_ok()) {
        const CLI::App* parent = command.app->get_parent();
        return baton::cli::fail_command(
            parent != nullptr && parent != &app ? parent->get_name() + " " + command.app->get_name()
                                                : command.app->get_name(),
            s);
      }
    }
    return command.run();
  }
  return 2;
}
