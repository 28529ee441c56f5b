// Test helper: the value of one series in Prometheus text (`name value`, or
// `name{labels} value` with the labels as written), or `absent`.
#pragma once

#include <string>

namespace baton::testing {

inline double metric_value(const std::string& text, const std::string& series, double absent = -1.0) {
  const auto at = text.find("\n" + series + " ");
  return at == std::string::npos ? absent : std::stod(text.substr(at + series.size() + 2));
}

}  // namespace baton::testing
