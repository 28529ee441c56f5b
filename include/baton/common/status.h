// Status and Result: how every fallible Baton call reports what went wrong.
// No exceptions cross the public API; a Status carries a code and a message
// that names the call, the offending value and what was expected.
#pragma once

#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace baton {

enum class StatusCode : std::uint8_t {
  kOk,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kOutOfRange,
  kTimeout,
  kCancelled,
  kUnavailable,
  kDeadlineInfeasible,
  kResourceExhausted,
  kFailedPrecondition,  // the call does not fit the object's state (a region with transfers in flight)
  kPermissionDenied,  // the peer did not prove the deployment secret, or may not see that region
  kInternal,
};

// "ok", "invalid_argument", … — the snake_case name used in logs and JSON.
std::string_view to_string(StatusCode code);
// The code a to_string() name stands for (a Status that crossed a process
// boundary by name); nullopt for an unknown name.
std::optional<StatusCode> status_code_from_string(std::string_view name);
// Untrusted bytes (a file's, a peer's) for a message: printable ASCII as
// it is, anything else (and `"`, `\`) as \xNN, at most `most` of them with
// the full size after an ellipsis.
std::string shown(std::string_view bytes, std::size_t most = 80);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message)
      : code_(code),
        message_(message.empty() ? nullptr : std::make_shared<const std::string>(std::move(message))) {}

  static Status ok() { return {}; }

#define BATON_STATUS_FACTORY(name, code)                                   \
  template <typename... Args>                                              \
  static Status name(fmt::format_string<Args...> format, Args&&... args) { \
    return {StatusCode::code,                                              \
            fmt::format(format, std::forward<Args>(args)...)};             \
  }
  BATON_STATUS_FACTORY(invalid_argument, kInvalidArgument)
  BATON_STATUS_FACTORY(not_found, kNotFound)
  BATON_STATUS_FACTORY(already_exists, kAlreadyExists)
  BATON_STATUS_FACTORY(out_of_range, kOutOfRange)
  BATON_STATUS_FACTORY(timeout, kTimeout)
  BATON_STATUS_FACTORY(cancelled, kCancelled)
  BATON_STATUS_FACTORY(unavailable, kUnavailable)
  BATON_STATUS_FACTORY(deadline_infeasible, kDeadlineInfeasible)
  BATON_STATUS_FACTORY(resource_exhausted, kResourceExhausted)
  BATON_STATUS_FACTORY(failed_precondition, kFailedPrecondition)
  BATON_STATUS_FACTORY(permission_denied, kPermissionDenied)
  BATON_STATUS_FACTORY(internal, kInternal)
#undef BATON_STATUS_FACTORY

  [[nodiscard]] bool is_ok() const { return code_ == StatusCode::kOk; }
  [[nodiscard]] StatusCode code() const { return code_; }
  [[nodiscard]] const std::string& message() const { return message_ ? *message_ : kNoMessage; }
  // "invalid_argument: parse_size: …", or "ok".
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message() == b.message();
  }

 private:
  static inline const std::string kNoMessage;
  StatusCode code_ = StatusCode::kOk;
  // Shared and immutable: an ok Status (no message) copies, compares and
  // destroys as a null pointer, and a failure copied to every request of a
  // batch shares one string. Hot paths fill a status per request.
  std::shared_ptr<const std::string> message_;
};

template <typename T>
using Result = std::expected<T, Status>;

}  // namespace baton
