#include "kvattn/core/error.h"

#include <limits>

#include "kvattn/core/checked_math.h"

namespace kvattn {

const char* error_kind_name(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "InvalidArgument";
    case ErrorKind::Unsupported: return "Unsupported";
    case ErrorKind::OutOfMemory: return "OutOfMemory";
    case ErrorKind::Internal: return "InternalError";
  }
  return "Error";
}

Error::Error(ErrorKind kind, const std::string& message)
    : std::runtime_error(std::string(error_kind_name(kind)) + ": " + message),
      kind_(kind),
      message_(message) {}

void throw_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::InvalidArgument: throw InvalidArgument(message);
    case ErrorKind::Unsupported: throw Unsupported(message);
    case ErrorKind::OutOfMemory: throw OutOfMemory(message);
    case ErrorKind::Internal: throw InternalError(message);
  }
  throw InternalError(message);
}

}  // namespace kvattn

namespace kvattn::detail {

void throw_overflow(std::string_view what, const char* op, int64_t a, int64_t b) {
  throw InvalidArgument(fmt::format("{}: {} {} {} overflows a 64-bit integer (max {}); the sizes are too "
                                    "large to represent — use smaller values",
                                    what, a, op, b, std::numeric_limits<int64_t>::max()));
}

void throw_narrowing(std::string_view what, const std::string& value, const std::string& lo, const std::string& hi) {
  throw InvalidArgument(fmt::format("{}: {} is outside the representable range [{}, {}]; use smaller values",
                                    what, value, lo, hi));
}

}  // namespace kvattn::detail
