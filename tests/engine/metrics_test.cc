#include "baton/engine/metrics.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include <fmt/ranges.h>
#include <gtest/gtest.h>

namespace baton::engine {
namespace {

constexpr std::string_view kDropped = "baton_metrics_dropped_total";

bool contains(const std::string& text, std::string_view line) {
  return text.find(line) != std::string::npos;
}

TEST(Metrics, EmptyRegistryExposesOnlyTheDroppedCounter) {
  MetricsRegistry reg;
  EXPECT_EQ(reg.text(),
            "# HELP baton_metrics_dropped_total Metric updates ignored: undeclared family, "
            "wrong type or bad labels.\n"
            "# TYPE baton_metrics_dropped_total counter\n"
            "baton_metrics_dropped_total 0\n");
}

TEST(Metrics, ExactTextOfASmallRegistry) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_counter("baton_slices_total", "Slices sent.").is_ok());
  ASSERT_TRUE(reg.declare_histogram("baton_slice_seconds", "Slice latency.", {0.25, 0.5, 1})
                  .is_ok());
  ASSERT_TRUE(reg.declare_counter("aaa_first_total", "").is_ok());
  reg.add("baton_slices_total", {{"path", "nvlink"}, {"class", "decode"}}, 3);
  reg.add("baton_slices_total", {{"path", "pcie"}, {"class", "prefill"}});
  reg.add("baton_slices_total", {{"class", "decode"}, {"path", "nvlink"}}, 2);
  reg.observe("baton_slice_seconds", {}, 0.125);
  reg.observe("baton_slice_seconds", {}, 0.5);  // on a bound: counts in le="0.5"
  reg.observe("baton_slice_seconds", {}, 2.0);
  reg.add("aaa_first_total");

  // Families sorted by name, the built-in one among them; series sorted by
  // labels; label names sorted within a series.
  EXPECT_EQ(reg.text(),
            "# HELP aaa_first_total\n"
            "# TYPE aaa_first_total counter\n"
            "aaa_first_total 1\n"
            "# HELP baton_metrics_dropped_total Metric updates ignored: undeclared family, "
            "wrong type or bad labels.\n"
            "# TYPE baton_metrics_dropped_total counter\n"
            "baton_metrics_dropped_total 0\n"
            "# HELP baton_slice_seconds Slice latency.\n"
            "# TYPE baton_slice_seconds histogram\n"
            "baton_slice_seconds_bucket{le=\"0.25\"} 1\n"
            "baton_slice_seconds_bucket{le=\"0.5\"} 2\n"
            "baton_slice_seconds_bucket{le=\"1\"} 2\n"
            "baton_slice_seconds_bucket{le=\"+Inf\"} 3\n"
            "baton_slice_seconds_sum 2.625\n"
            "baton_slice_seconds_count 3\n"
            "# HELP baton_slices_total Slices sent.\n"
            "# TYPE baton_slices_total counter\n"
            "baton_slices_total{class=\"decode\",path=\"nvlink\"} 5\n"
            "baton_slices_total{class=\"prefill\",path=\"pcie\"} 1\n");
}

TEST(Metrics, CountersWithAndWithoutLabels) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_counter("ops_total", "Ops.").is_ok());
  reg.add("ops_total");
  reg.add("ops_total", {}, 41);
  reg.add("ops_total", {{"peer", "a"}}, 7);
  reg.add("ops_total", {{"peer", "a"}}, 0);  // creates nothing new, adds nothing
  EXPECT_EQ(reg.counter("ops_total"), 42u);
  EXPECT_EQ(reg.counter("ops_total", {{"peer", "a"}}), 7u);
  EXPECT_EQ(reg.counter("ops_total", {{"peer", "b"}}), 0u);
  EXPECT_EQ(reg.counter("missing_total"), 0u);
  const std::string text = reg.text();
  EXPECT_TRUE(contains(text, "\nops_total 42\n")) << text;
  EXPECT_TRUE(contains(text, "\nops_total{peer=\"a\"} 7\n")) << text;
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_histogram("lat_seconds", "Latency.", {1, 2, 4}).is_ok());
  const Labels path{{"path", "rdma"}};
  for (double v : {0.5, 1.0, 1.5, 3.0, 3.5, 100.0, -1.0}) reg.observe("lat_seconds", path, v);
  reg.observe("lat_seconds", {}, 3.0);
  EXPECT_EQ(reg.histogram_count("lat_seconds", path), 7u);
  EXPECT_EQ(reg.histogram_count("lat_seconds"), 1u);
  EXPECT_EQ(reg.histogram_count("lat_seconds", {{"path", "tcp"}}), 0u);
  const std::string text = reg.text();
  EXPECT_TRUE(contains(text,
                       "lat_seconds_bucket{le=\"1\"} 0\n"
                       "lat_seconds_bucket{le=\"2\"} 0\n"
                       "lat_seconds_bucket{le=\"4\"} 1\n"
                       "lat_seconds_bucket{le=\"+Inf\"} 1\n"
                       "lat_seconds_sum 3\n"
                       "lat_seconds_count 1\n"))
      << text;
  EXPECT_TRUE(contains(text,
                       "lat_seconds_bucket{path=\"rdma\",le=\"1\"} 3\n"
                       "lat_seconds_bucket{path=\"rdma\",le=\"2\"} 4\n"
                       "lat_seconds_bucket{path=\"rdma\",le=\"4\"} 6\n"
                       "lat_seconds_bucket{path=\"rdma\",le=\"+Inf\"} 7\n"
                       "lat_seconds_sum{path=\"rdma\"} 108.5\n"
                       "lat_seconds_count{path=\"rdma\"} 7\n"))
      << text;
}

TEST(Metrics, HistogramWithNoBucketsHasOnlyInf) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_histogram("h", "H.", {}).is_ok());
  reg.observe("h", {}, 5);
  EXPECT_TRUE(contains(reg.text(), "h_bucket{le=\"+Inf\"} 1\nh_sum 5\nh_count 1\n"));
}

TEST(Metrics, EscapesLabelValuesAndHelp) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_counter("c_total", "A \\ help\nwith \"quotes\"").is_ok());
  reg.add("c_total", {{"v", "a\\b\"c\nd"}});
  const std::string text = reg.text();
  // HELP escapes backslash and newline only; label values also the quote.
  EXPECT_TRUE(contains(text, "# HELP c_total A \\\\ help\\nwith \"quotes\"\n")) << text;
  EXPECT_TRUE(contains(text, "c_total{v=\"a\\\\b\\\"c\\nd\"} 1\n")) << text;
  EXPECT_EQ(reg.counter("c_total", {{"v", "a\\b\"c\nd"}}), 1u);
}

TEST(Metrics, RejectsBadMetricNames) {
  MetricsRegistry reg;
  for (std::string_view name : {"", "1abc", "a-b", "a b", "a.b", "caf\xc3\xa9", "a{b}"}) {
    SCOPED_TRACE(name);
    const Status c = reg.declare_counter(name, "x");
    EXPECT_EQ(c.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(c.message(), fmt::format("\"{}\"", name))) << c.message();
    EXPECT_EQ(reg.declare_histogram(name, "x", {1}).code(), StatusCode::kInvalidArgument);
  }
  for (std::string_view name : {"a", "_a", ":a", "a:b_c9", "A_Z"}) {
    EXPECT_TRUE(reg.declare_counter(name, "x").is_ok()) << name;
  }
}

TEST(Metrics, RejectsBadBuckets) {
  MetricsRegistry reg;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const std::vector<double>& b : std::vector<std::vector<double>>{
           {1, 0.5}, {1, 1}, {nan}, {1, inf}, {-inf, 1}}) {
    EXPECT_EQ(reg.declare_histogram("h", "x", b).code(), StatusCode::kInvalidArgument)
        << fmt::format("{}", fmt::join(b, ","));
  }
  // None of the failures declared it.
  EXPECT_TRUE(reg.declare_histogram("h", "x", {0.5, 1}).is_ok());
}

TEST(Metrics, RedeclarationRules) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_counter("c_total", "first").is_ok());
  EXPECT_TRUE(reg.declare_counter("c_total", "second").is_ok());  // same type: fine
  EXPECT_EQ(reg.declare_histogram("c_total", "x", {1}).code(), StatusCode::kAlreadyExists);

  ASSERT_TRUE(reg.declare_histogram("h", "x", {1, 2}).is_ok());
  EXPECT_TRUE(reg.declare_histogram("h", "x", {1, 2}).is_ok());
  EXPECT_EQ(reg.declare_histogram("h", "x", {1, 3}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.declare_histogram("h", "x", {1}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.declare_counter("h", "x").code(), StatusCode::kAlreadyExists);

  // The built-in counter is not the caller's to declare.
  EXPECT_EQ(reg.declare_counter(kDropped, "x").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.declare_histogram(kDropped, "x", {}).code(), StatusCode::kAlreadyExists);

  // One series name from two families makes Prometheus refuse the whole
  // scrape: a histogram's _bucket/_sum/_count are its own, both ways round.
  for (const char* name : {"h_count", "h_sum", "h_bucket"}) {
    EXPECT_EQ(reg.declare_counter(name, "x").code(), StatusCode::kAlreadyExists) << name;
    EXPECT_EQ(reg.declare_gauge(name, "x").code(), StatusCode::kAlreadyExists) << name;
    EXPECT_EQ(reg.declare_histogram(name, "x", {1}).code(), StatusCode::kAlreadyExists) << name;
  }
  ASSERT_TRUE(reg.declare_gauge("g_sum", "x").is_ok());
  const Status later = reg.declare_histogram("g", "x", {1});
  EXPECT_EQ(later.code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(contains(later.message(), "\"g\" and \"g_sum\" would write the same series")) << later.message();
  EXPECT_TRUE(reg.declare_counter("h_total", "x").is_ok());  // not a histogram's series
  EXPECT_TRUE(reg.declare_counter("c_total_count", "x").is_ok());  // c_total is a counter

  // The first help text stays.
  const std::string text = reg.text();
  EXPECT_TRUE(contains(text, "# HELP c_total first\n")) << text;
  EXPECT_FALSE(contains(text, "second")) << text;
}

TEST(Metrics, BadUpdatesAreDroppedAndCounted) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_counter("c_total", "C.").is_ok());
  ASSERT_TRUE(reg.declare_histogram("h", "H.", {1}).is_ok());
  reg.add("unknown_total");                                        // 1: undeclared
  reg.observe("unknown", {}, 1.0);                                 // 2: undeclared
  reg.add("h");                                                    // 3: histogram
  reg.observe("c_total", {}, 1.0);                                 // 4: counter
  reg.observe("h", {}, std::nan(""));                              // 5: NaN
  reg.add("c_total", {{"1bad", "x"}});                             // 6: label name
  reg.add("c_total", {{"a-b", "x"}});                              // 7: label name
  reg.add("c_total", {{"", "x"}});                                 // 8: label name
  reg.observe("h", {{"le", "1"}}, 0.5);                            // 9: le is reserved
  reg.add(kDropped);                                               // 10: not declared
  reg.add("c_total", {{"__name__", "y"}});                         // 11: Prometheus's own
  reg.observe("h", {{"__x", "1"}}, 0.5);                           // 12: Prometheus's own
  reg.add("c_total", {{"le", "fine on a counter"}, {"_ok", "y"}});  // kept

  EXPECT_EQ(reg.counter(kDropped), 12u);
  EXPECT_EQ(reg.counter("c_total"), 0u);
  EXPECT_EQ(reg.counter("c_total", {{"le", "fine on a counter"}, {"_ok", "y"}}), 1u);
  EXPECT_EQ(reg.histogram_count("h"), 0u);
  const std::string text = reg.text();
  EXPECT_TRUE(contains(text, "\nbaton_metrics_dropped_total 12\n")) << text;
  EXPECT_FALSE(contains(text, "__")) << text;
  EXPECT_FALSE(contains(text, "unknown")) << text;
  EXPECT_FALSE(contains(text, "1bad")) << text;
  EXPECT_FALSE(contains(text, "h_bucket")) << text;
}

// The value on the line `prefix<value>\n` of a scrape, or -1.
long long value_after(const std::string& text, const std::string& prefix) {
  const auto at = text.find(prefix);
  if (at == std::string::npos) return -1;
  long long value = -1;
  const char* begin = text.data() + at + prefix.size();
  std::from_chars(begin, text.data() + text.size(), value);
  return value;
}

TEST(Metrics, ScrapeFromAnotherThreadWhileCounting) {
  MetricsRegistry reg;
  ASSERT_TRUE(reg.declare_counter("ops_total", "Ops.").is_ok());
  ASSERT_TRUE(reg.declare_histogram("op_seconds", "Op latency.", {0.5}).is_ok());
  constexpr int kUpdates = 20'000;

  std::atomic<bool> done{false};
  int scrapes = 0;
  bool monotone = true;
  bool complete = true;
  std::thread scraper([&] {
    long long last = 0;
    // Bounded by the updating thread; one last scrape after it finishes.
    for (bool last_round = false; !last_round;) {
      last_round = done.load(std::memory_order_acquire);
      const std::string text = reg.text();
      ++scrapes;
      complete = complete && contains(text, "\nbaton_metrics_dropped_total 0\n");
      const long long now = value_after(text, "\nops_total{lane=\"0\"} ");
      if (now != -1) {
        monotone = monotone && now >= last;
        last = now;
      }
    }
  });
  for (int i = 0; i < kUpdates; ++i) {
    reg.add("ops_total", {{"lane", std::to_string(i % 2)}});
    reg.observe("op_seconds", {}, (i % 4) * 0.25);
  }
  done.store(true, std::memory_order_release);
  scraper.join();

  EXPECT_GE(scrapes, 1);
  EXPECT_TRUE(monotone);
  EXPECT_TRUE(complete);
  EXPECT_EQ(reg.counter("ops_total", {{"lane", "0"}}), kUpdates / 2u);
  EXPECT_EQ(reg.counter("ops_total", {{"lane", "1"}}), kUpdates / 2u);
  EXPECT_EQ(reg.histogram_count("op_seconds"), static_cast<std::uint64_t>(kUpdates));
  EXPECT_EQ(reg.counter(kDropped), 0u);
  const std::string text = reg.text();
  // Values 0, 0.25, 0.5, 0.75 in turn: three quarters are <= 0.5.
  EXPECT_TRUE(contains(text, "op_seconds_bucket{le=\"0.5\"} 15000\n")) << text;
  EXPECT_TRUE(contains(text, "op_seconds_sum 7500\n")) << text;
  EXPECT_TRUE(contains(text, "ops_total{lane=\"0\"} 10000\n")) << text;
}

}  // namespace
}  // namespace baton::engine
