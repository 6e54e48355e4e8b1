#include "kvattn/core/error.h"

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
