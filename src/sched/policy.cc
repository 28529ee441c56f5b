#include "baton/sched/policy.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "baton/common/file_path.h"
#include "baton/common/units.h"
#include "baton/common/utf8.h"

namespace baton::sched {
namespace {

using topology::kPathTypeCount;
using topology::PathType;

constexpr std::array<std::string_view, kQosClassCount> kQosNames{
    "decode_critical", "hot_kv", "prefill_bulk", "background"};
constexpr std::array<std::string_view, 4> kPolicyNames{"deadline_aware", "baseline_fifo", "strict_priority", "edf"};

// "a, b or c": the tail of an "(expected …)" clause.
std::string either(std::span<const std::string_view> names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

std::string comma_list(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

template <typename Enum, std::size_t N>
std::optional<Enum> find_name(const std::array<std::string_view, N>& names,
                              std::string_view name) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<Enum>(i);
  }
  return std::nullopt;
}

// "a, b or c": the path types, with `default` first where a section takes one.
std::string path_names(bool with_default) {
  std::vector<std::string_view> names;
  if (with_default) names.push_back("default");
  for (int i = 0; i < kPathTypeCount; ++i) names.push_back(to_string(static_cast<PathType>(i)));
  return either(names);
}
std::string path_names_or_default() { return path_names(true); }

// The policy file, read into a SchedPolicy. Each error names the origin, the
// 1-based line, the dotted key and the offending text.
class PolicyReader {
 public:
  explicit PolicyReader(std::string_view origin) : origin_(origin) {}

  Status read(const YAML::Node& root, SchedPolicy& policy);

 private:
  struct Entry {
    std::string key;
    YAML::Node key_node;
    YAML::Node value;
  };
  // Where a value that other values are checked against came from, so that
  // a cross-field error can point at the line to change. line 0: built in.
  struct Source {
    std::string key;
    std::string text;
    int line = 0;
  };
  struct CreditsEntry {
    std::optional<int> lanes;
    std::optional<int> slices_per_lane;
    std::optional<std::uint64_t> inflight_bytes;
    Source inflight_source;
  };

  static int line_of(const YAML::Node& node) {
    const YAML::Mark mark = node.Mark();
    return mark.is_null() ? 0 : mark.line + 1;
  }
  // A null value's mark is where the parser noticed it (often the next line),
  // so errors about a value report the key's line.
  static int line_of(const Entry& entry) { return line_of(entry.key_node); }

  static std::string describe(const YAML::Node& node) {
    switch (node.Type()) {
      // Shortened: a file read by mistake (--policy-file /etc/passwd) is one
      // scalar, not echoed whole.
      case YAML::NodeType::Scalar: return fmt::format("\"{}\"", shown(node.Scalar()));
      case YAML::NodeType::Sequence: return "a sequence";
      case YAML::NodeType::Map: return "a mapping";
      default: return "nothing";
    }
  }

  Status bad_value(int line, std::string_view key, std::string_view what) const {
    return Status::invalid_argument("{}:{}: {}: {}", origin_, line, key, what);
  }

  static std::string join(std::string_view prefix, std::string_view key) {
    return prefix.empty() ? std::string(key) : fmt::format("{}.{}", prefix, key);
  }

  // The pairs of `map` (key `name`, whose own key is on `line`). A null value
  // is an empty mapping, so a section whose entries are all commented out
  // reads as absent. `allowed` empty: the caller checks the keys.
  Result<std::vector<Entry>> entries(const YAML::Node& map, std::string_view name, int line,
                                     std::span<const std::string_view> allowed) const;

  Result<std::string> scalar(const Entry& e, std::string_view key) const;
  Result<double> non_negative_number(const Entry& e, std::string_view key) const;
  Result<int> at_least_one(const Entry& e, std::string_view key) const;
  Result<std::uint64_t> size(const Entry& e, std::string_view key) const;

  Status read_weights(const Entry& section, SchedPolicy& policy) const;
  Status read_class_priority(const Entry& section, SchedPolicy& policy) const;
  Status read_slice_size(const Entry& section, SchedPolicy& policy);
  Status read_credits(const Entry& section, SchedPolicy& policy);
  Status read_preemption(const Entry& section, SchedPolicy& policy) const;
  Status read_admission(const Entry& section, SchedPolicy& policy) const;
  Status read_cost_model(const Entry& section, SchedPolicy& policy) const;
  Result<TimeNs> duration(const Entry& e, std::string_view key) const;
  Result<TimeNs> positive_duration(const Entry& e, std::string_view key) const;
  Status check_inflight_holds_a_slice(const SchedPolicy& policy) const;

  std::string_view origin_;
  std::array<Source, kPathTypeCount> slice_source_{};
  std::array<Source, kPathTypeCount> inflight_source_{};
};

Result<std::vector<PolicyReader::Entry>> PolicyReader::entries(
    const YAML::Node& map, std::string_view name, int line,
    std::span<const std::string_view> allowed) const {
  std::vector<Entry> out;
  if (map.IsNull()) return out;
  if (!map.IsMap()) {
    return std::unexpected(
        bad_value(line, name, fmt::format("expected a mapping, got {}", describe(map))));
  }
  // yaml-cpp's iterators hand out a temporary pair; hold Nodes (handles), not
  // references into it. Keys seen so far, for duplicates: a set, since a
  // scan of the earlier keys made a long mapping quadratic.
  std::map<std::string, std::size_t, std::less<>> seen_at;
  for (const auto& pair : map) {
    const YAML::Node key = pair.first;
    if (!key.IsScalar()) {
      return std::unexpected(bad_value(line_of(key), name.empty() ? "(top level)" : name,
                                       fmt::format("a key must be a name, got {}", describe(key))));
    }
    Entry entry{key.Scalar(), key, pair.second};
    if (!allowed.empty() &&
        std::find(allowed.begin(), allowed.end(), entry.key) == allowed.end()) {
      return std::unexpected(Status::invalid_argument(
          "{}:{}: unknown key \"{}\" (expected one of: {})", origin_, line_of(key),
          join(name, entry.key), comma_list(allowed)));
    }
    // yaml-cpp keeps both pairs of a repeated key; reading either silently
    // would hide an edit that did not take effect.
    if (const auto [at, fresh] = seen_at.emplace(entry.key, out.size()); !fresh) {
      return std::unexpected(Status::invalid_argument("{}:{}: duplicate key \"{}\" (first on line {})", origin_,
                                                      line_of(key), join(name, entry.key), line_of(out[at->second])));
    }
    out.push_back(std::move(entry));
  }
  return out;
}

Result<std::string> PolicyReader::scalar(const Entry& e, std::string_view key) const {
  if (!e.value.IsScalar()) {
    return std::unexpected(
        bad_value(line_of(e), key, fmt::format("expected a value, got {}", describe(e.value))));
  }
  return e.value.Scalar();
}

Result<double> PolicyReader::non_negative_number(const Entry& e, std::string_view key) const {
  auto text = scalar(e, key);
  if (!text) return std::unexpected(text.error());
  std::string_view digits = *text;
  if (digits.starts_with('+')) digits.remove_prefix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec == std::errc::result_out_of_range && end == digits.data() + digits.size()) {
    return std::unexpected(bad_value(line_of(e), key, fmt::format("\"{}\" is out of range", *text)));  // 1e400
  }
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
    return std::unexpected(bad_value(line_of(e), key, fmt::format("\"{}\" is not a number", *text)));
  }
  if (!std::isfinite(value)) {
    return std::unexpected(bad_value(line_of(e), key, fmt::format("\"{}\" is not finite", *text)));
  }
  if (value < 0) {
    return std::unexpected(
        bad_value(line_of(e), key, fmt::format("\"{}\" is negative (expected >= 0)", *text)));
  }
  return value;
}

Result<int> PolicyReader::at_least_one(const Entry& e, std::string_view key) const {
  auto text = scalar(e, key);
  if (!text) return std::unexpected(text.error());
  int value = 0;
  const char* first = text->data();
  const char* last = first + text->size();
  const auto [end, ec] = std::from_chars(first, last, value);
  if (ec == std::errc::result_out_of_range && end == last) {
    return std::unexpected(bad_value(line_of(e), key, fmt::format("\"{}\" is out of range", *text)));
  }
  if (ec != std::errc() || end != last || text->empty()) {
    return std::unexpected(
        bad_value(line_of(e), key, fmt::format("\"{}\" is not a whole number", *text)));
  }
  if (value < 1) {
    return std::unexpected(
        bad_value(line_of(e), key, fmt::format("\"{}\" is less than 1", *text)));
  }
  return value;
}

Result<std::uint64_t> PolicyReader::size(const Entry& e, std::string_view key) const {
  auto text = scalar(e, key);
  if (!text) return std::unexpected(text.error());
  auto bytes = parse_size(*text);
  if (!bytes) {
    // parse_size already quotes the text; drop its own call name.
    std::string_view why = bytes.error().message();
    if (why.starts_with("parse_size: ")) why.remove_prefix(std::string_view("parse_size: ").size());
    return std::unexpected(bad_value(line_of(e), key, why));
  }
  return *bytes;
}

// cost_model: {<path>: {<proximity>: {bandwidth_gbps: X, latency_us: Y}}}
Status PolicyReader::read_cost_model(const Entry& section, SchedPolicy& policy) const {
  static constexpr std::array<std::string_view, 2> kKeys{"bandwidth_gbps", "latency_us"};
  auto paths = entries(section.value, "cost_model", line_of(section), {});
  if (!paths) return paths.error();
  for (const Entry& p : *paths) {
    auto path = topology::parse_path_type(p.key);
    if (!path) {
      return bad_value(line_of(p), "cost_model",
                       fmt::format("unknown path \"{}\" (expected {}; cost_model has no default)", p.key,
                                   path_names(false)));
    }
    const std::string path_key = join("cost_model", p.key);
    auto proximities = entries(p.value, path_key, line_of(p), {});
    if (!proximities) return proximities.error();
    for (const Entry& x : *proximities) {
      std::optional<topology::Proximity> proximity;
      for (int i = 0; i < topology::kProximityCount; ++i) {
        if (topology::to_string(static_cast<topology::Proximity>(i)) == x.key) {
          proximity = static_cast<topology::Proximity>(i);
        }
      }
      if (!proximity) {
        return bad_value(line_of(x), path_key,
                         fmt::format("unknown proximity \"{}\" (expected PIX, PXB, PHB, NODE, SYS, local or remote)",
                                     x.key));
      }
      if (!topology::CostModel::priced(*path, *proximity)) {
        std::string where;
        for (int i = 0; i < topology::kProximityCount; ++i) {
          const auto at = static_cast<topology::Proximity>(i);
          if (topology::CostModel::priced(*path, at)) where += (where.empty() ? "" : ", ") + std::string(to_string(at));
        }
        return bad_value(line_of(x), path_key,
                         fmt::format("{} is never priced at {} (a topology has it at {}): the entry could not take "
                                     "effect",
                                     p.key, x.key, where));
      }
      const std::string key = join(path_key, x.key);
      auto fields = entries(x.value, key, line_of(x), kKeys);
      if (!fields) return fields.error();
      SchedPolicy::CostOverride o{*path, *proximity, 0, 0};
      for (const Entry& f : *fields) {
        auto value = non_negative_number(f, join(key, f.key));
        if (!value) return value.error();
        (f.key == "bandwidth_gbps" ? o.bandwidth_gbps : o.latency_us) = *value;
      }
      if (!(o.bandwidth_gbps > 0)) {
        return bad_value(line_of(x), key, "bandwidth_gbps is missing or zero (expected GB/s > 0)");
      }
      using Override = SchedPolicy::CostOverride;
      if (o.bandwidth_gbps < Override::kMinBandwidthGbps || o.bandwidth_gbps > Override::kMaxBandwidthGbps) {
        return bad_value(line_of(x), key,
                         fmt::format("bandwidth_gbps {} is outside 0.001 .. 100000 GB/s", o.bandwidth_gbps));
      }
      if (o.latency_us > Override::kMaxLatencyUs) {
        return bad_value(line_of(x), key, fmt::format("latency_us {} is above 1000000 (one second)", o.latency_us));
      }
      policy.cost_model.push_back(o);
    }
  }
  return Status::ok();
}

Status PolicyReader::read_weights(const Entry& section, SchedPolicy& policy) const {
  static constexpr std::array<std::string_view, 3> kKeys{"deadline", "priority", "aging"};
  auto pairs = entries(section.value, "weights", line_of(section), kKeys);
  if (!pairs) return pairs.error();
  for (const Entry& e : *pairs) {
    const std::string key = join("weights", e.key);
    auto value = non_negative_number(e, key);
    if (!value) return value.error();
    if (*value > SchedPolicy::kMaxWeight) {
      return bad_value(line_of(e), key, fmt::format("\"{}\" is above {:g} (a factor)", e.value.Scalar(), SchedPolicy::kMaxWeight));
    }
    if (e.key == "deadline") policy.w_deadline = *value;
    if (e.key == "priority") policy.w_priority = *value;
    if (e.key == "aging") policy.w_aging = *value;
  }
  return Status::ok();
}

Status PolicyReader::read_class_priority(const Entry& section, SchedPolicy& policy) const {
  auto pairs = entries(section.value, "class_priority", line_of(section), {});
  if (!pairs) return pairs.error();
  for (const Entry& e : *pairs) {
    const auto qos = find_name<QosClass>(kQosNames, e.key);
    if (!qos) {
      return bad_value(line_of(e), "class_priority",
                       fmt::format("unknown class \"{}\" (expected {})", e.key, either(kQosNames)));
    }
    auto value = non_negative_number(e, join("class_priority", e.key));
    if (!value) return value.error();
    if (*value > SchedPolicy::kMaxClassPriority) {
      return bad_value(line_of(e), join("class_priority", e.key),
                       fmt::format("\"{}\" is above {:g} (µs of laxity)", e.value.Scalar(),
                                   SchedPolicy::kMaxClassPriority));
    }
    policy.class_priority[static_cast<int>(*qos)] = *value;
  }
  return Status::ok();
}

Status PolicyReader::read_slice_size(const Entry& section, SchedPolicy& policy) {
  auto pairs = entries(section.value, "slice_size", line_of(section), {});
  if (!pairs) return pairs.error();
  // `default` first wherever it stands, so that per-path entries win.
  for (const bool defaults_pass : {true, false}) {
    for (const Entry& e : *pairs) {
      if ((e.key == "default") != defaults_pass) continue;
      std::optional<PathType> path;
      if (!defaults_pass) {
        auto parsed = topology::parse_path_type(e.key);
        if (!parsed) {
          return bad_value(line_of(e), "slice_size",
                           fmt::format("unknown path \"{}\" (expected {})", e.key,
                                       path_names_or_default()));
        }
        path = *parsed;
      }
      const std::string key = join("slice_size", e.key);
      auto bytes = size(e, key);
      if (!bytes) return bytes.error();
      if (*bytes == 0) {
        return bad_value(line_of(e), key,
                         fmt::format("\"{}\" is zero (expected at least {} bytes)", e.value.Scalar(), SchedPolicy::kMinSliceBytes));
      }
      if (*bytes < SchedPolicy::kMinSliceBytes) {
        return bad_value(line_of(e), key,
                         fmt::format("\"{}\" is below the smallest slice, {} bytes (a smaller one costs more to "
                                     "schedule than to send)",
                                     e.value.Scalar(), SchedPolicy::kMinSliceBytes));
      }
      for (int i = 0; i < kPathTypeCount; ++i) {
        if (path && i != static_cast<int>(*path)) continue;
        policy.slice_bytes[i] = *bytes;
        slice_source_[i] = {key, e.value.Scalar(), line_of(e)};
      }
    }
  }
  return Status::ok();
}

Status PolicyReader::read_credits(const Entry& section, SchedPolicy& policy) {
  static constexpr std::array<std::string_view, 3> kKeys{"lanes", "slices_per_lane",
                                                         "inflight_bytes"};
  auto pairs = entries(section.value, "credits", line_of(section), {});
  if (!pairs) return pairs.error();

  std::optional<CreditsEntry> fallback;
  std::array<std::optional<CreditsEntry>, kPathTypeCount> per_path;
  for (const Entry& e : *pairs) {
    std::optional<PathType> path;
    if (e.key != "default") {
      auto parsed = topology::parse_path_type(e.key);
      if (!parsed) {
        return bad_value(line_of(e), "credits",
                         fmt::format("unknown path \"{}\" (expected {})", e.key,
                                     path_names_or_default()));
      }
      path = *parsed;
    }
    const std::string name = join("credits", e.key);
    auto fields = entries(e.value, name, line_of(e), kKeys);
    if (!fields) return fields.error();
    CreditsEntry entry;
    for (const Entry& f : *fields) {
      const std::string key = join(name, f.key);
      if (f.key == "inflight_bytes") {
        auto bytes = size(f, key);
        if (!bytes) return bytes.error();
        entry.inflight_bytes = *bytes;
        entry.inflight_source = {key, f.value.Scalar(), line_of(f)};
        continue;
      }
      auto count = at_least_one(f, key);
      if (!count) return count.error();
      // Said here with its line; validate() would say it without one.
      const int most = f.key == "lanes" ? PathCredits::kMaxLanes : PathCredits::kMaxSlicesPerLane;
      if (*count > most) {
        return bad_value(line_of(f), key, fmt::format("\"{}\" is above {}", f.value.Scalar(), most));
      }
      (f.key == "lanes" ? entry.lanes : entry.slices_per_lane) = *count;
    }
    (path ? per_path[static_cast<int>(*path)] : fallback) = std::move(entry);
  }

  // Key by key: built-in < the file's `default` entry < the path's own entry.
  auto apply = [&](const CreditsEntry& entry, int i) {
    PathCredits& credits = policy.credits[i];
    if (entry.lanes) credits.lanes = *entry.lanes;
    if (entry.slices_per_lane) credits.slices_per_lane = *entry.slices_per_lane;
    if (entry.inflight_bytes) {
      credits.inflight_bytes = *entry.inflight_bytes;
      inflight_source_[i] = entry.inflight_source;
    }
  };
  for (int i = 0; i < kPathTypeCount; ++i) {
    if (fallback) apply(*fallback, i);
    if (per_path[i]) apply(*per_path[i], i);
  }
  return Status::ok();
}

Status PolicyReader::read_preemption(const Entry& section, SchedPolicy& policy) const {
  static constexpr std::array<std::string_view, 2> kKeys{"enabled", "min_class"};
  auto pairs = entries(section.value, "preemption", line_of(section), kKeys);
  if (!pairs) return pairs.error();
  for (const Entry& e : *pairs) {
    const std::string key = join("preemption", e.key);
    auto text = scalar(e, key);
    if (!text) return text.error();
    if (e.key == "enabled") {
      // YAML 1.1 booleans: true/false, yes/no, on/off.
      if (!YAML::convert<bool>::decode(e.value, policy.preemption)) {
        return bad_value(line_of(e), key, fmt::format("\"{}\" is not true or false", *text));
      }
    } else {
      const auto qos = find_name<QosClass>(kQosNames, *text);
      if (!qos) {
        return bad_value(line_of(e), key,
                         fmt::format("unknown class \"{}\" (expected {})", *text, either(kQosNames)));
      }
      policy.preempt_min_class = *qos;
    }
  }
  return Status::ok();
}

Result<TimeNs> PolicyReader::duration(const Entry& e, std::string_view key) const {
  auto text = scalar(e, key);
  if (!text) return std::unexpected(text.error());
  auto ns = parse_duration(*text);
  if (!ns) {
    std::string_view why = ns.error().message();
    if (why.starts_with("parse_duration: ")) why.remove_prefix(std::string_view("parse_duration: ").size());
    return std::unexpected(bad_value(line_of(e), key, why));
  }
  return *ns;
}

Result<TimeNs> PolicyReader::positive_duration(const Entry& e, std::string_view key) const {
  auto ns = duration(e, key);
  // A bare 0 has no unit, but "no unit" would send the reader to 0ms,
  // which is refused next: say what is wrong with it first.
  const bool bare_zero = !ns && e.value.IsScalar() && parse_duration(e.value.Scalar() + "ns") == TimeNs{0};
  if ((ns && *ns == 0) || bare_zero) {
    return std::unexpected(
        bad_value(line_of(e), key, fmt::format("\"{}\" is zero (expected a positive duration)", e.value.Scalar())));
  }
  return ns;
}

Status PolicyReader::read_admission(const Entry& section, SchedPolicy& policy) const {
  static constexpr std::array<std::string_view, 9> kKeys{
      "theta_compress", "theta_local",       "order",           "drop_infeasible", "max_owners",
      "max_inflight_bytes", "reevaluate_slices", "reevaluate_interval", "estimator_alpha"};
  auto pairs = entries(section.value, "admission", line_of(section), kKeys);
  if (!pairs) return pairs.error();
  AdmissionPolicy& a = policy.admission;
  std::optional<int> theta_line;
  for (const Entry& e : *pairs) {
    const std::string key = join("admission", e.key);
    if (e.key == "theta_compress" || e.key == "theta_local" || e.key == "estimator_alpha") {
      auto value = non_negative_number(e, key);
      if (!value) return value.error();
      if (e.key == "theta_compress") a.theta_compress = *value;
      if (e.key == "theta_local") a.theta_local = *value;
      if (e.key == "estimator_alpha") {
        if (*value <= 0 || *value > 1) {
          return bad_value(line_of(e), key, fmt::format("{} is outside (0, 1]", *value));
        }
        a.estimator_alpha = *value;
      }
      if (e.key != "estimator_alpha") theta_line = line_of(e);
    } else if (e.key == "order") {
      auto text = scalar(e, key);
      if (!text) return text.error();
      if (*text == "fifo") {
        a.order = AdmissionOrder::kFifo;
      } else if (*text == "edf") {
        a.order = AdmissionOrder::kEdf;
      } else {
        return bad_value(line_of(e), key, fmt::format("unknown order \"{}\" (expected fifo or edf)", *text));
      }
    } else if (e.key == "drop_infeasible") {
      auto text = scalar(e, key);
      if (!text) return text.error();
      if (!YAML::convert<bool>::decode(e.value, a.drop_infeasible)) {
        return bad_value(line_of(e), key, fmt::format("\"{}\" is not true or false", *text));
      }
    } else if (e.key == "max_owners") {
      auto text = scalar(e, key);
      if (!text) return text.error();
      int value = -1;
      const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
      if (ec != std::errc() || end != text->data() + text->size() || value < 0) {
        return bad_value(line_of(e), key, fmt::format("\"{}\" is not a whole number >= 0 (0: no limit)", *text));
      }
      a.max_owners = value;
    } else if (e.key == "max_inflight_bytes") {
      auto bytes = size(e, key);
      if (!bytes) return bytes.error();
      a.max_inflight_bytes = *bytes;
    } else if (e.key == "reevaluate_slices") {
      auto n = at_least_one(e, key);
      if (!n) return n.error();
      a.reevaluate_slices = *n;
    } else if (e.key == "reevaluate_interval") {
      auto ns = positive_duration(e, key);
      if (!ns) return ns.error();
      a.reevaluate_interval_ns = *ns;
    }
  }
  if (theta_line && a.theta_compress > a.theta_local) {
    return bad_value(*theta_line, "admission",
                     fmt::format("theta_compress {} is above theta_local {}", a.theta_compress, a.theta_local));
  }
  return Status::ok();
}

// A path whose inflight budget is below one slice could never post anything.
// Point at whichever of the two values the file set.
Status PolicyReader::check_inflight_holds_a_slice(const SchedPolicy& policy) const {
  for (int i = 0; i < kPathTypeCount; ++i) {
    const std::uint64_t slice = policy.slice_bytes[i];
    const std::uint64_t inflight = policy.credits[i].inflight_bytes;
    if (inflight >= slice) continue;
    const std::string_view path = to_string(static_cast<PathType>(i));
    const Source& in = inflight_source_[i];
    if (in.line > 0) {
      return bad_value(in.line, in.key,
                       fmt::format("\"{}\" is smaller than the {} slice size ({})", in.text, path,
                                   format_size(slice)));
    }
    const Source& sl = slice_source_[i];
    if (sl.line > 0) {
      return bad_value(sl.line, sl.key,
                       fmt::format("\"{}\" is larger than the {} inflight_bytes ({}); raise "
                                   "credits.{}.inflight_bytes too",
                                   sl.text, path, format_size(inflight), path));
    }
  }
  return Status::ok();
}

Status PolicyReader::read(const YAML::Node& root, SchedPolicy& policy) {
  if (root.IsNull()) return Status::ok();  // empty document: all defaults
  if (!root.IsMap()) {
    return Status::invalid_argument("{}:{}: expected a mapping of policy keys, got {}", origin_,
                                    line_of(root), describe(root));
  }
  static constexpr std::array<std::string_view, 11> kKeys{
      "policy", "weights", "class_priority", "deadline_horizon", "starvation_bound", "transfer_timeout",
      "slice_size", "credits", "preemption", "admission", "cost_model"};
  auto sections = entries(root, "", line_of(root), kKeys);
  if (!sections) return sections.error();
  for (const Entry& e : *sections) {
    Status status;
    if (e.key == "policy") {
      auto text = scalar(e, "policy");
      if (!text) return text.error();
      const auto kind = find_name<PolicyKind>(kPolicyNames, *text);
      if (!kind) {
        return bad_value(line_of(e), "policy",
                         fmt::format("unknown policy \"{}\" (expected {})", *text,
                                     either(kPolicyNames)));
      }
      policy.kind = *kind;
    } else if (e.key == "weights") {
      status = read_weights(e, policy);
    } else if (e.key == "class_priority") {
      status = read_class_priority(e, policy);
    } else if (e.key == "deadline_horizon") {
      auto ns = duration(e, "deadline_horizon");
      if (!ns) return ns.error();
      policy.deadline_horizon_ns = *ns;
    } else if (e.key == "transfer_timeout") {
      auto ns = positive_duration(e, "transfer_timeout");
      if (!ns) return ns.error();
      policy.transfer_timeout_ns = *ns;
    } else if (e.key == "starvation_bound") {
      // Zero would make every queued request overdue: FIFO in disguise.
      auto ns = positive_duration(e, "starvation_bound");
      if (!ns) return ns.error();
      policy.starvation_bound_ns = *ns;
    } else if (e.key == "slice_size") {
      status = read_slice_size(e, policy);
    } else if (e.key == "credits") {
      status = read_credits(e, policy);
    } else if (e.key == "preemption") {
      status = read_preemption(e, policy);
    } else if (e.key == "admission") {
      status = read_admission(e, policy);
    } else if (e.key == "cost_model") {
      status = read_cost_model(e, policy);
    }
    if (!status.is_ok()) return status;
  }
  return check_inflight_holds_a_slice(policy);
}

// The line where a second YAML document's content starts, if the text has
// one: content after a "---" or "..." line that itself follows content.
std::optional<int> second_document_line(std::string_view text) {
  int line = 0;
  bool content = false;
  bool ended = false;  // a separator followed the first document's content
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    std::string_view l = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    ++line;
    while (!l.empty() && std::isspace(static_cast<unsigned char>(l.back())) != 0) l.remove_suffix(1);
    const bool marker = (l.starts_with("---") || l.starts_with("...")) &&
                        (l.size() == 3 || std::isspace(static_cast<unsigned char>(l[3])) != 0);
    if (marker) {
      if (content) ended = true;
      l.remove_prefix(3);
      while (!l.empty() && std::isspace(static_cast<unsigned char>(l.front())) != 0) l.remove_prefix(1);
    }
    if (l.empty() || l.starts_with('#') || (!marker && l.starts_with('%'))) continue;
    if (ended) return line;
    content = true;
  }
  return std::nullopt;
}

// A policy is a page of settings; far beyond, it is not one (and yaml-cpp
// takes memory a few hundred times a file's size).
constexpr std::size_t kMaxPolicyBytes = 1 << 20;

// The line where content follows the first YAML value, if it does:
// YAML::Load reads that value and drops the rest without a word, e.g. a
// block mapping after a flow one ("{policy: edf}\nweights: …"). The parser
// is asked for two documents at most (YAML::LoadAll loops forever on ",").
std::optional<int> content_after_first_value(std::string_view text) {
  struct Events final : YAML::EventHandler {
    std::optional<int> line;  // where a document started
    void OnDocumentStart(const YAML::Mark& mark) override {
      if (!line) line = mark.line + 1;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  };
  std::istringstream in{std::string(text)};
  YAML::Parser parser(in);
  Events first, second;
  if (!parser.HandleNextDocument(first)) return std::nullopt;
  if (!parser.HandleNextDocument(second)) return std::nullopt;
  return second.line;
}

// Where text stops being UTF-8 text without control characters, if it does.
struct NonText {
  int line = 1;
  std::string what;
};
std::optional<NonText> find_non_text(std::string_view text) {
  int line = 1;
  for (std::size_t i = 0; i < text.size();) {
    const auto u = static_cast<unsigned char>(text[i]);
    if (u == '\n') ++line;
    if (u < 0x80) {
      if ((u < 0x20 && u != '\n' && u != '\t' && u != '\r') || u == 0x7f) {
        return NonText{line, fmt::format("control character {:#04x}", u)};
      }
      ++i;
      continue;
    }
    const std::size_t n = utf8_sequence_length(text, i);
    if (n == 0) return NonText{line, fmt::format("byte {:#04x} is not UTF-8", u)};
    i += n;
  }
  return std::nullopt;
}

}  // namespace

std::string_view to_string(AdmissionOrder order) { return order == AdmissionOrder::kEdf ? "edf" : "fifo"; }

std::string_view to_string(QosClass qos) { return kQosNames[static_cast<int>(qos)]; }

Result<QosClass> parse_qos_class(std::string_view name) {
  if (auto qos = find_name<QosClass>(kQosNames, name)) return *qos;
  return std::unexpected(Status::invalid_argument(
      "parse_qos_class: unknown class \"{}\" (expected {})", name, either(kQosNames)));
}

std::string_view to_string(PolicyKind kind) { return kPolicyNames[static_cast<int>(kind)]; }

Result<PolicyKind> parse_policy_kind(std::string_view name) {
  if (auto kind = find_name<PolicyKind>(kPolicyNames, name)) return *kind;
  return std::unexpected(Status::invalid_argument(
      "parse_policy_kind: unknown policy \"{}\" (expected {})", name, either(kPolicyNames)));
}

SchedPolicy SchedPolicy::defaults() {
  SchedPolicy policy;
  for (int i = 0; i < kPathTypeCount; ++i) {
    // Fabric paths move ~25 GB/s per link at ~2 µs: bigger slices keep them
    // busy; PCIe and staging sit between; NIC and shm paths keep slices small
    // so a decode slice waits behind at most a few µs of bulk.
    std::uint64_t slice_kib = 64;
    PathCredits credits{.lanes = 2, .slices_per_lane = 2, .inflight_bytes = 4 << 20};
    switch (static_cast<PathType>(i)) {
      case PathType::kNvlink:
      case PathType::kNvswitch:
        slice_kib = 512;
        credits = {.lanes = 4, .slices_per_lane = 2, .inflight_bytes = 8 << 20};
        break;
      case PathType::kPcieP2p: slice_kib = 256; break;
      case PathType::kHostStaging:
        // A copy between a GPU and pinned host memory costs ~3 µs besides
        // its bytes, and a second stream does not overtake queued copies:
        // slice size buys throughput, bytes in flight cost a decode's wait.
        // On an H200 (PCIe Gen5, 55 GB/s) 1 MiB slices with 2 MiB in flight
        // carried 47 GB/s where 256 KiB slices carried 34; decode P99 stayed
        // within 50-70 µs either way (docs/results.md, "GPU copies").
        slice_kib = 1024;
        credits.inflight_bytes = 2 << 20;
        break;
      case PathType::kTcp:
        // Each slice is a round trip through the holder's CPU on a socket:
        // 64 KiB slices held loopback writes at 0.67 GB/s, 256 KiB at 0.84
        // (docs/results.md). What keeps the socket busy is bytes in flight,
        // not slices: 1 MiB, whatever the requests' size (at 2 slices per
        // lane, 64 KiB requests kept 256 KiB in flight and ran at 0.6 of
        // 1 MiB's rate). A decode waits behind at most that much bulk.
        slice_kib = 256;
        credits = {.lanes = 2, .slices_per_lane = 8, .inflight_bytes = 1 << 20};
        break;
      case PathType::kGdr:
      case PathType::kRdma: break;
      case PathType::kShm:
        // Swept against 128/256 KiB and 4/8 slots (docs/results.md): bigger
        // credits carried ~20% more through the loop but missed decode
        // deadlines this met, while a loop without copy threads copies a
        // dispatch's credits in one turn.
        break;
    }
    policy.slice_bytes[i] = slice_kib << 10;
    policy.credits[i] = credits;
  }
  return policy;
}

Status SchedPolicy::validate() const {
  if (static_cast<int>(kind) >= static_cast<int>(kPolicyNames.size())) {
    return Status::invalid_argument("SchedPolicy: kind {} is not a policy",
                                    static_cast<int>(kind));
  }
  const std::array<std::pair<std::string_view, double>, 3> weights{
      {{"w_deadline", w_deadline}, {"w_priority", w_priority}, {"w_aging", w_aging}}};
  for (const auto& [name, value] : weights) {
    if (!(value >= 0 && value <= kMaxWeight)) {  // NaN fails too
      return Status::invalid_argument("SchedPolicy: {} is {} (expected 0 .. {:g})", name, value, kMaxWeight);
    }
  }
  for (int q = 0; q < kQosClassCount; ++q) {
    const double value = class_priority[q];
    if (!(value >= 0 && value <= kMaxClassPriority)) {
      return Status::invalid_argument("SchedPolicy: class_priority[{}] is {} (expected 0 .. {:g})", kQosNames[q],
                                      value, kMaxClassPriority);
    }
  }
  const AdmissionPolicy& a = admission;
  if (a.order != AdmissionOrder::kFifo && a.order != AdmissionOrder::kEdf) {
    return Status::invalid_argument("SchedPolicy: admission order {} is not an order (expected fifo or edf)",
                                    static_cast<int>(a.order));
  }
  if (!(a.theta_compress >= 0) || !(a.theta_local >= a.theta_compress) || !std::isfinite(a.theta_local)) {
    return Status::invalid_argument(
        "SchedPolicy: admission thresholds {} (compress) and {} (local) must satisfy 0 <= compress <= local",
        a.theta_compress, a.theta_local);
  }
  if (a.max_owners < 0 || a.reevaluate_slices < 1 || a.reevaluate_interval_ns <= 0 ||
      !(a.estimator_alpha > 0 && a.estimator_alpha <= 1)) {
    return Status::invalid_argument(
        "SchedPolicy: admission max_owners {} (>= 0), reevaluate_slices {} (>= 1), reevaluate_interval {} ns (> 0), "
        "estimator_alpha {} (in (0, 1]) out of range",
        a.max_owners, a.reevaluate_slices, a.reevaluate_interval_ns, a.estimator_alpha);
  }
  if (starvation_bound_ns <= 0) {
    return Status::invalid_argument("SchedPolicy: starvation_bound_ns is {} (expected > 0)",
                                    starvation_bound_ns);
  }
  if (transfer_timeout_ns <= 0) {
    return Status::invalid_argument("SchedPolicy: transfer_timeout_ns is {} (expected > 0)", transfer_timeout_ns);
  }
  if (deadline_horizon_ns < 0) {
    return Status::invalid_argument("SchedPolicy: deadline_horizon_ns is {} (expected >= 0)",
                                    deadline_horizon_ns);
  }
  for (int i = 0; i < kPathTypeCount; ++i) {
    const std::string_view path = to_string(static_cast<PathType>(i));
    const PathCredits& c = credits[i];
    if (slice_bytes[i] < kMinSliceBytes) {
      return Status::invalid_argument("SchedPolicy: slice_bytes[{}] is {} (expected at least {})", path,
                                      slice_bytes[i], kMinSliceBytes);
    }
    // Bounded: lanes × slices per lane is the path's credit count, kept in
    // an int and allocated per lane (a billion of each ran out of memory).
    if (c.lanes < 1 || c.lanes > PathCredits::kMaxLanes || c.slices_per_lane < 1 ||
        c.slices_per_lane > PathCredits::kMaxSlicesPerLane) {
      return Status::invalid_argument(
          "SchedPolicy: credits[{}] has {} lanes and {} slices per lane (expected 1..{} lanes and 1..{} slices per "
          "lane)",
          path, c.lanes, c.slices_per_lane, PathCredits::kMaxLanes, PathCredits::kMaxSlicesPerLane);
    }
    if (c.inflight_bytes < slice_bytes[i]) {
      return Status::invalid_argument(
          "SchedPolicy: credits[{}].inflight_bytes {} is below one slice ({} bytes)", path,
          c.inflight_bytes, slice_bytes[i]);
    }
  }
  if (static_cast<int>(preempt_min_class) >= kQosClassCount) {
    return Status::invalid_argument("SchedPolicy: preempt_min_class {} is not a class",
                                    static_cast<int>(preempt_min_class));
  }
  // What CostModel::set refuses, said before an engine is built on it (a
  // path cast from an integer indexed past the model's table).
  for (std::size_t i = 0; i < cost_model.size(); ++i) {
    const CostOverride& o = cost_model[i];
    if (static_cast<int>(o.path) >= topology::kPathTypeCount ||
        static_cast<int>(o.proximity) >= topology::kProximityCount) {
      return Status::invalid_argument("SchedPolicy: cost_model[{}] has path {} at proximity {} (expected path < {}, "
                                      "proximity < {})",
                                      i, static_cast<int>(o.path), static_cast<int>(o.proximity),
                                      topology::kPathTypeCount, topology::kProximityCount);
    }
    if (!topology::CostModel::priced(o.path, o.proximity)) {
      return Status::invalid_argument("SchedPolicy: cost_model[{}] prices {} at {}, which no topology has",
                                      i, topology::to_string(o.path), topology::to_string(o.proximity));
    }
    // NaN fails both comparisons.
    if (!(o.bandwidth_gbps >= CostOverride::kMinBandwidthGbps && o.bandwidth_gbps <= CostOverride::kMaxBandwidthGbps) ||
        !(o.latency_us >= 0 && o.latency_us <= CostOverride::kMaxLatencyUs)) {
      return Status::invalid_argument(
          "SchedPolicy: cost_model[{}] ({} at {}) has bandwidth {} GB/s and latency {} us (expected 0.001 .. 100000 "
          "GB/s, 0 .. 1000000 us)",
          i, topology::to_string(o.path), topology::to_string(o.proximity), o.bandwidth_gbps, o.latency_us);
    }
  }
  return Status::ok();
}

Result<SchedPolicy> parse_policy(std::string_view yaml_text, std::string_view origin) {
  SchedPolicy policy = SchedPolicy::defaults();
  // yaml-cpp 0.7 loops forever on a NUL byte and on some invalid UTF-8
  // (found by fuzz/policy_fuzzer); a policy file is UTF-8 text without
  // control characters, so anything else is refused before it gets there.
  if (auto bad = find_non_text(yaml_text)) {
    return std::unexpected(Status::invalid_argument("{}:{}: {} (a policy file is UTF-8 text)", origin, bad->line,
                                                    bad->what));
  }
  // A second document would be ignored silently (e.g. two files
  // concatenated). Found in the text: YAML::LoadAll loops forever on input
  // as small as "," (yaml-cpp 0.7; fuzz/policy_fuzzer), YAML::Load does not.
  if (auto line = second_document_line(yaml_text)) {
    return std::unexpected(Status::invalid_argument(
        "{}:{}: a second YAML document (expected one policy per file)", origin, *line));
  }
  if (yaml_text.size() > kMaxPolicyBytes) {
    return std::unexpected(Status::invalid_argument("{}: more than {} bytes (a policy file is a page of settings)",
                                                    origin, kMaxPolicyBytes));
  }
  try {
    if (auto line = content_after_first_value(yaml_text)) {
      return std::unexpected(Status::invalid_argument(
          "{}:{}: more YAML after the first value (a policy file is one mapping)", origin, *line));
    }
    const YAML::Node document = YAML::Load(std::string(yaml_text));
    PolicyReader reader(origin);
    if (Status status = reader.read(document, policy); !status.is_ok()) return std::unexpected(std::move(status));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return std::unexpected(Status::invalid_argument("{}: invalid YAML: {}", origin, e.msg));
    }
    return std::unexpected(Status::invalid_argument("{}:{}: invalid YAML: {}", origin,
                                                    e.mark.line + 1, e.msg));
  } catch (const std::exception& e) {
    return std::unexpected(Status::internal("{}: reading the policy failed: {}", origin, e.what()));
  }
  if (Status status = policy.validate(); !status.is_ok()) {
    return std::unexpected(Status::invalid_argument("{}: {}", origin, status.message()));
  }
  return policy;
}

Result<SchedPolicy> load_policy(const std::string& path) {
  if (Status s = check_file_path("load_policy", path); !s.is_ok()) return std::unexpected(s);
  std::error_code ec;
  const std::filesystem::file_type type = std::filesystem::status(path, ec).type();
  if (type != std::filesystem::file_type::regular) {
    return std::unexpected(Status::not_found(
        "load_policy: \"{}\" is not a readable regular file ({})", path,
        type == std::filesystem::file_type::not_found ? "no such file"
        : type == std::filesystem::file_type::directory ? "a directory"
        : ec ? ec.message() : "not a regular file"));
  }
  // Read with stdio, bounded: a file that cannot be read (/proc/self/mem)
  // made the stream throw, and a huge one took memory many times its size.
  std::FILE* file = std::fopen(path.c_str(), "rbe");
  if (file == nullptr) {
    return std::unexpected(Status::not_found("load_policy: \"{}\" cannot be opened: {}", path, std::strerror(errno)));
  }
  std::string text(kMaxPolicyBytes + 1, '\0');
  const std::size_t got = std::fread(text.data(), 1, text.size(), file);
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  std::fclose(file);
  if (failed) {
    return std::unexpected(Status::not_found("load_policy: \"{}\" cannot be read: {}", path, std::strerror(error)));
  }
  text.resize(got);
  return parse_policy(text, path);
}

}  // namespace baton::sched
