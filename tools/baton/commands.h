// The `baton` subcommands. Each adds itself to the CLI11 app and hands back a
// function that runs it once the command line has been parsed (so logging is
// set up first) and returns the process exit code.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include "baton/common/host_port.h"
#include "baton/common/status.h"
#include "baton/common/units.h"
#include "baton/sched/policy.h"
#include "baton/topology/probe.h"

namespace baton::cli {

// --duration-ms of the bench modes: above 0 and at most an hour. NaN fails
// the comparison, and inf or 1e300 would overflow the nanoseconds.
inline Status check_duration_ms(double ms) {
  if (ms > 0 && ms <= 3.6e6) return Status::ok();
  return Status::invalid_argument("--duration-ms {} must be > 0 and at most 3.6e6 (an hour)", ms);
}

// An unsigned 64-bit value (a seed) written as plain decimal digits that
// fit: CLI11 alone took "-1" as 2^64 - 1 and saturated 2^64.
inline const CLI::Validator kUnsigned64(
    [](std::string& text) -> std::string {
      std::uint64_t value = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return "\"" + text + "\" is not a whole number in 0..18446744073709551615";
      }
      return {};
    },
    "UINT64");

// A "host:port" (common/host_port.h), checked as the flag is parsed: a
// malformed one is the caller's error (exit 2) before a child is spawned or
// a line printed. Resolving the host is left to whoever connects or listens.
inline const CLI::Validator kHostPort(
    [](std::string& text) -> std::string {
      if (text.empty()) return "an empty value";  // an unset variable in a script
      auto parsed = split_host_port(text);
      return parsed ? "" : parsed.error().message();
    },
    "HOST:PORT");

// A policy file (sched/policy.h): read and checked as the flag is parsed,
// so a missing, unreadable or bad one is the caller's error (exit 2) with
// load_policy's reason, before anything runs. "" (an unset shell variable)
// is refused, not read as "no file".
inline const CLI::Validator kPolicyFile(
    [](std::string& text) -> std::string {
      if (text.empty()) return "an empty path";
      auto policy = sched::load_policy(text);
      return policy ? "" : policy.error().message();
    },
    "PATH");

// A duration flag's value: parse_duration's, at most a year. A bench adds
// it to the clock, and a value near INT64_MAX ns wrapped into the past
// (a 2562047h run ended at once, "verified", exit 0).
inline Result<TimeNs> parse_flag_duration(std::string_view text) {
  constexpr TimeNs kYearNs = TimeNs{365} * 24 * 3600 * 1'000'000'000;
  auto ns = parse_duration(text);
  if (ns && *ns > kYearNs) {
    return std::unexpected(Status::invalid_argument("\"{}\" is more than a year (expected at most 8760h)", text));
  }
  return ns;
}

// A duration above zero that fits in nanoseconds ("200ms", "60s"), at most
// a year: said at parse time, with parse_duration's reason ("too large"
// for 100000000h, not "not positive").
inline const CLI::Validator kPositiveDuration(
    [](std::string& text) -> std::string {
      auto ns = parse_flag_duration(text);
      if (!ns) return ns.error().message();
      return *ns > 0 ? "" : "\"" + text + "\" is zero (expected a positive duration)";
    },
    "DURATION");

// The name of a synthetic topology (topology/probe.h): an unknown one is a
// flag the caller got wrong (exit 2), said before anything runs.
inline const CLI::Validator kTopologyModel(
    [](std::string& text) -> std::string {
      const std::vector<std::string> names = topology::model_names();
      if (std::find(names.begin(), names.end(), text) != names.end()) return {};
      return fmt::format("topology model \"{}\" does not exist (expected one of: {})", text, fmt::join(names, ", "));
    },
    "MODEL");

// An integer flag's value in decimal: CLI11 reads integers with strtoll's
// base 0, so "010" was 8 and "0x10" 16 (a size flag refused "0x10").
inline const CLI::Validator kDecimalInteger(
    [](std::string& text) -> std::string {
      std::size_t at = text.find_first_not_of(" \t");  // strtoll skips leading blanks
      if (at == std::string::npos) return {};
      if (text[at] == '-' || text[at] == '+') ++at;
      const std::string_view base_prefix = "0123456789xXoObB";
      if (at + 1 < text.size() && text[at] == '0' && base_prefix.find(text[at + 1]) != std::string_view::npos) {
        return "\"" + text + "\": write the number in decimal (a leading 0 reads as octal, 0x as hexadecimal)";
      }
      return {};
    },
    "");

// Every integer flag of `app` and its subcommands checked with kDecimalInteger.
inline void require_decimal_integers(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name().substr(0, o->get_type_name().find(':'));
    if (type == "INT" || type == "UINT") o->check(kDecimalInteger);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) require_decimal_integers(*sub);
}

// The signals that stop `serve` and `store`, blocked in the calling thread
// (call it before any thread starts, so each inherits the mask) for sigwait
// to take. SIGHUP too (unless ignored, as under nohup): a closed terminal or
// ssh session ends them, where UCX's debug handler (UCX_DEBUG_SIGNO) had
// turned debug logging on instead.
inline sigset_t block_stop_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  for (int s : {SIGINT, SIGTERM}) sigaddset(&stop, s);
  // Not when ignored (nohup, kept by main): Linux queues a blocked signal
  // even when ignored, and sigwait would take it.
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) != 0 || hup.sa_handler != SIG_IGN) sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

inline const char* stop_signal_name(int s) { return s == SIGINT ? "SIGINT" : s == SIGTERM ? "SIGTERM" : "SIGHUP"; }

// A time flag in its name's unit (ms, us): above zero and at most `most`
// (`what` says how long that is), checked before it becomes nanoseconds
// (1e13 ms overflowed them, and was refused as "must be > 0"; NaN passes a
// range's comparisons).
inline CLI::Validator positive_at_most(double most, std::string what) {
  return CLI::Validator(
      [most, what](std::string& text) -> std::string {
        double v = 0;
        try {
          std::size_t end = 0;
          v = std::stod(text, &end);
          if (end != text.size()) return "\"" + text + "\" is not a number";
        } catch (const std::exception&) {
          return "\"" + text + "\" is not a number";
        }
        if (v > 0 && v <= most) return {};
        return fmt::format("{} must be > 0 and at most {} ({})", text, most, what);
      },
      "");
}

// A failed command's exit code: 2 for input the caller got wrong
// (invalid_argument, out_of_range; CLI11's own code for a bad flag), 1 for
// a failure while running.
inline int exit_code(const Status& s) {
  const StatusCode c = s.code();
  return c == StatusCode::kInvalidArgument || c == StatusCode::kOutOfRange ? 2 : 1;
}

// "baton <command>: <message>" on stderr; exit_code(s).
inline int fail_command(std::string_view command, const Status& s) {
  fmt::print(stderr, "baton {}: {}\n", command, s.message());
  return exit_code(s);
}

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_topo_command(CLI::App& parent);
Command add_serve_command(CLI::App& parent);
Command add_demo_command(CLI::App& parent);
Command add_store_command(CLI::App& parent);
// Internal: one rank process of `baton bench handoff`.
Command add_handoff_worker_command(CLI::App& parent);

// `baton bench <mode>`: one file per mode, each adding itself under `bench`.
std::vector<Command> add_bench_commands(CLI::App& parent);
Command add_bench_mixed(CLI::App& bench);
Command add_bench_ablation(CLI::App& bench);
Command add_bench_mlu_sweep(CLI::App& bench);
Command add_bench_deadlines(CLI::App& bench);
Command add_bench_compress(CLI::App& bench);
Command add_bench_plan(CLI::App& bench);
Command add_bench_dualpath(CLI::App& bench);
Command add_bench_fault(CLI::App& bench);
Command add_bench_throughput(CLI::App& bench);
Command add_bench_idle(CLI::App& bench);
Command add_bench_latency(CLI::App& bench);
Command add_bench_handoff(CLI::App& bench);
Command add_bench_store(CLI::App& bench);
Command add_bench_matrix(CLI::App& bench);

}  // namespace baton::cli
