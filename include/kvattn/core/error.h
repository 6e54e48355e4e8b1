// kvattn/core/error.h — typed errors and a small Result<T>.
//
// Every error message says what was wrong (the bad value), what would have been valid
// (the choices), and what to change (a hint).  Callers that branch on "does not fit" use
// Result<T> (a value, not an exception).
#pragma once

#include <fmt/format.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace kvattn {

enum class ErrorKind { InvalidArgument, Unsupported, OutOfMemory, Internal };

const char* error_kind_name(ErrorKind kind) noexcept;

// Base of every kvattn exception.  what() is "<Kind>: <message>".
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message);
  ErrorKind kind() const noexcept { return kind_; }
  // The message without the "<Kind>: " prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

// A caller passed a value outside the valid domain (shape, dtype, range, name).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& m) : Error(ErrorKind::InvalidArgument, m) {}
};

// A valid request that kvattn (or this build / device) does not implement.
class Unsupported : public Error {
 public:
  explicit Unsupported(const std::string& m) : Error(ErrorKind::Unsupported, m) {}
};

// An allocation could not be satisfied.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& m) : Error(ErrorKind::OutOfMemory, m) {}
};

// A broken internal invariant: a kvattn bug, never the caller's fault.
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& m) : Error(ErrorKind::Internal, m) {}
};

[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

// KVATTN_CHECK(cond, fmt, args...) throws InvalidArgument with a formatted message.
#define KVATTN_CHECK(cond, ...)                                                  \
  do {                                                                           \
    if (!(cond)) [[unlikely]]                                                    \
      ::kvattn::throw_error(::kvattn::ErrorKind::InvalidArgument,                \
                            ::fmt::format(__VA_ARGS__));                         \
  } while (0)

// KVATTN_ASSERT(cond, ...) throws InternalError: for invariants, not user input.
#define KVATTN_ASSERT(cond, ...)                                                 \
  do {                                                                           \
    if (!(cond)) [[unlikely]]                                                    \
      ::kvattn::throw_error(::kvattn::ErrorKind::Internal,                       \
                            ::fmt::format("{}:{}: {}", __FILE__, __LINE__,       \
                                          ::fmt::format(__VA_ARGS__)));          \
  } while (0)

// A failure carried as a value.
struct Failure {
  ErrorKind kind = ErrorKind::InvalidArgument;
  std::string message;
};

// Result<T>: either a T or a Failure.  value() rethrows the failure as the typed exception.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Failure f) : v_(std::move(f)) {}    // NOLINT(google-explicit-constructor)

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & {
    if (!ok()) throw_error(failure().kind, failure().message);
    return std::get<0>(v_);
  }
  const T& value() const& {
    if (!ok()) throw_error(failure().kind, failure().message);
    return std::get<0>(v_);
  }
  T&& value() && {
    if (!ok()) throw_error(failure().kind, failure().message);
    return std::get<0>(std::move(v_));
  }
  const Failure& failure() const { return std::get<1>(v_); }

 private:
  std::variant<T, Failure> v_;
};

}  // namespace kvattn
