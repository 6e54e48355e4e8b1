#include "kvattn/core/device.h"

#include <fmt/format.h>

#include <charconv>

#include "kvattn/core/error.h"

namespace kvattn {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Device Device::parse(std::string_view s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.starts_with("cuda:")) {
    int idx = -1;
    auto digits = s.substr(5);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), idx);
    if (ec == std::errc() && ptr == digits.data() + digits.size() && idx >= 0) return cuda(idx);
  }
  throw InvalidArgument(fmt::format("unknown device '{}'; valid devices: cpu, cuda, cuda:N", s));
}

}  // namespace kvattn
