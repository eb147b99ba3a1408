// Status and StatusOr: how every fallible runtime call reports errors (no
// exception crosses a runtime API).
#ifndef PTC_RUNTIME_BASE_STATUS_H
#define PTC_RUNTIME_BASE_STATUS_H

#include <cassert>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace ptc {

enum class StatusCode { kOk, kInvalidArgument, kNotFound, kDataLoss, kUnimplemented, kInternal };

class [[nodiscard]] Status {
public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }
  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string &message() const { return message_; }

private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

/// Builds a message from streamable parts: error(StatusCode::kNotFound, "no tensor '", n, "'").
template <typename... Parts> Status error(StatusCode code, const Parts &...parts) {
  std::ostringstream os;
  (os << ... << parts);
  return Status(code, os.str());
}
template <typename... Parts> Status invalidArgument(const Parts &...parts) {
  return error(StatusCode::kInvalidArgument, parts...);
}

template <typename T> class [[nodiscard]] StatusOr {
public:
  StatusOr(Status status) : status_(std::move(status)) { assert(!status_.isOk()); }
  StatusOr(T value) : value_(std::move(value)) {}
  bool isOk() const { return status_.isOk(); }
  const Status &status() const { return status_; }
  T &value() { return *value_; }
  const T &value() const { return *value_; }
  T &operator*() { return *value_; }
  T *operator->() { return &*value_; }

private:
  Status status_;
  std::optional<T> value_;
};

} // namespace ptc

#define PTC_RETURN_IF_ERROR(expr)                                                                  \
  do {                                                                                             \
    ::ptc::Status _ptc_status = (expr);                                                            \
    if (!_ptc_status.isOk())                                                                       \
      return _ptc_status;                                                                          \
  } while (0)

#endif // PTC_RUNTIME_BASE_STATUS_H
