// The engine's metrics registry: counters and histograms with labels, and
// their Prometheus text exposition (format 0.0.4). On by default. Updates
// and exposition take one uncontended mutex, so a scrape from another thread
// (the HTTP endpoint) is safe while the loop counts.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "baton/common/status.h"

namespace baton::engine {

using Labels = std::map<std::string, std::string>;

class MetricsRegistry {
 public:
  // Declares a counter / histogram family once (help text, bucket upper
  // bounds sorted ascending; +Inf is implicit). already_exists on a second
  // declaration with a different type or buckets, or for a name whose series
  // another family writes (a counter "x_count" beside a histogram "x");
  // invalid_argument for a name that is not a Prometheus metric name or
  // unsorted buckets. A label name starting with "__" (Prometheus's own)
  // drops the update, as an unknown family does.
  Status declare_counter(std::string_view name, std::string_view help);
  // A value that goes up and down (pages in use, tickets by state).
  Status declare_gauge(std::string_view name, std::string_view help);
  Status declare_histogram(std::string_view name, std::string_view help, std::vector<double> buckets);

  // Adds to a counter / observes a value; the series is created on first use.
  // Unknown family → the update is ignored and counted in
  // baton_metrics_dropped_total (a metric bug must not break a transfer).
  void add(std::string_view name, const Labels& labels = {}, std::uint64_t delta = 1);
  void observe(std::string_view name, const Labels& labels, double value);
  // Sets a gauge's series.
  void set(std::string_view name, const Labels& labels, std::uint64_t value);

  // Current value (a counter's or a gauge's), for tests and tools; 0 for an
  // unknown series.
  [[nodiscard]] std::uint64_t counter(std::string_view name, const Labels& labels = {}) const;
  [[nodiscard]] std::uint64_t histogram_count(std::string_view name, const Labels& labels = {}) const;

  // Prometheus text: # HELP, # TYPE, one line per series (histograms as
  // _bucket{le=…}, _sum, _count), label values escaped.
  [[nodiscard]] std::string text() const;

 private:
  struct Family;
  Status declare_scalar(std::string_view name, std::string_view help, bool gauge);
  // The declared family whose series a new family `name` would also write
  // (a histogram's _bucket, _sum, _count), if any. Under mutex_.
  [[nodiscard]] std::optional<std::string> clash_locked(std::string_view name, bool histogram) const;
  std::uint64_t* scalar(std::string_view name, const Labels& labels, bool gauge);
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Family>, std::less<>> families_;
  std::uint64_t dropped_ = 0;
};

}  // namespace baton::engine
