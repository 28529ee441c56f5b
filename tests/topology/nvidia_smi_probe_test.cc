// probe_nvidia_smi against stand-ins for nvidia-smi on PATH: one that
// answers, one that hangs (a wedged driver), one that prints without end and
// one that fails. The probe ends each within its bounds and leaves no
// process behind.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "baton/topology/probe.h"

namespace baton::topology {
namespace {

namespace fs = std::filesystem;

// A directory holding an executable `nvidia-smi` with `script` as its body,
// put first on PATH for the test's length.
class FakeNvidiaSmi {
 public:
  explicit FakeNvidiaSmi(const std::string& script)
      : dir_(fs::temp_directory_path() /
             ("baton-fake-smi-" + std::to_string(getpid()) + "-" + std::to_string(instances_++))) {
    fs::create_directories(dir_);
    const fs::path program = dir_ / "nvidia-smi";
    std::ofstream(program) << "#!/bin/sh\n" << script << "\n";
    fs::permissions(program, fs::perms::owner_all);
    const char* path = std::getenv("PATH");
    old_path_ = path == nullptr ? "" : path;
    ::setenv("PATH", (dir_.string() + ":" + old_path_).c_str(), 1);
  }
  ~FakeNvidiaSmi() {
    ::setenv("PATH", old_path_.c_str(), 1);
    fs::remove_all(dir_);
  }
  FakeNvidiaSmi(const FakeNvidiaSmi&) = delete;
  FakeNvidiaSmi& operator=(const FakeNvidiaSmi&) = delete;
  [[nodiscard]] fs::path marker() const { return dir_ / "child.pid"; }

 private:
  static inline int instances_ = 0;
  fs::path dir_;
  std::string old_path_;
};

// Whether `pid` still runs: gone, or a zombie its new parent has yet to reap, is not.
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

const std::string kTwoGpus =
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\\n"
    "GPU0\t X \tNV4\t0-7\t0\\n"
    "GPU1\tNV4\t X \t0-7\t0\\n";

TEST(NvidiaSmiProbe, ReadsTheCommandsTable) {
  FakeNvidiaSmi smi("printf '" + kTwoGpus + "'");
  auto facts = probe_nvidia_smi();
  ASSERT_TRUE(facts.has_value()) << facts.error().to_string();
  EXPECT_EQ(facts->gpus.size(), 2u);
}

TEST(NvidiaSmiProbe, AHungCommandIsKilledWithItsChildrenAtTheTimeout) {
  // The script's child writes its pid, then both sleep: a wedged driver.
  FakeNvidiaSmi smi("");
  {
    FakeNvidiaSmi hung("sleep 3600 & echo $! > " + smi.marker().string() + "; wait");
    const auto start = std::chrono::steady_clock::now();
    auto facts = probe_nvidia_smi(std::chrono::seconds(3));  // room for sh to start its child on a busy machine
    const auto took = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(facts.has_value());
    EXPECT_EQ(facts.error().code(), StatusCode::kUnavailable);
    EXPECT_NE(facts.error().message().find("no end within 3000 ms"), std::string::npos) << facts.error().message();
    EXPECT_LT(took, std::chrono::seconds(10));
  }
  std::ifstream marker(smi.marker());
  pid_t child = 0;
  ASSERT_TRUE(marker >> child) << "the script's child never started";
  for (int i = 0; i < 200 && running(child); ++i) ::usleep(10'000);
  EXPECT_FALSE(running(child)) << "the command's child " << child << " was left running";
}

TEST(NvidiaSmiProbe, EndlessOutputIsRefusedAt16MiB) {
  FakeNvidiaSmi smi("yes GPU0");
  auto facts = probe_nvidia_smi();
  ASSERT_FALSE(facts.has_value());
  EXPECT_NE(facts.error().message().find("more than 16777216 bytes"), std::string::npos) << facts.error().message();
}

TEST(NvidiaSmiProbe, AFailedCommandSaysItsFirstLineEscaped) {
  FakeNvidiaSmi smi("printf 'NVIDIA-SMI has failed \\033[31m\\n'; exit 9");
  auto facts = probe_nvidia_smi();
  ASSERT_FALSE(facts.has_value());
  EXPECT_NE(facts.error().message().find("NVIDIA-SMI has failed"), std::string::npos) << facts.error().message();
  EXPECT_EQ(facts.error().message().find('\033'), std::string::npos) << "a raw escape reaches the terminal";
}

}  // namespace
}  // namespace baton::topology
