#include "baton/sched/policy.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace baton::sched {
namespace {

using topology::PathType;

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * 1024;

constexpr std::array<PathType, topology::kPathTypeCount> kAllPaths{
    PathType::kNvlink, PathType::kNvswitch, PathType::kPcieP2p, PathType::kHostStaging,
    PathType::kGdr,    PathType::kRdma,     PathType::kTcp,     PathType::kShm};

void expect_same(const SchedPolicy& actual, const SchedPolicy& expected) {
  EXPECT_EQ(actual.kind, expected.kind);
  EXPECT_EQ(actual.w_deadline, expected.w_deadline);
  EXPECT_EQ(actual.w_priority, expected.w_priority);
  EXPECT_EQ(actual.w_aging, expected.w_aging);
  for (int q = 0; q < kQosClassCount; ++q) {
    EXPECT_EQ(actual.class_priority[q], expected.class_priority[q])
        << to_string(static_cast<QosClass>(q));
  }
  EXPECT_EQ(actual.starvation_bound_ns, expected.starvation_bound_ns);
  EXPECT_EQ(actual.deadline_horizon_ns, expected.deadline_horizon_ns);
  EXPECT_EQ(actual.transfer_timeout_ns, expected.transfer_timeout_ns);
  for (PathType path : kAllPaths) {
    SCOPED_TRACE(std::string(to_string(path)));
    EXPECT_EQ(actual.slice_for(path), expected.slice_for(path));
    EXPECT_EQ(actual.credits_for(path).lanes, expected.credits_for(path).lanes);
    EXPECT_EQ(actual.credits_for(path).slices_per_lane, expected.credits_for(path).slices_per_lane);
    EXPECT_EQ(actual.credits_for(path).inflight_bytes, expected.credits_for(path).inflight_bytes);
  }
  EXPECT_EQ(actual.preemption, expected.preemption);
  EXPECT_EQ(actual.preempt_min_class, expected.preempt_min_class);
}

SchedPolicy parse_ok(std::string_view yaml) {
  auto policy = parse_policy(yaml);
  EXPECT_TRUE(policy.has_value()) << policy.error().to_string();
  return policy.value_or(SchedPolicy::defaults());
}

// The message of the error that parse_policy must return for `yaml`.
std::string error_for(std::string_view yaml) {
  const auto policy = parse_policy(yaml);
  if (policy.has_value()) return "(accepted)";
  EXPECT_EQ(policy.error().code(), StatusCode::kInvalidArgument) << policy.error().message();
  return policy.error().message();
}

// ---- Defaults and the shipped file ------------------------------------------

TEST(SchedPolicyDefaults, DocumentedValues) {
  const SchedPolicy p = SchedPolicy::defaults();
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().to_string();
  EXPECT_EQ(p.kind, PolicyKind::kDeadlineAware);
  EXPECT_EQ(p.w_deadline, 1.0);
  EXPECT_EQ(p.w_priority, 1.0);
  EXPECT_EQ(p.w_aging, 0.05);
  EXPECT_EQ(p.class_priority, (std::array<double, kQosClassCount>{10000, 5000, 1000, 0}));
  EXPECT_EQ(p.starvation_bound_ns, 50'000'000);
  EXPECT_TRUE(p.preemption);
  EXPECT_EQ(p.preempt_min_class, QosClass::kDecodeCritical);

  EXPECT_EQ(p.slice_for(PathType::kNvlink), 512 * kKiB);
  EXPECT_EQ(p.slice_for(PathType::kNvswitch), 512 * kKiB);
  EXPECT_EQ(p.slice_for(PathType::kPcieP2p), 256 * kKiB);
  EXPECT_EQ(p.slice_for(PathType::kHostStaging), kMiB);
  EXPECT_EQ(p.slice_for(PathType::kTcp), 256 * kKiB);
  for (PathType path : {PathType::kGdr, PathType::kRdma, PathType::kShm}) {
    EXPECT_EQ(p.slice_for(path), 64 * kKiB) << to_string(path);
  }
  for (PathType path : kAllPaths) {
    const bool fabric = path == PathType::kNvlink || path == PathType::kNvswitch;
    const bool tcp = path == PathType::kTcp;  // a byte budget: 1 MiB of any slices
    const bool staging = path == PathType::kHostStaging;  // two 1 MiB copies queued
    const PathCredits& c = p.credits_for(path);
    EXPECT_EQ(c.lanes, fabric ? 4 : 2) << to_string(path);
    EXPECT_EQ(c.slices_per_lane, tcp ? 8 : 2) << to_string(path);
    EXPECT_EQ(c.inflight_bytes, fabric ? 8 * kMiB : tcp ? kMiB : staging ? 2 * kMiB : 4 * kMiB) << to_string(path);
  }
}

TEST(SchedPolicyFile, ShippedFileEqualsDefaults) {
  const auto policy = load_policy(BATON_SOURCE_DIR "/configs/sched_policy.yaml");
  ASSERT_TRUE(policy.has_value()) << policy.error().to_string();
  expect_same(*policy, SchedPolicy::defaults());
}

TEST(SchedPolicyParse, EmptyDocumentIsDefaults) {
  for (std::string_view yaml : {"", "\n\n", "# nothing but a comment\n", "---\n", "~\n",
                                "weights:\nslice_size:\ncredits:\n  nvlink:\n"}) {
    SCOPED_TRACE(std::string(yaml));
    expect_same(parse_ok(yaml), SchedPolicy::defaults());
  }
}

TEST(SchedPolicyParse, PartialFileKeepsTheRestDefault) {
  const SchedPolicy p = parse_ok(
      "policy: baseline_fifo\n"
      "weights: {aging: 0.25}\n"
      "slice_size:\n"
      "  tcp: 16KiB\n");
  SchedPolicy expected = SchedPolicy::defaults();
  expected.kind = PolicyKind::kBaselineFifo;
  expected.w_aging = 0.25;
  expected.slice_bytes[static_cast<int>(PathType::kTcp)] = 16 * kKiB;
  expect_same(p, expected);
}

TEST(SchedPolicyParse, EveryKeySet) {
  const SchedPolicy p = parse_ok(
      "policy: baseline_fifo\n"
      "weights: {deadline: 2, priority: 0.5, aging: 0}\n"
      "class_priority: {decode_critical: 900, hot_kv: 500.5, prefill_bulk: 10, background: 1}\n"
      "starvation_bound: 250us\n"
      "deadline_horizon: 3ms\n"
      "transfer_timeout: 2s\n"
      "slice_size: {default: 32KiB, nvlink: 1MiB}\n"
      "credits:\n"
      "  default: {lanes: 1, slices_per_lane: 3, inflight_bytes: 2MiB}\n"
      "  nvlink: {lanes: 8, slices_per_lane: 4, inflight_bytes: 16MiB}\n"
      "preemption: {enabled: false, min_class: hot_kv}\n");
  EXPECT_EQ(p.kind, PolicyKind::kBaselineFifo);
  EXPECT_EQ(p.w_deadline, 2.0);
  EXPECT_EQ(p.w_priority, 0.5);
  EXPECT_EQ(p.w_aging, 0.0);
  EXPECT_EQ(p.class_priority, (std::array<double, kQosClassCount>{900, 500.5, 10, 1}));
  EXPECT_EQ(p.starvation_bound_ns, 250'000);
  EXPECT_EQ(p.deadline_horizon_ns, 3'000'000);
  EXPECT_EQ(p.transfer_timeout_ns, 2'000'000'000);
  EXPECT_FALSE(p.preemption);
  EXPECT_EQ(p.preempt_min_class, QosClass::kHotKv);
  for (PathType path : kAllPaths) {
    SCOPED_TRACE(std::string(to_string(path)));
    const bool nvlink = path == PathType::kNvlink;
    EXPECT_EQ(p.slice_for(path), nvlink ? 1 * kMiB : 32 * kKiB);
    EXPECT_EQ(p.credits_for(path).lanes, nvlink ? 8 : 1);
    EXPECT_EQ(p.credits_for(path).slices_per_lane, nvlink ? 4 : 3);
    EXPECT_EQ(p.credits_for(path).inflight_bytes, nvlink ? 16 * kMiB : 2 * kMiB);
  }
}

TEST(SchedPolicyParse, YamlBooleanSpellings) {
  EXPECT_FALSE(parse_ok("preemption: {enabled: no}\n").preemption);
  EXPECT_FALSE(parse_ok("preemption: {enabled: off}\n").preemption);
  EXPECT_TRUE(parse_ok("preemption: {enabled: yes}\n").preemption);
}

// ---- Precedence: built-in < file default < file per-path ---------------------

TEST(SchedPolicyParse, SliceSizeDefaultThenPerPath) {
  // `default` replaces the built-in value of every path not listed, including
  // the fabric paths' 512 KiB; where it stands in the mapping does not matter.
  for (std::string_view yaml : {"slice_size: {default: 128KiB, nvlink: 1MiB}\n",
                                "slice_size: {nvlink: 1MiB, default: 128KiB}\n"}) {
    SCOPED_TRACE(std::string(yaml));
    const SchedPolicy p = parse_ok(yaml);
    for (PathType path : kAllPaths) {
      EXPECT_EQ(p.slice_for(path), path == PathType::kNvlink ? 1 * kMiB : 128 * kKiB)
          << to_string(path);
    }
  }
}

TEST(SchedPolicyParse, CreditsMergeKeyByKey) {
  const SchedPolicy p = parse_ok(
      "credits:\n"
      "  nvswitch: {lanes: 6}\n"
      "  default: {lanes: 3, inflight_bytes: 16MiB}\n");
  // nvswitch: its own lanes, the file default's bytes, the built-in slices_per_lane.
  EXPECT_EQ(p.credits_for(PathType::kNvswitch).lanes, 6);
  EXPECT_EQ(p.credits_for(PathType::kNvswitch).slices_per_lane, 2);
  EXPECT_EQ(p.credits_for(PathType::kNvswitch).inflight_bytes, 16 * kMiB);
  for (PathType path : kAllPaths) {
    if (path == PathType::kNvswitch) continue;
    EXPECT_EQ(p.credits_for(path).lanes, 3) << to_string(path);
    EXPECT_EQ(p.credits_for(path).slices_per_lane, path == PathType::kTcp ? 8 : 2) << to_string(path);
    EXPECT_EQ(p.credits_for(path).inflight_bytes, 16 * kMiB) << to_string(path);
  }
}

TEST(SchedPolicyParse, CreditsPerPathOnlyKeepsThatPathsBuiltIns) {
  const SchedPolicy p = parse_ok("credits: {nvlink: {slices_per_lane: 5}}\n");
  EXPECT_EQ(p.credits_for(PathType::kNvlink).lanes, 4);
  EXPECT_EQ(p.credits_for(PathType::kNvlink).slices_per_lane, 5);
  EXPECT_EQ(p.credits_for(PathType::kNvlink).inflight_bytes, 8 * kMiB);
  EXPECT_EQ(p.credits_for(PathType::kTcp).slices_per_lane, 8);
}

// ---- Bad values: origin, line, dotted key, quoted value ----------------------

struct BadValue {
  const char* yaml;
  const char* message_start;  // "<origin>:<line>: <key>: <what>" up to the quoted value
};

TEST(SchedPolicyParse, BadValuesNameTheKeyAndLine) {
  const BadValue cases[] = {
      {"# weights\nweights:\n  aging: -1\n", "<string>:3: weights.aging: \"-1\" is negative"},
      {"weights: {deadline: abc}\n", "<string>:1: weights.deadline: \"abc\" is not a number"},
      {"weights: {priority: 1.5x}\n", "<string>:1: weights.priority: \"1.5x\" is not a number"},
      {"weights: {priority: inf}\n", "<string>:1: weights.priority: \"inf\" is not finite"},
      {"weights: {priority: 1e400}\n", "<string>:1: weights.priority: \"1e400\" is out of range"},
      // Finite but so large that urgencies overflowed to inf, and their differences to NaN.
      {"weights:\n  deadline: 1e308\n", "<string>:2: weights.deadline: \"1e308\" is above 1e+06 (a factor)"},
      {"class_priority: {hot_kv: 1e10}\n", "<string>:1: class_priority.hot_kv: \"1e10\" is above 1e+09 (µs of laxity)"},
      {"weights: {deadline: [1]}\n", "<string>:1: weights.deadline: expected a value, got a sequence"},
      {"weights: 3\n", "<string>:1: weights: expected a mapping, got \"3\""},
      {"\nweights: [1, 2]\n", "<string>:2: weights: expected a mapping, got a sequence"},
      {"class_priority:\n  hot_kv: -5\n", "<string>:2: class_priority.hot_kv: \"-5\" is negative"},
      {"class_priority:\n  urgent: 1\n", "<string>:2: class_priority: unknown class \"urgent\""},
      {"starvation_bound: 50\n", "<string>:1: starvation_bound: \"50\": no unit"},
      {"starvation_bound: 2 parsecs\n",
       "<string>:1: starvation_bound: \"2 parsecs\": unknown unit \"parsecs\""},
      {"starvation_bound: -5ms\n", "<string>:1: starvation_bound: \"-5ms\""},
      {"starvation_bound: 0ms\n", "<string>:1: starvation_bound: \"0ms\" is zero"},
      {"starvation_bound: {a: 1}\n", "<string>:1: starvation_bound: expected a value, got a mapping"},
      {"deadline_horizon: 10\n", "<string>:1: deadline_horizon: \"10\": no unit"},
      {"policy: edf\x1b[0m\n", "<string>:1: control character 0x1b"},
      {"transfer_timeout: 0s\n", "<string>:1: transfer_timeout: \"0s\" is zero"},
      {"transfer_timeout: 0\n", "<string>:1: transfer_timeout: \"0\" is zero (expected a positive duration)"},
      {"transfer_timeout: 0.0.0\n", "<string>:1: transfer_timeout: \"0.0.0\": unknown unit \".0\""},
      {"admission:\n  reevaluate_interval: 0\n", "<string>:2: admission.reevaluate_interval: \"0\" is zero"},
      {"transfer_timeout: -1s\n", "<string>:1: transfer_timeout: \"-1s\""},
      {"deadline_horizon: -1ms\n", "<string>:1: deadline_horizon: \"-1ms\""},
      {"deadline_horizon: [1ms]\n", "<string>:1: deadline_horizon: expected a value, got a sequence"},
      {"slice_size:\n  default: 64KiB\n  nvlink: 12 parsecs\n",
       "<string>:3: slice_size.nvlink: \"12 parsecs\": unknown unit \"parsecs\""},
      {"slice_size:\n  tcp: -1KiB\n", "<string>:2: slice_size.tcp: \"-1KiB\""},
      {"slice_size:\n  default: 0\n", "<string>:2: slice_size.default: \"0\" is zero"},
      {"slice_size:\n  shm: 0KiB\n", "<string>:2: slice_size.shm: \"0KiB\" is zero"},
      {"slice_size:\n  tcp: 1B\n", "<string>:2: slice_size.tcp: \"1B\" is below the smallest slice, 4096 bytes"},
      {"slice_size:\n  default: 4095\n", "<string>:2: slice_size.default: \"4095\" is below the smallest slice"},
      {"slice_size:\n  nvlinc: 1MiB\n", "<string>:2: slice_size: unknown path \"nvlinc\""},
      {"slice_size: 64KiB\n", "<string>:1: slice_size: expected a mapping, got \"64KiB\""},
      {"credits:\n  tcp: {lanes: 0}\n", "<string>:2: credits.tcp.lanes: \"0\" is less than 1"},
      {"credits:\n  tcp:\n    lanes: -3\n", "<string>:3: credits.tcp.lanes: \"-3\" is less than 1"},
      {"credits:\n  default:\n    slices_per_lane: 0\n",
       "<string>:3: credits.default.slices_per_lane: \"0\" is less than 1"},
      {"credits:\n  rdma: {lanes: 1.5}\n", "<string>:2: credits.rdma.lanes: \"1.5\" is not a whole number"},
      {"credits:\n  rdma: {lanes: 99999999999}\n", "<string>:2: credits.rdma.lanes: \"99999999999\" is out of range"},
      {"credits:\n  tcp:\n    lanes: 65\n", "<string>:3: credits.tcp.lanes: \"65\" is above 64"},
      {"credits:\n  default: {slices_per_lane: 65537}\n",
       "<string>:2: credits.default.slices_per_lane: \"65537\" is above 65536"},
      {"credits:\n  gdr: {inflight_bytes: lots}\n", "<string>:2: credits.gdr.inflight_bytes: \"lots\""},
      {"credits:\n  shm: {inflight_bytes: 32KiB}\n",
       "<string>:2: credits.shm.inflight_bytes: \"32KiB\" is smaller than the shm slice size (64 KiB)"},
      // The file default's bytes would starve the fabric paths' 512 KiB slices.
      {"credits:\n  default: {inflight_bytes: 256KiB}\n",
       "<string>:2: credits.default.inflight_bytes: \"256KiB\" is smaller than the nvlink slice size "
       "(512 KiB)"},
      // A slice larger than the built-in inflight budget: the slice line is the one to change.
      {"slice_size:\n  tcp: 8MiB\n",
       "<string>:2: slice_size.tcp: \"8MiB\" is larger than the tcp inflight_bytes (1 MiB)"},
      {"credits:\n  nvlink: 4\n", "<string>:2: credits.nvlink: expected a mapping, got \"4\""},
      {"credits:\n  infiniband: {lanes: 2}\n", "<string>:2: credits: unknown path \"infiniband\""},
      {"policy: fastest\n", "<string>:1: policy: unknown policy \"fastest\" (expected deadline_aware, "
                            "baseline_fifo, strict_priority or edf)"},
      {"policy: [deadline_aware]\n", "<string>:1: policy: expected a value, got a sequence"},
      {"\npolicy:\n", "<string>:2: policy: expected a value, got nothing"},
      {"preemption:\n  enabled: maybe\n", "<string>:2: preemption.enabled: \"maybe\" is not true or false"},
      {"preemption:\n  min_class: vip\n", "<string>:2: preemption.min_class: unknown class \"vip\""},
      {"preemption: true\n", "<string>:1: preemption: expected a mapping, got \"true\""},
  };
  for (const BadValue& c : cases) {
    SCOPED_TRACE(c.yaml);
    const std::string message = error_for(c.yaml);
    EXPECT_TRUE(message.starts_with(c.message_start)) << message;
  }
}

TEST(SchedPolicyParse, BadValueMessagesInFull) {
  EXPECT_EQ(error_for("slice_size:\n  nvlink: 12 parsecs\n"),
            "<string>:2: slice_size.nvlink: \"12 parsecs\": unknown unit \"parsecs\" (expected B, "
            "KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  EXPECT_EQ(error_for("slice_size: {nvlinc: 1MiB}\n"),
            "<string>:1: slice_size: unknown path \"nvlinc\" (expected default, nvlink, nvswitch, "
            "pcie_p2p, host_staging, gdr, rdma, tcp or shm)");
  EXPECT_EQ(error_for("class_priority: {urgent: 1}\n"),
            "<string>:1: class_priority: unknown class \"urgent\" (expected decode_critical, "
            "hot_kv, prefill_bulk or background)");
}

// ---- Unknown keys, duplicates, document shape, syntax ------------------------

TEST(SchedPolicyParse, ANulByteIsRefusedNotLoopedOn) {
  // yaml-cpp 0.7 never returns on this (fuzz/policy_fuzzer found it).
  const std::string text("# a comment\n# b\0c\npolicy: edf\n", 31);
  const auto p = parse_policy(text);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().message(), "<string>:2: control character 0x00 (a policy file is UTF-8 text)");
  // Nor is text that is not UTF-8 (0xff runs also hung yaml-cpp); UTF-8 is fine.
  const auto latin1 = parse_policy("# pinned host memory \xff\xff\n");
  ASSERT_FALSE(latin1.has_value());
  EXPECT_EQ(latin1.error().message(), "<string>:1: byte 0xff is not UTF-8 (a policy file is UTF-8 text)");
  EXPECT_FALSE(parse_policy("# truncated \xe2\x88").has_value());
  EXPECT_FALSE(parse_policy("# overlong \xc0\xaf\n").has_value());
  EXPECT_TRUE(parse_policy("# µs, ·, −, 🚀\npolicy: edf\n").has_value());
}

TEST(SchedPolicyParse, UnknownTopLevelKey) {
  EXPECT_EQ(error_for("policy: deadline_aware\npolcy: baseline_fifo\n"),
            "<string>:2: unknown key \"polcy\" (expected one of: policy, weights, class_priority, "
            "deadline_horizon, starvation_bound, transfer_timeout, slice_size, credits, preemption, admission, "
            "cost_model)");
}

TEST(SchedPolicyParse, AdmissionSection) {
  const auto p = parse_policy(
                     "admission:\n  theta_compress: 0.5\n  theta_local: 2\n  order: edf\n  drop_infeasible: yes\n"
                     "  max_owners: 8\n  max_inflight_bytes: 64MiB\n  reevaluate_slices: 4\n"
                     "  reevaluate_interval: 50us\n  estimator_alpha: 0.5\n")
                     .value();
  EXPECT_DOUBLE_EQ(p.admission.theta_compress, 0.5);
  EXPECT_DOUBLE_EQ(p.admission.theta_local, 2.0);
  EXPECT_EQ(p.admission.order, AdmissionOrder::kEdf);
  EXPECT_TRUE(p.admission.drop_infeasible);
  EXPECT_EQ(p.admission.max_owners, 8);
  EXPECT_EQ(p.admission.max_inflight_bytes, 64u << 20);
  EXPECT_EQ(p.admission.reevaluate_slices, 4);
  EXPECT_EQ(p.admission.reevaluate_interval_ns, 50'000);
  EXPECT_DOUBLE_EQ(p.admission.estimator_alpha, 0.5);
  EXPECT_EQ(parse_policy("admission:\n  order: fifo\n")->admission, SchedPolicy::defaults().admission);
}

TEST(SchedPolicyParse, AdmissionBadValues) {
  const std::pair<const char*, const char*> cases[] = {
      {"admission:\n  theta_local: -1\n", "<string>:2: admission.theta_local:"},
      {"admission:\n  theta_compress: 2\n  theta_local: 1\n", "theta_compress 2 is above theta_local 1"},
      {"admission:\n  order: lifo\n", "<string>:2: admission.order: unknown order \"lifo\""},
      {"admission:\n  drop_infeasible: maybe\n", "<string>:2: admission.drop_infeasible: \"maybe\""},
      {"admission:\n  max_owners: -1\n", "<string>:2: admission.max_owners: \"-1\""},
      {"admission:\n  max_inflight_bytes: lots\n", "<string>:2: admission.max_inflight_bytes:"},
      {"admission:\n  reevaluate_slices: 0\n", "<string>:2: admission.reevaluate_slices:"},
      {"admission:\n  reevaluate_interval: 0us\n", "<string>:2: admission.reevaluate_interval:"},
      {"admission:\n  reevaluate_interval: 100\n", "no unit"},
      {"admission:\n  estimator_alpha: 2\n", "<string>:2: admission.estimator_alpha: 2 is outside (0, 1]"},
      {"admission:\n  thetacompress: 1\n", "unknown key \"admission.thetacompress\""},
  };
  for (const auto& [yaml, expected] : cases) {
    const std::string message = error_for(yaml);
    EXPECT_NE(message.find(expected), std::string::npos) << yaml << " -> " << message;
  }
}

TEST(SchedPolicyParse, UnknownNestedKeys) {
  EXPECT_EQ(error_for("weights:\n  deadline: 1\n  dedline: 2\n"),
            "<string>:3: unknown key \"weights.dedline\" (expected one of: deadline, priority, "
            "aging)");
  EXPECT_EQ(error_for("credits:\n  default: {lanes: 2}\n  nvswitch:\n    lane: 4\n"),
            "<string>:4: unknown key \"credits.nvswitch.lane\" (expected one of: lanes, "
            "slices_per_lane, inflight_bytes)");
  EXPECT_EQ(error_for("preemption: {enable: true}\n"),
            "<string>:1: unknown key \"preemption.enable\" (expected one of: enabled, min_class)");
}

TEST(SchedPolicyParse, DuplicateKeysAreRefused) {
  EXPECT_EQ(error_for("policy: baseline_fifo\npolicy: deadline_aware\n"),
            "<string>:2: duplicate key \"policy\" (first on line 1)");
  EXPECT_EQ(error_for("slice_size:\n  tcp: 8KiB\n  tcp: 16KiB\n"),
            "<string>:3: duplicate key \"slice_size.tcp\" (first on line 2)");
}

TEST(SchedPolicyParse, KeysMustBeNames) {
  const std::string message = error_for("? [a, b]\n: 1\n");
  EXPECT_TRUE(message.starts_with("<string>:1: ")) << message;
  EXPECT_NE(message.find("a key must be a name, got a sequence"), std::string::npos) << message;
}

TEST(SchedPolicyParse, DocumentMustBeAMapping) {
  EXPECT_EQ(error_for("- policy\n- weights\n"),
            "<string>:1: expected a mapping of policy keys, got a sequence");
  EXPECT_EQ(error_for("# a comment\n\ndeadline_aware\n"),
            "<string>:3: expected a mapping of policy keys, got \"deadline_aware\"");
  EXPECT_EQ(error_for("42\n"), "<string>:1: expected a mapping of policy keys, got \"42\"");
  // A file read by mistake is one long scalar: shown shortened, not whole.
  const std::string text = error_for(std::string(5000, 'x') + "\n");
  EXPECT_NE(text.find("… (5000 bytes)"), std::string::npos) << text;
  EXPECT_LT(text.size(), 200u) << text;
}

TEST(SchedPolicyParse, OneDocumentPerFile) {
  EXPECT_EQ(error_for("policy: baseline_fifo\n---\npolicy: deadline_aware\n"),
            "<string>:3: a second YAML document (expected one policy per file)");
}

// YAML::Load reads the first value and dropped what followed it without a
// word: after a flow mapping, every later key (even a bad value) was
// ignored, and a lone "," read as the defaults.
TEST(SchedPolicyParse, NothingAfterTheFirstValueIsDroppedSilently) {
  EXPECT_EQ(error_for("{policy: edf}\nstarvation_bound: 0s\ntransfer_timeout: potato\n"),
            "<string>:2: more YAML after the first value (a policy file is one mapping)");
  EXPECT_EQ(error_for("{policy: edf}\n{policy: baseline_fifo}\n"),
            "<string>:2: more YAML after the first value (a policy file is one mapping)");
  EXPECT_EQ(error_for(","), "<string>:1: more YAML after the first value (a policy file is one mapping)");
  EXPECT_EQ(error_for(", policy: edf"), "<string>:1: more YAML after the first value (a policy file is one mapping)");
  EXPECT_TRUE(parse_policy("{policy: edf}\n# a comment\n").has_value());
}

// A long mapping is refused at its first bad key at once: the duplicate
// check was a scan of the earlier keys (quadratic: 100 000 keys took 13 s).
TEST(SchedPolicyParse, ALongMappingIsCheckedInOnePass) {
  std::string text = "slice_size:\n";
  for (int i = 0; i < 30'000; ++i) text += fmt::format("  p{}: 1MiB\n", i);
  EXPECT_EQ(error_for(text).substr(0, 35), "<string>:2: slice_size: unknown pat");
  text += "  p0: 2MiB\n";  // every key is looked at (for duplicates) before any is used
  EXPECT_NE(error_for(text).find(":30002: duplicate key \"slice_size.p0\" (first on line 2)"), std::string::npos)
      << error_for(text);
}

TEST(SchedPolicyParse, AFileOverAMegabyteIsRefused) {
  std::string text = "policy: edf\n";
  text += std::string(1 << 20, '#');
  EXPECT_EQ(error_for(text), "<string>: more than 1048576 bytes (a policy file is a page of settings)");
}

TEST(SchedPolicyParse, SyntaxErrorsCarryTheLine) {
  struct Case {
    const char* yaml;
    const char* message_start;
  };
  const Case cases[] = {
      {"policy: deadline_aware\nweights: {deadline: 1.0\npolicy: x\n", "<string>:3: invalid YAML: "},
      {"policy: deadline_aware\n  weights: 2\n", "<string>:2: invalid YAML: "},
      {"weights: &w {aging: 1}\nclass_priority: *missing\n", "<string>:2: invalid YAML: "},
      {"\t policy: x\n", "<string>:1: invalid YAML: "},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    const std::string message = error_for(c.yaml);
    EXPECT_TRUE(message.starts_with(c.message_start)) << message;
  }
}

TEST(SchedPolicyParse, OriginNamesTheText) {
  const auto policy = parse_policy("policy: fifo\n", "my.yaml");
  ASSERT_FALSE(policy.has_value());
  EXPECT_TRUE(policy.error().message().starts_with("my.yaml:1: policy: unknown policy \"fifo\""))
      << policy.error().message();
}

// ---- load_policy -------------------------------------------------------------

class LoadPolicy : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  std::string write(std::string_view text) {
    path_ = ::testing::TempDir() + "baton_policy_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".yaml";
    std::ofstream(path_, std::ios::binary) << text;
    return path_;
  }
  std::string path_;
};

TEST_F(LoadPolicy, MissingFileIsNotFoundNamingThePath) {
  const std::string missing = BATON_SOURCE_DIR "/configs/no_such_policy.yaml";
  const auto policy = load_policy(missing);
  ASSERT_FALSE(policy.has_value());
  EXPECT_EQ(policy.error().code(), StatusCode::kNotFound);
  EXPECT_NE(policy.error().message().find("\"" + missing + "\""), std::string::npos)
      << policy.error().message();
}

TEST_F(LoadPolicy, DirectoryIsNotFound) {
  const auto policy = load_policy(BATON_SOURCE_DIR "/configs");
  ASSERT_FALSE(policy.has_value());
  EXPECT_EQ(policy.error().code(), StatusCode::kNotFound);
  EXPECT_NE(policy.error().message().find(BATON_SOURCE_DIR "/configs"), std::string::npos)
      << policy.error().message();
}

TEST_F(LoadPolicy, ParseErrorsArePrefixedWithThePath) {
  const std::string path = write("policy: deadline_aware\nweights:\n  aging: -0.5\n");
  const auto policy = load_policy(path);
  ASSERT_FALSE(policy.has_value());
  EXPECT_EQ(policy.error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(policy.error().message(), path + ":3: weights.aging: \"-0.5\" is negative (expected >= 0)");
}

// A file that cannot be read made the stream throw (abort); it is an error.
TEST_F(LoadPolicy, AnUnreadableFileIsAnErrorNotAnAbort) {
  const auto policy = load_policy("/proc/self/mem");
  ASSERT_FALSE(policy.has_value());
  EXPECT_EQ(policy.error().code(), StatusCode::kNotFound);
  EXPECT_NE(policy.error().message().find("cannot be read"), std::string::npos) << policy.error().message();
}

// A NUL ends the path for the system calls: another file would be read.
TEST_F(LoadPolicy, APathWithANulIsRefused) {
  const std::string path = write("policy: edf\n");
  const auto policy = load_policy(path + std::string("\0.ignored", 9));
  ASSERT_FALSE(policy.has_value());
  EXPECT_EQ(policy.error().code(), StatusCode::kInvalidArgument) << policy.error().to_string();
  ASSERT_TRUE(load_policy(path).has_value());
}

TEST_F(LoadPolicy, EmptyFileIsDefaults) {
  const auto policy = load_policy(write(""));
  ASSERT_TRUE(policy.has_value()) << policy.error().to_string();
  expect_same(*policy, SchedPolicy::defaults());
}

TEST_F(LoadPolicy, ReadsAFile) {
  const auto policy = load_policy(write("slice_size: {rdma: 128KiB}\n"));
  ASSERT_TRUE(policy.has_value()) << policy.error().to_string();
  EXPECT_EQ(policy->slice_for(PathType::kRdma), 128 * kKiB);
}

// ---- validate() ----------------------------------------------------------------

TEST(SchedPolicyValidate, RefusesOutOfRangeFields) {
  auto expect_refused = [](SchedPolicy p, std::string_view field) {
    const Status status = p.validate();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find(field), std::string::npos) << status.message();
  };
  SchedPolicy p = SchedPolicy::defaults();
  p.w_aging = -0.1;
  expect_refused(p, "w_aging");
  p = SchedPolicy::defaults();
  p.w_deadline = std::numeric_limits<double>::quiet_NaN();
  expect_refused(p, "w_deadline");
  p = SchedPolicy::defaults();
  p.class_priority[static_cast<int>(QosClass::kHotKv)] = -1;
  expect_refused(p, "class_priority[hot_kv]");
  p = SchedPolicy::defaults();
  p.w_priority = 1e308;
  expect_refused(p, "w_priority");
  p = SchedPolicy::defaults();
  p.class_priority[static_cast<int>(QosClass::kDecodeCritical)] = 1e300;
  expect_refused(p, "class_priority[decode_critical]");
  p = SchedPolicy::defaults();
  p.starvation_bound_ns = 0;
  expect_refused(p, "starvation_bound_ns");
  p = SchedPolicy::defaults();
  p.admission.order = static_cast<AdmissionOrder>(9);  // was accepted, and read as fifo
  expect_refused(p, "admission order 9 is not an order");
  // A cost override cast from integers indexed past the cost model's table
  // when an engine was built on it (free(): invalid pointer).
  for (const auto& [path, proximity] : {std::pair{8, 0}, std::pair{0, 9}, std::pair{255, 255}}) {
    p = SchedPolicy::defaults();
    p.cost_model.push_back({static_cast<PathType>(path), static_cast<topology::Proximity>(proximity), 10, 1});
    expect_refused(p, "cost_model[0] has path");
  }
  for (const auto& [gbps, us] : {std::pair{0.0, 1.0}, std::pair{1e-300, 1.0}, std::pair{1e12, 1.0},
                                 std::pair{std::numeric_limits<double>::quiet_NaN(), 1.0}, std::pair{1.0, -1.0},
                                 std::pair{1.0, 1e16}, std::pair{1.0, std::numeric_limits<double>::infinity()}}) {
    p = SchedPolicy::defaults();
    p.cost_model.push_back({PathType::kRdma, topology::Proximity::kRemote, 14, 1});
    p.cost_model.push_back({PathType::kTcp, topology::Proximity::kLocal, gbps, us});
    expect_refused(p, "cost_model[1] (tcp at local)");
  }
  p = SchedPolicy::defaults();
  p.cost_model.push_back({PathType::kTcp, topology::Proximity::kLocal, 1e5, 1e6});  // the bounds themselves
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().to_string();
  p = SchedPolicy::defaults();
  p.slice_bytes[static_cast<int>(PathType::kGdr)] = 0;
  expect_refused(p, "slice_bytes[gdr]");
  p = SchedPolicy::defaults();
  p.slice_bytes[static_cast<int>(PathType::kTcp)] = 1;  // a billion slices a GiB
  expect_refused(p, "slice_bytes[tcp] is 1");
  p = SchedPolicy::defaults();
  p.credits[static_cast<int>(PathType::kTcp)].lanes = 0;
  expect_refused(p, "credits[tcp]");
  p = SchedPolicy::defaults();
  p.credits[static_cast<int>(PathType::kShm)].slices_per_lane = 0;
  expect_refused(p, "credits[shm]");
  // Bounded above too: a billion of each ran the machine out of memory, and
  // their product overflowed the credit count.
  p = SchedPolicy::defaults();
  p.credits[static_cast<int>(PathType::kRdma)].lanes = PathCredits::kMaxLanes + 1;
  expect_refused(p, "credits[rdma] has 65 lanes");
  p = SchedPolicy::defaults();
  p.credits[static_cast<int>(PathType::kNvswitch)].slices_per_lane = 536870912;
  expect_refused(p, "expected 1..64 lanes and 1..65536 slices per lane");
  p = SchedPolicy::defaults();
  p.credits[static_cast<int>(PathType::kNvswitch)].lanes = PathCredits::kMaxLanes;
  p.credits[static_cast<int>(PathType::kNvswitch)].slices_per_lane = PathCredits::kMaxSlicesPerLane;
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().to_string();
  p = SchedPolicy::defaults();
  p.credits[static_cast<int>(PathType::kNvlink)].inflight_bytes = 64 * kKiB;
  expect_refused(p, "credits[nvlink].inflight_bytes");
  // A value-initialized SchedPolicy has no slice sizes: only defaults() is usable.
  expect_refused(SchedPolicy{}, "slice_bytes[nvlink]");
}

// ---- Names -------------------------------------------------------------------

TEST(QosClassNames, RoundTrip) {
  const std::array<std::pair<QosClass, std::string_view>, kQosClassCount> names{{
      {QosClass::kDecodeCritical, "decode_critical"},
      {QosClass::kHotKv, "hot_kv"},
      {QosClass::kPrefillBulk, "prefill_bulk"},
      {QosClass::kBackground, "background"},
  }};
  for (const auto& [qos, name] : names) {
    EXPECT_EQ(to_string(qos), name);
    EXPECT_EQ(parse_qos_class(name).value(), qos);
  }
}

TEST(QosClassNames, BadNamesAreQuoted) {
  for (std::string_view bad : {"", "Decode_Critical", "decode-critical", "urgent", " hot_kv"}) {
    const auto qos = parse_qos_class(bad);
    ASSERT_FALSE(qos.has_value()) << bad;
    EXPECT_EQ(qos.error().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(qos.error().message(),
              fmt::format("parse_qos_class: unknown class \"{}\" (expected decode_critical, hot_kv, "
                          "prefill_bulk or background)",
                          bad));
  }
}

TEST(PolicyKindNames, RoundTrip) {
  EXPECT_EQ(to_string(PolicyKind::kDeadlineAware), "deadline_aware");
  EXPECT_EQ(to_string(PolicyKind::kBaselineFifo), "baseline_fifo");
  EXPECT_EQ(to_string(PolicyKind::kStrictPriority), "strict_priority");
  EXPECT_EQ(to_string(PolicyKind::kEdf), "edf");
  for (PolicyKind kind :
       {PolicyKind::kDeadlineAware, PolicyKind::kBaselineFifo, PolicyKind::kStrictPriority, PolicyKind::kEdf}) {
    EXPECT_EQ(parse_policy_kind(to_string(kind)).value(), kind);
  }
}

TEST(PolicyKindNames, BadNamesAreQuoted) {
  for (std::string_view bad : {"", "fifo", "Deadline_Aware", "deadline_aware "}) {
    const auto kind = parse_policy_kind(bad);
    ASSERT_FALSE(kind.has_value()) << bad;
    EXPECT_EQ(kind.error().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(kind.error().message(),
              fmt::format("parse_policy_kind: unknown policy \"{}\" (expected deadline_aware, "
                          "baseline_fifo, strict_priority or edf)",
                          bad));
  }
}

TEST(SchedPolicyParse, CostModelOverridesMeasuredPaths) {
  const auto p = parse_policy(R"(cost_model:
  host_staging:
    local: {bandwidth_gbps: 53.5, latency_us: 8}
    remote: {bandwidth_gbps: 40}
  nvlink:
    local: {bandwidth_gbps: 24.5, latency_us: 2}
)");
  ASSERT_TRUE(p.has_value()) << p.error().message();
  using topology::Proximity;
  ASSERT_EQ(p->cost_model.size(), 3u);
  EXPECT_EQ(p->cost_model[0], (SchedPolicy::CostOverride{PathType::kHostStaging, Proximity::kLocal, 53.5, 8}));
  EXPECT_EQ(p->cost_model[1], (SchedPolicy::CostOverride{PathType::kHostStaging, Proximity::kRemote, 40, 0}));
  EXPECT_EQ(p->cost_model[2], (SchedPolicy::CostOverride{PathType::kNvlink, Proximity::kLocal, 24.5, 2}));
}

TEST(SchedPolicyParse, CostModelRefusesWhatItCannotUse) {
  for (const char* bad : {"cost_model: {warp: {local: {bandwidth_gbps: 1}}}",
                          "cost_model: {nvlink: {nearby: {bandwidth_gbps: 1}}}",
                          "cost_model: {nvlink: {local: {latency_us: 3}}}",
                          "cost_model: {nvlink: {local: {bandwidth_gbps: -2}}}",
                          "cost_model: {nvlink: {local: {bandwidth_gbps: 1e-300}}}",
                          "cost_model: {nvlink: {local: {bandwidth_gbps: 1e12}}}",
                          // Its nanoseconds overflowed the scheduler's clock.
                          "cost_model: {nvlink: {local: {bandwidth_gbps: 1, latency_us: 1e16}}}",
                          "cost_model: {nvlink: {local: {bandwidth_gbps: 1, speed: 2}}}",
                          "cost_model: {nvlink: {local: 5}}"}) {
    const auto p = parse_policy(bad);
    ASSERT_FALSE(p.has_value()) << bad;
    EXPECT_EQ(p.error().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(p.error().message().find("cost_model"), std::string::npos) << p.error().message();
  }
  // A path at a proximity no topology prices it at could never take effect.
  for (const auto& [bad, said] : {std::pair{"cost_model: {pcie_p2p: {SYS: {bandwidth_gbps: 50}}}",
                                            "pcie_p2p is never priced at SYS (a topology has it at PIX, PXB, PHB)"},
                                  std::pair{"cost_model: {nvswitch: {PIX: {bandwidth_gbps: 5}}}",
                                            "nvswitch is never priced at PIX (a topology has it at local)"},
                                  std::pair{"cost_model: {tcp: {PIX: {bandwidth_gbps: 5}}}",
                                            "tcp is never priced at PIX (a topology has it at local, remote)"}}) {
    const auto q = parse_policy(bad);
    ASSERT_FALSE(q.has_value()) << bad;
    EXPECT_NE(q.error().message().find(said), std::string::npos) << q.error().message();
  }
  // GDR past PXB is off by default (as NCCL has it) and on once priced.
  for (const char* x : {"PHB", "NODE", "SYS"}) {
    EXPECT_TRUE(parse_policy(fmt::format("cost_model: {{gdr: {{{}: {{bandwidth_gbps: 5}}}}}}", x)).has_value()) << x;
  }
  SchedPolicy programmatic = SchedPolicy::defaults();
  programmatic.cost_model.push_back({PathType::kPcieP2p, topology::Proximity::kSys, 50, 1});
  EXPECT_NE(programmatic.validate().message().find("prices pcie_p2p at SYS, which no topology has"), std::string::npos)
      << programmatic.validate().message();
  // No `default` there, unlike slice_size and credits: the message does not
  // offer it (it said "unknown path \"default\" (expected default, …)").
  const auto p = parse_policy("cost_model: {default: {local: {bandwidth_gbps: 1}}}");
  ASSERT_FALSE(p.has_value());
  EXPECT_NE(p.error().message().find("cost_model has no default"), std::string::npos) << p.error().message();
  EXPECT_EQ(p.error().message().find("expected default"), std::string::npos) << p.error().message();
}

}  // namespace
}  // namespace baton::sched
