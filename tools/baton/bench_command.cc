#include "commands.h"

namespace baton::cli {

std::vector<Command> add_bench_commands(CLI::App& parent) {
  CLI::App* bench = parent.add_subcommand("bench", "Run a benchmark; every mode can write its figures as JSON");
  bench->require_subcommand(1);
  std::vector<Command> modes;
  // Each bench mode registers here.
  modes.push_back(add_bench_mixed(*bench));
  modes.push_back(add_bench_ablation(*bench));
  modes.push_back(add_bench_mlu_sweep(*bench));
  modes.push_back(add_bench_deadlines(*bench));
  modes.push_back(add_bench_compress(*bench));
  modes.push_back(add_bench_plan(*bench));
  modes.push_back(add_bench_dualpath(*bench));
  modes.push_back(add_bench_fault(*bench));
  modes.push_back(add_bench_throughput(*bench));
  modes.push_back(add_bench_idle(*bench));
  modes.push_back(add_bench_latency(*bench));
  modes.push_back(add_bench_handoff(*bench));
  modes.push_back(add_bench_store(*bench));
  modes.push_back(add_bench_matrix(*bench));
  return modes;
}

}  // namespace baton::cli
