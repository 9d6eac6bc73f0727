// Errors are values: every public function that can fail on user input returns Status or
// Result<T>. Messages are one line a user can act on (which file, which tensor, which field).
#pragma once
#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace v4 {

/// Error categories; `kInvalidArgument` maps to HTTP 400, `kNotFound` to 404,
/// `kResourceExhausted` to 503/429 at the server.
enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kIoError,
  kCorruptData,
  kUnsupported,
  kResourceExhausted,
  kCancelled,
  kInternal,
};

/// Returns a stable lowercase name for `code` ("invalid_argument", ...).
const char* error_code_name(ErrorCode code);

/// Success or an error with a one-line message.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "invalid_argument: <message>" or "ok".
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

/// A value or an error Status (never both).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace v4

/// Propagate an error Status from an expression returning Status.
#define V4_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::v4::Status _st = (expr);            \
    if (!_st.ok()) return _st;            \
  } while (0)

#define V4_CONCAT_INNER(a, b) a##b
#define V4_CONCAT(a, b) V4_CONCAT_INNER(a, b)
/// `V4_ASSIGN_OR_RETURN(auto x, f());` — unwrap a Result or return its Status.
#define V4_ASSIGN_OR_RETURN(lhs, expr) V4_ASSIGN_OR_RETURN_IMPL(V4_CONCAT(_res_, __LINE__), lhs, expr)
#define V4_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
