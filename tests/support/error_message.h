// tests/support/error_message.h — the message a user would read: what() of the kvattn::Error
// a call throws, for tests that check an error names the bad value, the valid choices and a hint.
#pragma once

#include <functional>
#include <string>

#include "kvattn/core/error.h"

namespace kvattn::test {

// The message of the kvattn::Error `fn` throws, or "<no error>" when it returns normally (any
// other exception propagates and fails the test).
inline std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace kvattn::test
