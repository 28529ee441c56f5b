#include "baton/engine/metrics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join moved here in fmt 11

namespace baton::engine {
namespace {

constexpr std::string_view kDroppedName = "baton_metrics_dropped_total";
constexpr std::string_view kDroppedHelp =
    "Metric updates ignored: undeclared family, wrong type or bad labels.";

enum class FamilyType : std::uint8_t { kCounter, kGauge, kHistogram };

std::string_view type_name(FamilyType type) {
  switch (type) {
    case FamilyType::kCounter: return "counter";
    case FamilyType::kGauge: return "gauge";
    case FamilyType::kHistogram: break;
  }
  return "histogram";
}

// A letter or the underscore: what may start a label name.
bool is_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool is_metric_name(std::string_view name) {
  if (name.empty() || !(is_letter(name[0]) || name[0] == ':')) return false;
  return std::ranges::all_of(
      name, [](char c) { return is_letter(c) || is_digit(c) || c == ':'; });
}

// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (Prometheus's own, such
// as __name__: a scrape with one is refused whole).
bool is_label_name(std::string_view name) {
  if (name.empty() || !is_letter(name[0]) || name.starts_with("__")) return false;
  return std::ranges::all_of(name, [](char c) { return is_letter(c) || is_digit(c); });
}

// Prometheus writes floats as Go does: +Inf, -Inf, NaN; otherwise any form
// strconv.ParseFloat reads. fmt's shortest round-trip form is one.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// HELP text escapes backslash and newline; label values also the double quote.
void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '"':
        out += quote ? "\\\"" : "\"";
        break;
      default: out += c;
    }
  }
}

// {a="x",b="y"} plus an optional le; nothing at all for no labels.
void append_labels(std::string& out, const Labels& labels,
                   std::string_view le = {}) {
  if (labels.empty() && le.empty()) return;
  out += '{';
  bool first = true;
  for (const auto& [key, value] : labels) {
    if (!first) out += ',';
    first = false;
    out += key;
    out += "=\"";
    append_escaped(out, value, /*quote=*/true);
    out += '"';
  }
  if (!le.empty()) {
    if (!first) out += ',';
    out += "le=\"";
    out += le;
    out += '"';
  }
  out += '}';
}

void append_header(std::string& out, std::string_view name, std::string_view help,
                   FamilyType type) {
  out += "# HELP ";
  out += name;
  if (!help.empty()) {
    out += ' ';
    append_escaped(out, help, /*quote=*/false);
  }
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type_name(type);
  out += '\n';
}

}  // namespace

struct MetricsRegistry::Family {
  struct Histogram {
    std::vector<std::uint64_t> counts;  // per bucket, not cumulative; last is +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };

  FamilyType type;
  std::string help;
  std::vector<double> buckets;  // histograms only; +Inf implicit
  std::map<Labels, std::uint64_t> counters;  // counters' and gauges' values
  std::map<Labels, Histogram> histograms;
};

namespace {

// Labels of a new series: valid names, and no "le" on a histogram (it is the
// bucket's own label).
bool labels_ok(const Labels& labels, FamilyType type) {
  return std::ranges::all_of(labels, [type](const auto& kv) {
    return is_label_name(kv.first) &&
           !(type == FamilyType::kHistogram && kv.first == "le");
  });
}

// The series a histogram writes besides its name.
constexpr std::array<std::string_view, 3> kHistogramSuffixes{"_bucket", "_sum", "_count"};

}  // namespace

std::optional<std::string> MetricsRegistry::clash_locked(std::string_view name, bool histogram) const {
  // Two families writing one series name make Prometheus refuse the whole
  // scrape: a counter "x_count" beside a histogram "x".
  for (std::string_view suffix : kHistogramSuffixes) {
    if (name.ends_with(suffix)) {
      const auto it = families_.find(name.substr(0, name.size() - suffix.size()));
      if (it != families_.end() && it->second->type == FamilyType::kHistogram) return it->first;
    }
    if (histogram) {
      const auto it = families_.find(fmt::format("{}{}", name, suffix));
      if (it != families_.end()) return it->first;
    }
  }
  return std::nullopt;
}

Status MetricsRegistry::declare_counter(std::string_view name, std::string_view help) {
  return declare_scalar(name, help, /*gauge=*/false);
}

Status MetricsRegistry::declare_gauge(std::string_view name, std::string_view help) {
  return declare_scalar(name, help, /*gauge=*/true);
}

Status MetricsRegistry::declare_scalar(std::string_view name, std::string_view help, bool gauge) {
  const FamilyType type = gauge ? FamilyType::kGauge : FamilyType::kCounter;
  const std::string_view call = gauge ? "declare_gauge" : "declare_counter";
  if (!is_metric_name(name)) {
    return Status::invalid_argument("{}: \"{}\" is not a metric name (expected [a-zA-Z_:][a-zA-Z0-9_:]*)", call,
                                    name);
  }
  if (name == kDroppedName) {
    return Status::already_exists("{}: \"{}\" is built in", call, name);
  }
  std::lock_guard lock(mutex_);
  if (auto it = families_.find(name); it != families_.end()) {
    if (it->second->type != type) {
      return Status::already_exists("{}: \"{}\" is already declared as a {}", call, name,
                                    type_name(it->second->type));
    }
    return Status::ok();  // the same declaration again: the first help stays
  }
  if (auto other = clash_locked(name, /*histogram=*/false)) {
    return Status::already_exists("{}: \"{}\" and \"{}\" would write the same series", call, name, *other);
  }
  auto family = std::make_shared<Family>();
  family->type = type;
  family->help = std::string(help);
  families_.emplace(std::string(name), std::move(family));
  return Status::ok();
}

Status MetricsRegistry::declare_histogram(std::string_view name, std::string_view help,
                                          std::vector<double> buckets) {
  if (!is_metric_name(name)) {
    return Status::invalid_argument(
        "declare_histogram: \"{}\" is not a metric name (expected [a-zA-Z_:][a-zA-Z0-9_:]*)",
        name);
  }
  if (name == kDroppedName) {
    return Status::already_exists("declare_histogram: \"{}\" is built in", name);
  }
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i])) {
      return Status::invalid_argument(
          "declare_histogram: \"{}\": bucket {} is {} (expected a finite bound; +Inf is "
          "implicit)",
          name, i, buckets[i]);
    }
    if (i > 0 && !(buckets[i - 1] < buckets[i])) {
      return Status::invalid_argument(
          "declare_histogram: \"{}\": bucket {} ({}) is not above bucket {} ({}); bounds "
          "must be strictly ascending",
          name, i, buckets[i], i - 1, buckets[i - 1]);
    }
  }
  std::lock_guard lock(mutex_);
  if (auto it = families_.find(name); it != families_.end()) {
    const Family& f = *it->second;
    if (f.type != FamilyType::kHistogram) {
      return Status::already_exists(
          "declare_histogram: \"{}\" is already declared as a {}", name,
          type_name(f.type));
    }
    if (f.buckets != buckets) {
      return Status::already_exists(
          "declare_histogram: \"{}\" is already declared with buckets [{}], not [{}]",
          name, fmt::join(f.buckets, ", "), fmt::join(buckets, ", "));
    }
    return Status::ok();
  }
  if (auto other = clash_locked(name, /*histogram=*/true)) {
    return Status::already_exists("declare_histogram: \"{}\" and \"{}\" would write the same series", name, *other);
  }
  auto family = std::make_shared<Family>();
  family->type = FamilyType::kHistogram;
  family->help = std::string(help);
  family->buckets = std::move(buckets);
  families_.emplace(std::string(name), std::move(family));
  return Status::ok();
}

void MetricsRegistry::add(std::string_view name, const Labels& labels,
                          std::uint64_t delta) {
  std::lock_guard lock(mutex_);
  if (auto* value = scalar(name, labels, /*gauge=*/false)) *value += delta;
}

void MetricsRegistry::set(std::string_view name, const Labels& labels, std::uint64_t value) {
  std::lock_guard lock(mutex_);
  if (auto* series = scalar(name, labels, /*gauge=*/true)) *series = value;
}

// The value of a counter's or gauge's series (created on first use); null,
// counted as dropped, for an undeclared family, another type or bad labels.
// Holds mutex_.
std::uint64_t* MetricsRegistry::scalar(std::string_view name, const Labels& labels, bool gauge) {
  auto it = families_.find(name);
  if (it == families_.end() || it->second->type != (gauge ? FamilyType::kGauge : FamilyType::kCounter)) {
    ++dropped_;
    return nullptr;
  }
  auto& series = it->second->counters;
  auto s = series.find(labels);
  if (s == series.end()) {
    if (!labels_ok(labels, FamilyType::kCounter)) {
      ++dropped_;
      return nullptr;
    }
    s = series.emplace(labels, 0).first;
  }
  return &s->second;
}

void MetricsRegistry::observe(std::string_view name, const Labels& labels, double value) {
  std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second->type != FamilyType::kHistogram ||
      std::isnan(value)) {
    ++dropped_;
    return;
  }
  Family& family = *it->second;
  auto s = family.histograms.find(labels);
  if (s == family.histograms.end()) {
    if (!labels_ok(labels, FamilyType::kHistogram)) {
      ++dropped_;
      return;
    }
    Family::Histogram h;
    h.counts.assign(family.buckets.size() + 1, 0);
    s = family.histograms.emplace(labels, std::move(h)).first;
  }
  // Bucket le counts values <= le: the first bound not below the value.
  const auto bucket = static_cast<std::size_t>(std::distance(
      family.buckets.begin(), std::ranges::lower_bound(family.buckets, value)));
  ++s->second.counts[bucket];
  s->second.sum += value;
  ++s->second.count;
}

std::uint64_t MetricsRegistry::counter(std::string_view name, const Labels& labels) const {
  std::lock_guard lock(mutex_);
  if (name == kDroppedName && labels.empty()) return dropped_;
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second->counters.find(labels);
  return s == it->second->counters.end() ? 0 : s->second;
}

std::uint64_t MetricsRegistry::histogram_count(std::string_view name,
                                               const Labels& labels) const {
  std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second->histograms.find(labels);
  return s == it->second->histograms.end() ? 0 : s->second.count;
}

std::string MetricsRegistry::text() const {
  std::lock_guard lock(mutex_);
  std::string out;
  bool dropped_written = false;
  auto write_dropped = [&] {
    append_header(out, kDroppedName, kDroppedHelp, FamilyType::kCounter);
    out += fmt::format("{} {}\n", kDroppedName, dropped_);
    dropped_written = true;
  };

  for (const auto& [name, family] : families_) {
    if (!dropped_written && kDroppedName < name) write_dropped();
    append_header(out, name, family->help, family->type);
    if (family->type != FamilyType::kHistogram) {
      for (const auto& [labels, value] : family->counters) {
        out += name;
        append_labels(out, labels);
        out += fmt::format(" {}\n", value);
      }
      continue;
    }
    for (const auto& [labels, h] : family->histograms) {
      std::uint64_t cumulative = 0;
      for (std::size_t i = 0; i < h.counts.size(); ++i) {
        cumulative += h.counts[i];
        const std::string le = i < family->buckets.size()
                                   ? format_value(family->buckets[i])
                                   : std::string("+Inf");
        out += name;
        out += "_bucket";
        append_labels(out, labels, le);
        out += fmt::format(" {}\n", cumulative);
      }
      out += name;
      out += "_sum";
      append_labels(out, labels);
      out += ' ';
      out += format_value(h.sum);
      out += '\n';
      out += name;
      out += "_count";
      append_labels(out, labels);
      out += fmt::format(" {}\n", h.count);
    }
  }
  if (!dropped_written) write_dropped();
  return out;
}

}  // namespace baton::engine
